"""The audit timeline through the API: each event's reason and the generation it made,
filters by kind and by person, the CSV export (escaped against formula injection) and
the 400s that name the bad parameter."""

from __future__ import annotations

import csv
import io

import pytest

from registry.actions import releases
from registry.domain import audit_log
from registry.domain.audit_log import CSV_HEADER, csv_cell
from registry.models import AuditEvent

pytestmark = pytest.mark.django_db

AUDIT = "/api/models/digits/audit/"
RELEASE = "/api/models/digits/release/"


def split(client, weight: int, reason: str):
    response = client.post(RELEASE, {"routes": [{"version": 1, "weight": 100 - weight}, {"version": 2, "weight": weight}], "reason": reason}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["release"]["generation"]


def csv_rows(response) -> list[list[str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(body)))


def test_a_release_event_carries_its_reason_and_the_generation_it_made(operator_client, three_versions):
    generation = split(operator_client, 10, "try v2 on a tenth")

    newest = operator_client.get(AUDIT).json()[0]

    assert (newest["kind"], newest["reason"], newest["generation"], newest["actor"]) == ("release", "try v2 on a tenth", generation, "olivia")


def test_an_upload_event_has_no_reason_and_no_generation(operator_client, three_versions):
    upload = operator_client.get(AUDIT, {"kind": "version_uploaded"}).json()[0]

    assert (upload["reason"], upload["generation"]) == ("", None)


def test_kind_filter_keeps_only_that_kind(operator_client, three_versions):
    split(operator_client, 10, "canary")

    kinds = [event["kind"] for event in operator_client.get(AUDIT, {"kind": "release"}).json()]

    assert kinds == ["release", "release"]  # the canary and the initial release


def test_actor_filter_keeps_only_that_persons_events(operator_client, admin_user, three_versions):
    releases.set_routes(three_versions, [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}], admin_user, "ada's change")
    split(operator_client, 10, "olivia's change")

    by_ada = operator_client.get(AUDIT, {"actor": "ada"}).json()

    assert [(event["actor"], event["reason"]) for event in by_ada] == [("ada", "ada's change")]


def test_kind_and_actor_filters_combine(operator_client, admin_user, three_versions):
    releases.set_routes(three_versions, [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}], admin_user, "ada's change")

    assert operator_client.get(AUDIT, {"kind": "version_uploaded", "actor": "ada"}).json() == []
    assert len(operator_client.get(AUDIT, {"kind": "version_uploaded", "actor": "olivia"}).json()) == 3


@pytest.mark.parametrize(("query", "parameter"), [({"kind": "nonsense"}, "kind"), ({"actor": "nobody-of-that-name"}, "actor")])
def test_a_bad_filter_value_is_a_400_naming_the_parameter(operator_client, three_versions, query, parameter):
    response = operator_client.get(AUDIT, query)

    assert response.status_code == 400
    assert response.json()["parameter"] == parameter
    assert response.json()["error"].startswith(f"{parameter}: ")


def test_a_bad_filter_on_a_csv_request_is_still_a_json_400(operator_client, three_versions):
    response = operator_client.get(AUDIT, {"kind": "nonsense", "format": "csv"})

    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json()["parameter"] == "kind"


def test_the_refused_value_is_echoed_only_as_a_short_prefix(operator_client, three_versions):
    response = operator_client.get(AUDIT, {"kind": "x" * 5000})

    assert len(response.json()["error"]) < 300


def test_csv_export_has_a_header_and_one_row_per_event(operator_client, three_versions):
    generation = split(operator_client, 10, "canary for the export")

    response = operator_client.get(AUDIT, {"format": "csv"})

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == 'attachment; filename="digits-audit.csv"'
    rows = csv_rows(response)
    assert rows[0] == CSV_HEADER
    assert len(rows) == 1 + len(operator_client.get(AUDIT).json())
    _time, kind, actor, made, rollout, reason, message = rows[1]
    assert (kind, actor, made, rollout, reason) == ("release", "olivia", str(generation), "", "canary for the export")
    assert message.startswith("Traffic")


def test_csv_export_follows_the_filters(operator_client, three_versions):
    split(operator_client, 10, "canary")

    rows = csv_rows(operator_client.get(AUDIT, {"format": "csv", "kind": "version_uploaded"}))

    assert {row[1] for row in rows[1:]} == {"version_uploaded"}
    assert len(rows) == 1 + 3


def test_csv_export_is_also_chosen_by_the_accept_header(operator_client, three_versions):
    response = operator_client.get(AUDIT, HTTP_ACCEPT="text/csv")

    assert csv_rows(response)[0] == CSV_HEADER


@pytest.mark.parametrize("typed", ["=HYPERLINK(\"http://evil\")", "+1+1", "-2+3", "@SUM(A1)"])
def test_csv_export_defuses_a_reason_that_a_spreadsheet_would_run(operator_client, three_versions, typed):
    split(operator_client, 10, typed)

    reason = csv_rows(operator_client.get(AUDIT, {"format": "csv", "kind": "release"}))[1][CSV_HEADER.index("reason")]

    assert reason == "'" + typed


@pytest.mark.parametrize(("value", "cell"), [("\t=1", "'\t=1"), ("\r=1", "'\r=1"), ("\n=1", "'\n=1"), ("\uff1d1+1", "'\uff1d1+1"),
                                             (" =1+1", "' =1+1"), ("\u00a0\u3000@SUM(A1)", "'\u00a0\u3000@SUM(A1)"), (" ok", " ok"),
                                             ("a=1", "a=1"), (-3, "-3"), (None, "")])
def test_csv_cell_prefixes_text_that_starts_a_formula_and_nothing_else(value, cell):
    assert csv_cell(value) == cell


@pytest.mark.parametrize(("value", "cell"), [("\x1b[2Jcleared", "U+001B[2Jcleared"), ("bell\x07", "bellU+0007"),
                                             ("\u202eevil", "U+202Eevil"), ("\x9bcsi", "U+009Bcsi"), ("tab\tand\nline", "tab\tand\nline")])
def test_csv_cell_writes_terminal_controls_as_their_code_points(value, cell):
    """A reason with ESC sequences cleared or recoloured the terminal of whoever ran
    `cat audit.csv`; a right-to-left override reordered what followed."""
    assert csv_cell(value) == cell


def test_csv_export_keeps_commas_quotes_and_newlines_in_one_cell(operator_client, three_versions):
    typed = 'ship it, "carefully"\nsecond line'
    split(operator_client, 10, 'ship it, "carefully"')
    # Typed before reasons were held to one line, an event may hold a newline.
    event = AuditEvent.objects.filter(kind="release").latest("pk")
    event.data = {**event.data, "reason": typed}
    event.save()

    rows = csv_rows(operator_client.get(AUDIT, {"format": "csv", "kind": "release"}))

    assert rows[1][CSV_HEADER.index("reason")] == typed
    assert len(rows) == 1 + 2


def test_a_viewer_may_read_and_export_the_timeline(viewer_client, three_versions):
    assert viewer_client.get(AUDIT).status_code == 200
    assert viewer_client.get(AUDIT, {"format": "csv"}).status_code == 200


@pytest.mark.parametrize("as_csv", [False, True])
def test_an_actor_with_a_nul_character_is_a_400_naming_the_filter(viewer_client, three_versions, as_csv):
    # PostgreSQL refuses NUL in a text parameter: the user lookup was a 500 there.
    response = viewer_client.get(AUDIT, {"actor": "a\x00b", **({"format": "csv"} if as_csv else {})})

    assert response.status_code == 400
    assert response.json()["error"] == "actor: must not contain NUL (\\u0000) characters"


def test_an_unknown_model_is_a_404_even_as_csv(operator_client, three_versions):
    response = operator_client.get("/api/models/no-such-model/audit/", {"format": "csv"})

    assert response.status_code == 404
    assert "error" in response.json()


SEMICOLON_FORMULAS = "ok;=1+1;-2+3;@SUM(A1:A2)"


def csv_body(response) -> str:
    return b"".join(response.streaming_content).decode()


def test_csv_export_quotes_every_cell_so_a_semicolon_spreadsheet_keeps_a_reason_whole(operator_client, three_versions):
    # Written bare, a spreadsheet whose list separator is ";" split the reason into cells
    # starting with =, - and @, and ran them: only the cell's first character was checked.
    split(operator_client, 10, SEMICOLON_FORMULAS)

    body = csv_body(operator_client.get(AUDIT, {"format": "csv", "kind": "release"}))

    lines = body.splitlines()
    rows = list(csv.reader(io.StringIO(body)))
    assert len(lines) == len(rows) == 1 + 2
    for line, row in zip(lines, rows, strict=True):
        assert line == ",".join('"' + cell.replace('"', '""') + '"' for cell in row)
    assert rows[1][CSV_HEADER.index("reason")] == SEMICOLON_FORMULAS  # as typed, inside its quotes


def add_events(model, count: int, kind: str = "release", label: str = "event") -> list[str]:
    made = AuditEvent.objects.bulk_create(AuditEvent(model=model, kind=kind, message=f"{label} {n}") for n in range(count))
    return [event.message for event in made]


def test_a_csv_longer_than_a_page_has_every_event_once_newest_first(operator_client, three_versions, monkeypatch):
    monkeypatch.setattr(audit_log, "CSV_PAGE_ROWS", 7)  # read a page at a time: 21 events are three pages
    add_events(three_versions, 21 - three_versions.audit_events.filter(kind="release").count())

    rows = csv_rows(operator_client.get(AUDIT, {"format": "csv", "kind": "release"}))

    expected = list(three_versions.audit_events.filter(kind="release").order_by("-id").values_list("message", flat=True))
    assert len(expected) == 21
    assert [row[CSV_HEADER.index("message")] for row in rows[1:]] == expected


def test_events_written_while_a_csv_is_sent_are_left_out_of_it(operator_client, three_versions, monkeypatch):
    monkeypatch.setattr(audit_log, "CSV_PAGE_ROWS", 5)
    add_events(three_versions, 12)
    before = list(three_versions.audit_events.order_by("-id").values_list("message", flat=True))

    response = operator_client.get(AUDIT, {"format": "csv"})
    parts = iter(response.streaming_content)
    first = [next(parts) for _ in range(3)]  # the header and two events: the first page was read
    added = set(add_events(three_versions, 8, kind="version_uploaded", label="written meanwhile"))
    body = b"".join([*first, *parts]).decode()

    messages = [row[CSV_HEADER.index("message")] for row in list(csv.reader(io.StringIO(body)))[1:]]
    assert messages == before  # the timeline as it stood: none of the 8 new ones, none twice
    assert not added & set(messages)
