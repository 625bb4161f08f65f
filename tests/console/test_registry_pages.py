"""The model catalogue in the console: creating a model from the Models page, its tags
and owner, search / filter / sort through the query string, archive and restore."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.messages import get_messages

from registry.actions import catalog
from registry.building.onnx_build import random_mlp, to_bytes
from registry.models import AuditEvent, RegisteredModel
from tests.console.conftest import add_version, report_from

pytestmark = pytest.mark.django_db


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def listed(response) -> list[str]:
    assert response.status_code == 200
    return re.findall(r'<tr data-model="([^"]+)"', response.content.decode())


# ---------------------------------------------------------------- create


def test_operator_creates_a_model_from_the_form_and_lands_on_its_page(operator_page, viewer):
    response = operator_page.post("/models/", {"name": "fraud", "description": "cards", "tags": "Risk, cards", "owner": "victor"})

    assert response.status_code == 302 and response["Location"] == "/models/fraud/"
    assert messages_of(response) == ["Model fraud registered. Upload its first version below."]
    model = RegisteredModel.objects.get(name="fraud")
    assert (model.description, model.tags, model.owner.username, model.created_by.username) == ("cards", ["risk", "cards"], "victor", "olivia")
    assert AuditEvent.objects.filter(model=model, kind="model_created").count() == 1


def test_a_duplicate_name_is_shown_on_the_form_and_creates_nothing(operator_page, digits):
    response = operator_page.post("/models/", {"name": "digits", "owner": "olivia"})

    assert response.status_code == 400
    assert "a model named &#x27;digits&#x27; already exists" in response.content.decode()
    assert RegisteredModel.objects.count() == 1


def test_a_name_differing_from_a_model_s_only_by_case_is_shown_on_the_form_and_creates_nothing(operator_page, digits):
    response = operator_page.post("/models/", {"name": "Digits", "owner": "olivia"})

    assert response.status_code == 400
    assert "a model named &#x27;digits&#x27; exists: model names must differ by more than case" in response.content.decode()
    assert RegisteredModel.objects.count() == 1


@pytest.mark.parametrize("page", ["operator_page", "viewer_page"])
def test_typing_models_in_the_address_bar_leads_to_the_list_of_models(page, request, digits):
    # It showed an empty "New model" form, and a viewer a 403.
    response = request.getfixturevalue(page).get("/models/", follow=True)

    assert response.redirect_chain == [("/", 302)]
    assert 'href="/models/digits/"' in response.content.decode()


@pytest.mark.parametrize(("fields", "words"), [
    ({"name": "no spaces!"}, "Enter a valid “slug”"),
    ({"name": "ok", "tags": "has/slash"}, "use lowercase letters"),
    ({"name": "ok", "tags": ", ".join(f"t{index}" for index in range(11))}, "at most 10 tags"),
    ({"name": "stats"}, "&#x27;stats&#x27; is reserved"),
    ({"name": "ok", "description": "\u202etxt.exe"}, "must not hold control characters or directional overrides (found U+202E)"),
])
def test_a_bad_name_or_bad_tags_are_shown_on_the_form(operator_page, fields, words):
    response = operator_page.post("/models/", fields)

    assert response.status_code == 400
    assert words in response.content.decode()
    assert RegisteredModel.objects.count() == 0


def test_viewer_sees_no_create_control_and_cannot_post(viewer_page, digits):
    assert 'id="model-create-form"' not in viewer_page.get("/").content.decode()

    response = viewer_page.post("/models/", {"name": "sneaky"})

    assert response.status_code == 403
    assert not RegisteredModel.objects.filter(name="sneaky").exists()


def test_operator_sees_the_create_form_on_the_models_page(operator_page):
    html = operator_page.get("/").content.decode()

    assert 'id="model-create-form"' in html
    assert '<label for="id_new_name">Name</label>' in html


# ---------------------------------------------------------------- search, filters, sort


@pytest.fixture
def catalogue(operator, viewer):
    for name, description, tags, owner in [
        ("digits", "handwritten digits", ["cv"], viewer),
        ("churn", "who leaves", ["risk"], operator),
        ("fraud-cards", "card fraud", ["risk", "cards"], operator),
    ]:
        catalog.create_model(name, created_by=operator, description=description, tags=tags, owner=owner)


def test_search_matches_name_description_and_tags(operator_page, catalogue):
    assert listed(operator_page.get("/", {"q": "fraud"})) == ["fraud-cards"]
    assert listed(operator_page.get("/", {"q": "handwritten"})) == ["digits"]
    assert listed(operator_page.get("/", {"q": "risk"})) == ["churn", "fraud-cards"]


def test_tag_and_owner_filters(operator_page, catalogue):
    assert listed(operator_page.get("/", {"tag": "risk"})) == ["churn", "fraud-cards"]
    assert listed(operator_page.get("/", {"owner": "victor"})) == ["digits"]
    assert listed(operator_page.get("/", {"tag": "risk", "owner": "victor"})) == []


def test_sort_by_name_newest_and_last_updated(operator_page, catalogue):
    assert listed(operator_page.get("/", {"sort": "name"})) == ["churn", "digits", "fraud-cards"]
    assert listed(operator_page.get("/", {"sort": "created"})) == ["fraud-cards", "churn", "digits"]
    add_version(RegisteredModel.objects.get(name="digits"), 1)
    assert listed(operator_page.get("/", {"sort": "updated"})) == ["digits", "fraud-cards", "churn"]


def test_sort_by_requests_per_second_follows_the_live_figures(operator_page, catalogue):
    report_from("w1", generation=0, versions=[
        {"model": "fraud-cards", "version": 1, "requests": 50, "requests_per_s": 50.0},
        {"model": "digits", "version": 1, "requests": 5, "requests_per_s": 5.0},
    ])

    assert listed(operator_page.get("/", {"sort": "requests"})) == ["fraud-cards", "digits", "churn"]


def test_an_unknown_tag_in_a_shared_link_is_ignored_not_an_error(operator_page, catalogue):
    assert listed(operator_page.get("/", {"tag": "gone", "sort": "name"})) == ["churn", "digits", "fraud-cards"]


def test_every_filter_control_has_a_label(operator_page, catalogue):
    html = operator_page.get("/").content.decode()
    form = html[html.index('id="model-filters"'):html.index("</form>", html.index('id="model-filters"'))]

    controls = re.findall(r'<(?:input|select)\b[^>]*>', form)
    assert [re.search(r'\bname="([^"]+)"', control).group(1) for control in controls] == ["q", "tag", "owner", "sort", "archived"]
    for control in controls:
        named = re.search(r'\bid="([^"]+)"', control)
        assert named and f'for="{named.group(1)}"' in form, control


def test_the_list_pages_after_fifty_models_keeping_the_query(operator_page, operator):
    for index in range(52):
        catalog.create_model(f"m{index:02d}", created_by=operator, tags=["bulk"])

    first = operator_page.get("/", {"tag": "bulk"})
    second = operator_page.get("/", {"tag": "bulk", "page": 2})

    assert len(listed(first)) == 50
    assert listed(second) == ["m50", "m51"]
    assert 'href="?tag=bulk&amp;page=2"' in first.content.decode()


# ---------------------------------------------------------------- details, archive


def test_operator_changes_tags_and_owner_on_the_model_page(operator_page, digits, viewer):
    response = operator_page.post("/models/digits/details/", {"description": "new words", "tags": "cv, mnist", "owner": "victor"})

    assert response.status_code == 302
    digits.refresh_from_db()
    assert (digits.description, digits.tags, digits.owner.username) == ("new words", ["cv", "mnist"], "victor")
    assert "mnist" in operator_page.get("/models/digits/").content.decode()


def test_bad_tags_on_the_model_page_are_shown_and_change_nothing(operator_page, digits):
    response = operator_page.post("/models/digits/details/", {"description": "x", "tags": "Bad/Tag"})

    assert response.status_code == 400
    assert "use lowercase letters" in response.content.decode()
    digits.refresh_from_db()
    assert (digits.description, digits.tags) == ("test digits", [])


def test_a_description_with_a_directional_override_on_the_model_page_is_shown_and_changes_nothing(operator_page, digits):
    response = operator_page.post("/models/digits/details/", {"description": "\u202etxt.exe", "tags": ""})

    assert response.status_code == 400
    assert "directional overrides (found U+202E)" in response.content.decode()
    digits.refresh_from_db()
    assert digits.description == "test digits"


def test_a_description_past_the_limit_on_the_model_page_is_named_with_its_length_and_changes_nothing(operator_page, digits):
    response = operator_page.post("/models/digits/details/", {"description": "x" * 2001, "tags": ""})

    assert response.status_code == 400
    assert "at most 2000 characters (it has 2001)" in response.content.decode()
    digits.refresh_from_db()
    assert digits.description == "test digits"


@pytest.mark.parametrize("path", ["/", "/models/digits/", "/models/digits/jobs/"])
def test_description_fields_do_not_cut_what_is_pasted_into_them(operator_page, digits, path):
    """A maxlength attribute made the browser cut a pasted description at 2,000 characters
    without a word; the server refuses one too long and says by how much."""
    page = operator_page.get(path).content.decode()

    fields = re.findall(r'<(?:input|textarea)[^>]*name="description"[^>]*>', page)

    assert fields and not [field for field in fields if "maxlength" in field]


def test_the_upload_forms_description_carries_the_limit_an_upload_is_refused_beyond(operator_page, digits):
    """An upload refuses a longer description only once the whole artifact has arrived:
    the page checks it first, with the form's own limit, and still cuts nothing."""
    page = operator_page.get("/models/digits/").content.decode()

    field = re.search(r'<input[^>]*id="id_description"[^>]*>', page).group(0)

    assert 'data-max-chars="2000"' in field and 'pattern=".{0,2000}"' in field and 'title="At most 2000 characters"' in field
    assert "maxlength" not in field


def test_viewer_cannot_change_details_or_archive(viewer_page, digits):
    assert viewer_page.post("/models/digits/details/", {"tags": "x"}).status_code == 403
    assert viewer_page.post("/models/digits/archive/").status_code == 403
    assert 'id="model-details-form"' not in viewer_page.get("/models/digits/").content.decode()


def test_archive_asks_first_then_hides_the_model_until_show_archived(operator_page, operator):
    catalog.create_model("draft", created_by=operator)

    confirm = operator_page.get("/models/draft/archive/")
    done = operator_page.post("/models/draft/archive/", {"reason": "unused"})

    assert "Archive draft?" in confirm.content.decode()
    assert done.status_code == 302
    assert "draft" not in listed(operator_page.get("/"))
    assert listed(operator_page.get("/", {"archived": "true"})) == ["draft"]
    assert AuditEvent.objects.get(kind="model_archived").data == {"reason": "unused", "generation": None}


def test_the_archive_confirmation_of_a_served_model_says_what_stops_and_what_comes_back(operator_page, digits):
    confirm = operator_page.get("/models/digits/archive/").content.decode()

    assert "v1 100% stops serving on every worker; restore brings back v1 100%." in confirm


def test_archiving_a_served_model_from_the_page_stops_serving_it(operator_page, digits):
    response = operator_page.post("/models/digits/archive/", {"reason": "retired"})

    assert messages_of(response) == [("digits archived: it is hidden from the Models page and takes no uploads. "
                                      "It stopped serving at generation 2; workers are unloading it.")]
    assert (digits.current_release().action, digits.current_release().reason) == ("archive", "retired")


def test_an_archived_served_model_renders_on_its_page_and_the_models_page(operator_page, digits, operator):
    catalog.archive(digits, operator)

    page = operator_page.get("/models/digits/")
    listing = operator_page.get("/", {"archived": "true"})

    assert page.status_code == 200
    assert "Archived at generation 2: digits serves nothing" in page.content.decode()
    assert "Restoring it brings back v1 100%." in page.content.decode()
    assert 'id="rollback-button"' not in page.content.decode()
    row = re.search(r'<tr data-model="digits".*?</tr>', listing.content.decode(), re.DOTALL).group(0)
    assert listing.status_code == 200 and "archived" in row and "serves nothing" in row and "split-seg" not in row


def test_the_archive_release_page_says_it_serves_nothing_and_what_a_restore_brings_back(operator_page, digits, operator):
    catalog.archive(digits, operator, "retired")

    page = operator_page.get("/models/digits/releases/2/").content.decode()

    assert "Traffic: nothing (archived: no worker serves the model)" in page
    assert "from the archive brings back the routes of" in page and "A rollback from here" not in page
    assert "Model digits archived; it stopped serving at generation 2: retired" in page


def test_restoring_a_served_model_from_the_page_serves_it_again(operator_page, digits, operator):
    catalog.archive(digits, operator)

    response = operator_page.post("/models/digits/unarchive/")

    assert messages_of(response) == ["digits restored from the archive: traffic is back to v1 100% (generation 3)."]
    assert digits.current_release().routes == [{"version": 1, "weight": 100}]


def test_restore_brings_an_archived_model_back(operator_page, operator):
    model = catalog.create_model("draft", created_by=operator)
    catalog.archive(model, operator)

    page = operator_page.get("/models/draft/").content.decode()
    response = operator_page.post("/models/draft/unarchive/")

    assert "Restore from the archive" in page and 'id="upload-form"' not in page
    assert response.status_code == 302
    assert listed(operator_page.get("/")) == ["draft"]


# ---------------------------------------------------------------- duplicate upload through the page twin


def test_the_page_twin_answers_a_duplicate_upload_with_the_existing_version(operator_page, digits, artifact_root):
    data = to_bytes(random_mlp([4, 3], seed=11))
    first = io.BytesIO(data)
    first.name = "v3.onnx"
    operator_page.post("/models/digits/upload/", {"artifact": first}, HTTP_ACCEPT="application/json")
    again = io.BytesIO(data)
    again.name = "again.onnx"

    response = operator_page.post("/models/digits/upload/", {"artifact": again}, HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    body = response.json()
    assert (body["level"], body["existing_version"], body["page_url"]) == ("error", 3, "/models/digits/versions/3/")
    assert "identical to version 3" in body["message"]
    assert list(digits.versions.values_list("number", flat=True)) == [3, 2, 1]


def test_a_duplicate_upload_without_javascript_names_the_forms_copy_checkbox_which_registers_a_copy(operator_page, digits, artifact_root):
    """The refusal said "send allow_duplicate=true", which a page without JavaScript cannot."""
    data = to_bytes(random_mlp([4, 3], seed=11))
    operator_page.post("/models/digits/upload/", {"artifact": io.BytesIO(data)})

    refused = operator_page.post("/models/digits/upload/", {"artifact": io.BytesIO(data)}, follow=True)
    copied = operator_page.post("/models/digits/upload/", {"artifact": io.BytesIO(data), "allow_duplicate": "on"})

    text = refused.content.decode()
    assert "tick “Upload as a copy” and upload it again" in text and "allow_duplicate=true" not in text
    assert 'name="allow_duplicate"' in text  # the checkbox it names, on the page it lands on
    assert copied.status_code == 302
    assert list(digits.versions.values_list("number", flat=True)) == [4, 3, 2, 1]


@pytest.mark.parametrize("reason", ["x" * 501, "retired\x00"])
@pytest.mark.parametrize(("action", "said"), [("archive", "Not archived"), ("unarchive", "Not restored")])
def test_an_archive_or_restore_with_a_reason_the_form_refuses_is_not_done_and_says_why(operator_page, digits, operator, reason,
                                                                                       action, said):
    # The reason was dropped without a word and the model archived (every worker stopped serving it).
    if action == "unarchive":
        catalog.archive(digits, operator)
    before = digits.current_release().generation

    response = operator_page.post(f"/models/digits/{action}/", {"reason": reason})

    assert [message.startswith(f"{said}: Reason (optional): ") for message in messages_of(response)] == [True]
    assert digits.current_release().generation == before


def test_an_archive_asked_for_as_json_with_a_bad_reason_is_a_400_naming_it(operator_page, digits):
    response = operator_page.post("/models/digits/archive/", {"reason": "x" * 501}, headers={"Accept": "application/json"})

    assert response.status_code == 400
    assert response.json()["message"].startswith("Not archived: Reason (optional): Ensure this value has at most 500 characters")
