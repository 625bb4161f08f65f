"""The model page's audit timeline: the reason typed with each action, a link to the
release it made, filters by kind and by person, and a CSV link that keeps the filters."""

from __future__ import annotations

import pytest

from registry.actions import releases

pytestmark = pytest.mark.django_db

CANARY = [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}]


def audit_panel(client, query: str = "") -> str:
    return client.get(f"/models/digits/{query}").content.decode()


def test_a_release_entry_shows_its_reason_and_links_the_generation_it_made(viewer_page, digits, admin_user):
    made = releases.set_routes(digits, CANARY, admin_user, "try v2 on a fifth")

    html = viewer_page.get("/models/digits/?fragment=audit").content.decode()

    assert f'<a class="event-release" href="/models/digits/releases/{made.generation}/">made generation {made.generation}</a>' in html
    assert "Reason: “try v2 on a fifth”" in html


def test_filter_by_kind_and_person_narrows_the_timeline(viewer_page, digits, admin_user):
    releases.set_routes(digits, CANARY, admin_user, "canary by ada")

    html = audit_panel(viewer_page, "?kind=release&actor=ada")

    assert "canary by ada" in html
    assert html.count('class="event kind-') == 1
    assert '<option value="release" selected>' in html and '<option value="ada" selected>' in html


def test_the_person_filter_offers_everyone_in_the_timeline(viewer_page, digits, admin_user):
    releases.set_routes(digits, CANARY, admin_user, "")

    html = audit_panel(viewer_page)

    assert '<option value="ada">ada</option>' in html and '<option value="olivia">olivia</option>' in html
    assert '<label for="audit-kind">Kind</label>' in html and '<label for="audit-actor">Person</label>' in html


def test_the_person_filter_names_each_person_once_however_many_their_events(viewer_page, digits, admin_user):
    for _ in range(3):
        releases.set_routes(digits, CANARY, admin_user, "")
        releases.set_routes(digits, [{"version": 1, "weight": 100}], admin_user, "")

    html = audit_panel(viewer_page)

    assert html.count('<option value="ada">ada</option>') == 1


def test_the_csv_link_carries_the_filters(viewer_page, digits):
    html = audit_panel(viewer_page, "?kind=release")

    assert 'href="/api/models/digits/audit/?kind=release&amp;format=csv"' in html


def test_a_fragment_refresh_keeps_the_filter(viewer_page, digits, admin_user):
    releases.set_routes(digits, CANARY, admin_user, "canary by ada")

    html = viewer_page.get("/models/digits/?kind=version_uploaded&fragment=audit").content.decode()

    assert "canary by ada" not in html and "kind-version_uploaded" not in html  # the fixture's versions have no upload events
    assert "No event matches this filter." in html


@pytest.mark.parametrize(("query", "words"), [("?kind=nonsense", "kind: no audit kind"), ("?actor=nobody", "actor: no user named"),
                                              ("?actor=a%00b", "actor: must not contain NUL")])
def test_a_bad_filter_is_a_400_that_names_it_and_shows_everything(viewer_page, digits, query, words):
    response = viewer_page.get(f"/models/digits/{query}")

    assert response.status_code == 400
    assert f"Filter not applied: {words}" in response.content.decode()
    assert 'class="event kind-release"' in response.content.decode()
