"""The lists that grow for as long as the console runs answer a page at a time: the body
is the same JSON array as before, `Link: <…>; rel="next"` leads to the rest, and a bad
`limit` or `cursor` is a 400 that names it (never a 404, a silent default or a 500)."""

from __future__ import annotations

import base64
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from registry.actions import releases
from registry.api.pagination import LIST_MAX_PAGE_SIZE, LIST_PAGE_SIZE
from registry.domain.choices import AuditKind, JobKind
from registry.models import AuditEvent, Drill, EvaluationDataset, Job, RegisteredModel, Rollout, VersionMetricMinute

pytestmark = pytest.mark.django_db

AUDIT = "/api/models/digits/audit/"
NEXT = re.compile(r'<([^>]+)>; rel="next"')


def add_events(model, count: int) -> list[str]:
    """``count`` more audit events; the messages of all the model's events, newest first."""
    start = AuditEvent.objects.count()
    AuditEvent.objects.bulk_create(AuditEvent(model=model, kind=AuditKind.RELEASE, message=f"event {start + index}") for index in range(count))
    return list(AuditEvent.objects.filter(model=model).values_list("message", flat=True))


def next_link(response) -> str | None:
    found = NEXT.search(response.get("Link", ""))
    return found[1] if found else None


def read_all(client, url: str, **params) -> tuple[list[dict], int]:
    """Every item, following ``next``; and how many pages that took (at most 50: a list
    whose ``next`` never ends fails here rather than hangs)."""
    items, pages, response = [], 0, client.get(url, params)
    while True:
        assert response.status_code == 200, response.content
        assert pages < 50, f"still a next page after {pages} pages"
        items += response.json()
        pages += 1
        link = next_link(response)
        if link is None:
            return items, pages
        response = client.get(link)


def cursor_of(query: str) -> str:
    return base64.b64encode(query.encode()).decode()


def test_a_long_audit_answers_one_page_and_a_link_to_the_next(operator_client, three_versions):
    newest_first = add_events(three_versions, LIST_PAGE_SIZE + 50)

    response = operator_client.get(AUDIT)

    assert [event["message"] for event in response.json()] == newest_first[:LIST_PAGE_SIZE]
    assert next_link(response).startswith(AUDIT + "?cursor=")


def test_following_next_reads_every_event_once_newest_first(operator_client, three_versions):
    newest_first = add_events(three_versions, 250)

    items, pages = read_all(operator_client, AUDIT, limit=60)

    assert [event["message"] for event in items] == newest_first
    assert pages == 5


def test_events_that_share_one_instant_are_each_read_once(operator_client, three_versions):
    newest_first = add_events(three_versions, 250)
    AuditEvent.objects.filter(model=three_versions).update(created_at=timezone.now())

    items, _ = read_all(operator_client, AUDIT, limit=40)

    assert sorted(event["message"] for event in items) == sorted(newest_first)
    assert len(items) == len(newest_first)


def test_more_events_at_one_instant_than_a_cursor_can_skip_are_each_read_once_and_the_pages_end(operator_client, three_versions):
    newest_first = add_events(three_versions, 1200)
    AuditEvent.objects.filter(model=three_versions).update(created_at=timezone.now())

    items, pages = read_all(operator_client, AUDIT, limit=100)  # DRF's offset stops at 1,000: this looped for ever

    assert [event["message"] for event in items] == newest_first
    assert pages == 13


def test_prev_reads_back_every_event_of_a_tie(operator_client, three_versions):
    newest_first = add_events(three_versions, 95)
    AuditEvent.objects.filter(model=three_versions).update(created_at=timezone.now())
    response = operator_client.get(AUDIT, {"limit": 10})
    while next_link(response):
        response = operator_client.get(next_link(response))

    backwards = response.json()
    while prev := re.search(r'<([^>]+)>; rel="prev"', response.get("Link", "")):
        response = operator_client.get(prev[1])
        backwards = response.json() + backwards

    assert [event["message"] for event in backwards] == newest_first


def test_events_added_while_paging_neither_repeat_nor_skip_a_row(operator_client, three_versions):
    before = add_events(three_versions, 150)
    first = operator_client.get(AUDIT, {"limit": 100})
    add_events(three_versions, 30)

    rest, _ = read_all(operator_client, next_link(first))

    assert [event["message"] for event in first.json() + rest] == before


def test_the_filters_stay_on_every_page(operator_client, admin_user, three_versions):
    for weight in (10, 20, 30):
        releases.set_routes(three_versions, [{"version": 1, "weight": 100 - weight}, {"version": 2, "weight": weight}], admin_user, f"{weight}%")
    add_events(three_versions, 20)  # release events by nobody: the actor filter leaves them out

    items, pages = read_all(operator_client, AUDIT, actor="ada", kind="release", limit=1)

    assert [event["reason"] for event in items] == ["30%", "20%", "10%"]
    assert pages == 3


def test_the_csv_export_is_every_event_not_a_page(operator_client, three_versions):
    add_events(three_versions, LIST_PAGE_SIZE + 20)
    total = AuditEvent.objects.filter(model=three_versions).count()

    response = operator_client.get(AUDIT, {"format": "csv"})

    assert b"".join(response.streaming_content).decode().count("\n") == total + 1  # and the header


@pytest.mark.parametrize("parameter", ["limit", "cursor"])
def test_the_csv_export_refuses_a_pages_parameter_it_would_ignore(operator_client, three_versions, parameter):
    response = operator_client.get(AUDIT, {"format": "csv", parameter: "5"})

    assert response.status_code == 400
    assert list(response.json()["fields"]) == [parameter]


def test_a_last_page_has_no_next_link(operator_client, three_versions):
    add_events(three_versions, 3)

    response = operator_client.get(AUDIT, {"limit": LIST_MAX_PAGE_SIZE})

    assert "next" not in response.get("Link", "")


def test_the_link_is_relative_so_a_forged_host_cannot_steer_it(operator_client, three_versions, settings):
    settings.ALLOWED_HOSTS = ["*"]
    add_events(three_versions, 5)

    response = operator_client.get(AUDIT, {"limit": 2}, HTTP_HOST="attacker.example")

    assert "attacker.example" not in response["Link"]
    assert next_link(response).startswith("/api/")


@pytest.mark.parametrize("limit", ["0", "-1", str(LIST_MAX_PAGE_SIZE + 1), "ten", "1e3", "2.5", "\u0663", "", "9" * 5000])
def test_a_limit_that_is_not_a_page_size_is_a_400_naming_limit(operator_client, three_versions, limit):
    response = operator_client.get(AUDIT, {"limit": limit})

    assert response.status_code == 400
    assert response.json()["fields"] == {"limit": [f"must be a whole number from 1 to {LIST_MAX_PAGE_SIZE}"]}


@pytest.mark.parametrize("cursor", [
    "not base64!", cursor_of("o=-1"), cursor_of("o=x"), cursor_of("r=x"), "%%%", "\u00e9t\u00e9",
    cursor_of("p=yesterday"), cursor_of("p=2026-13-45 99:00:00"), cursor_of("p=\x00"),
])
def test_a_cursor_the_list_did_not_give_out_is_a_400_naming_cursor(operator_client, three_versions, cursor):
    response = operator_client.get(AUDIT, {"cursor": cursor})

    assert response.status_code == 400, response.content
    assert list(response.json()["fields"]) == ["cursor"]


@pytest.mark.parametrize("position", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_cursor_at_the_calendars_edge_is_a_page_or_a_400_never_a_500(operator_client, operator, three_versions, position):
    _two_of_each(three_versions, operator)  # the metric minutes are ordered by time

    response = operator_client.get("/api/models/digits/versions/1/metrics/", {"cursor": cursor_of(f"p={position}")})

    # SQLite cannot hold the time in UTC (its conversion overflowed: a 500); PostgreSQL can.
    assert response.status_code in (200, 400), response.content
    assert response.status_code == 200 or list(response.json()["fields"]) == ["cursor"]


@pytest.mark.parametrize("position", ["yesterday", "2026-13-45 99:00:00", "\x00"])
def test_a_cursor_whose_time_is_no_time_is_a_400(operator_client, operator, three_versions, position):
    _two_of_each(three_versions, operator)

    response = operator_client.get("/api/models/digits/versions/1/metrics/", {"cursor": cursor_of(f"p={position}")})

    assert response.status_code == 400, response.content
    assert list(response.json()["fields"]) == ["cursor"]


def test_a_name_the_api_would_refuse_still_pages(operator_client, db):
    for name in ("Has Space", "zeta"):
        RegisteredModel.objects.create(name=name)  # made outside the API (a shell, a data migration)

    items, _ = read_all(operator_client, "/api/models/", limit=1)

    assert [model["name"] for model in items] == ["Has Space", "zeta"]


@pytest.mark.parametrize("position", ["abc", "1.5", "99999999999999999999999999", "-3", "\x00"])
def test_a_cursor_whose_position_is_not_a_generation_is_a_400_not_a_database_error(operator_client, three_versions, position):
    response = operator_client.get("/api/models/digits/releases/", {"cursor": cursor_of(f"p={position}")})

    assert response.status_code == 400, response.content
    assert list(response.json()["fields"]) == ["cursor"]


def _two_of_each(model, operator) -> None:
    """Two rows of every list that pages (the model has three versions and one release)."""
    releases.set_routes(model, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], operator, "second release")
    now = timezone.now()
    for index in range(2):
        Drill.objects.create(model=model, status="passed", started_at=now - timedelta(minutes=index), target_s=5.0)
        Rollout.objects.create(model=model, canary_version=2, stable_version=1, steps=[10, 100], step_duration_s=60, analysis={},
                               status="aborted", step_started_at=now, next_window_at=now)
        Job.objects.create(kind=JobKind.BATCH, model=model, version=model.versions.get(number=1))
        VersionMetricMinute.objects.create(version=model.versions.get(number=1), minute=now.replace(second=0, microsecond=0) - timedelta(minutes=index))
    add_events(model, 2)
    RegisteredModel.objects.create(name="second")
    for name in ("first", "second"):
        EvaluationDataset.objects.create(model=model, name=name, task="classification", file_format="npz", sha256="0" * 64, size_bytes=1, rows=1)


@pytest.mark.parametrize("url", [
    "/api/models/digits/releases/", "/api/models/digits/drills/", "/api/drills/", "/api/models/digits/rollouts/",
    "/api/models/digits/versions/", "/api/models/digits/jobs/", "/api/models/digits/versions/1/metrics/", AUDIT,
    "/api/models/", "/api/models/digits/datasets/",
])
def test_every_growing_list_pages_in_the_same_way(operator_client, operator, three_versions, url):
    _two_of_each(three_versions, operator)
    everything = operator_client.get(url, {"limit": LIST_MAX_PAGE_SIZE}).json()

    first = operator_client.get(url, {"limit": 1})
    second = operator_client.get(next_link(first))

    assert first.json() + second.json() == everything[:2]
    assert operator_client.get(url, {"limit": 0}).status_code == 400


def test_prev_leads_back_to_the_page_before(operator_client, three_versions):
    add_events(three_versions, 30)
    first = operator_client.get(AUDIT, {"limit": 10})
    second = operator_client.get(next_link(first))

    back = operator_client.get(re.search(r'<([^>]+)>; rel="prev"', second["Link"])[1])

    assert back.json() == first.json()


@pytest.mark.parametrize("query", [{"limt": "5"}, {"actr": "ada"}, {"actr": "ada", "format": "csv"}])
def test_a_misspelt_query_parameter_is_a_400_naming_it_not_the_whole_list(operator_client, three_versions, query):
    misspelt = next(name for name in query if name != "format")

    response = operator_client.get(AUDIT, query)

    assert response.status_code == 400
    assert list(response.json()["fields"]) == [misspelt]
    assert "(it takes: kind, actor, format" in response.json()["error"]


def test_a_list_without_filters_takes_only_a_pages_parameters(operator_client, three_versions):
    response = operator_client.get("/api/models/digits/releases/", {"stable_version": 2})

    assert response.status_code == 400
    assert response.json()["error"] == "stable_version: this list does not take this query parameter (it takes: limit, cursor, format)"
