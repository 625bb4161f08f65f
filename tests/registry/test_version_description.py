"""A version's description is changed after its upload (an upload starts when its file is
chosen, so a description typed after that went with nothing): PATCH on the API, a form on
the version's page; operators only, audited, and checked as an upload's description is."""

from __future__ import annotations

import pytest

from registry.domain.choices import AuditKind
from registry.models import AuditEvent, ModelVersion
from tests.console.conftest import signed_in

pytestmark = pytest.mark.django_db

VERSION = "/api/models/digits/versions/2/"
PAGE = "/models/digits/versions/2/"


def description() -> str:
    return ModelVersion.objects.get(model__name="digits", number=2).description


def changes() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind=AuditKind.VERSION_CHANGED))


def test_an_operator_sets_a_versions_description_and_the_timeline_says_who_and_what(operator_client, three_versions):
    response = operator_client.patch(VERSION, {"description": "retrained on March data"}, format="json")

    assert response.status_code == 200
    assert response.json()["description"] == "retrained on March data" and response.json()["number"] == 2
    assert description() == "retrained on March data"
    [event] = changes()
    assert event.actor.username == "olivia" and event.data == {"version": 2, "changed": {"description": "retrained on March data"}}
    assert event.message == "Version 2 of digits changed: description retrained on March data"


def test_the_same_description_again_changes_nothing_and_records_nothing(operator_client, three_versions):
    operator_client.patch(VERSION, {"description": "same"}, format="json")

    response = operator_client.patch(VERSION, {"description": "same"}, format="json")

    assert response.status_code == 200 and len(changes()) == 1


def test_a_viewer_may_not_change_a_description(viewer_client, three_versions):
    before = description()

    response = viewer_client.patch(VERSION, {"description": "mine"}, format="json")

    assert response.status_code == 403
    assert description() == before and changes() == []


def test_the_worker_token_may_not_change_a_description(worker_client, three_versions):
    # It opens the serving routes and artifacts, nothing else.
    before = description()

    response = worker_client.patch(VERSION, {"description": "mine"}, format="json")

    assert response.status_code in (401, 403)
    assert description() == before and changes() == []


@pytest.mark.parametrize(("body", "error"), [
    ({"description": "x" * 2001}, "description: Ensure this field has no more than 2000 characters."),
    ({"description": "\u202egnp.exe"}, "description: must not hold "),
    ({"description": 7}, "description: Not a valid string."),
    ({"status": "ready"}, "status"),
    ({"sha256": "0" * 64}, "sha256"),
])
def test_a_bad_change_is_a_400_naming_it_and_changes_nothing(operator_client, three_versions, body, error):
    before = description()

    response = operator_client.patch(VERSION, body, format="json")

    assert response.status_code == 400 and response.json()["error"].startswith(error)
    assert description() == before and changes() == []


def test_an_unknown_version_is_a_404(operator_client, three_versions):
    assert operator_client.patch("/api/models/digits/versions/99/", {"description": "x"}, format="json").status_code == 404


def test_an_operator_sets_it_on_the_version_page(operator, three_versions):
    page = signed_in(operator)

    response = page.post(f"{PAGE}details/", {"description": "typed after the upload"})

    assert response.status_code == 302 and response["Location"] == PAGE
    assert description() == "typed after the upload"
    shown = page.get(PAGE).content.decode()
    assert "typed after the upload" in shown and "Description of digits v2 saved." in shown


def test_a_description_past_the_limit_on_the_version_page_is_named_and_changes_nothing(operator, three_versions):
    before = description()

    response = signed_in(operator).post(f"{PAGE}details/", {"description": "x" * 2001})

    assert response.status_code == 400
    assert "at most 2000 characters (it has 2001)" in response.content.decode()
    assert description() == before and changes() == []


def test_the_version_page_offers_the_form_to_operators_only_and_refuses_a_viewers_post(operator, viewer, three_versions):
    assert 'id="version-details-form"' in signed_in(operator).get(PAGE).content.decode()
    assert 'id="version-details-form"' not in signed_in(viewer).get(PAGE).content.decode()

    assert signed_in(viewer).post(f"{PAGE}details/", {"description": "mine"}).status_code == 403
    assert changes() == []
