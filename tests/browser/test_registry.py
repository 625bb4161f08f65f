"""The model catalogue in a real browser: an operator creates a model from the Models
page (a bad name is answered on the form), finds models by search, tag and sort through
a shareable query string, and an upload identical to an existing version is answered
with a link to it and a button that uploads a copy anyway.

The stack is shared with the other browser tests: every model here has a name of its
own, and nothing touches ``digits``.
"""

from __future__ import annotations

import secrets

import pytest
from playwright.sync_api import expect

from tests.browser.accessibility import assert_no_serious_violations
from tests.browser.conftest import sign_in

pytestmark = pytest.mark.browser

VALIDATION_S = 60_000  # ms: a Celery validation job on two busy cores
expect.set_options(timeout=10_000)


def api_post(page, stack, path: str, body: dict) -> dict:
    """A JSON POST through the signed-in browser session (with its CSRF token)."""
    csrf = next(cookie["value"] for cookie in page.context.cookies() if cookie["name"] == "csrftoken")
    response = page.request.post(path, data=body, headers={"X-CSRFToken": csrf, "Referer": stack.console_url + "/", "Content-Type": "application/json"})
    assert response.status in (200, 201), response.text()
    return response.json()


def test_operator_creates_a_model_from_the_models_page(page, stack):
    name = f"reg-new-{secrets.token_hex(3)}"
    sign_in(page, "olivia")

    page.get_by_text("New model", exact=True).click()
    page.get_by_label("Name", exact=True).fill("digits")
    page.get_by_role("button", name="Create model").click()
    expect(page.locator("#model-create-form")).to_contain_text("a model named 'digits' already exists")
    stack.screenshot(page, "registry-create-refused")
    assert_no_serious_violations(page, "registry-create-refused")

    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Description (optional)").fill("made in the browser")
    page.get_by_label("Tags (optional)").fill("Browser, registry")
    page.get_by_role("button", name="Create model").click()

    page.wait_for_url(f"**/models/{name}/")
    expect(page.locator("#messages")).to_contain_text(f"Model {name} registered")
    expect(page.locator("#model-facts [data-field=tags]")).to_have_text("browserregistry")
    expect(page.locator("#model-facts [data-field=owner]")).to_have_text("olivia")
    stack.screenshot(page, "registry-created")


def test_models_page_search_tag_filter_and_sort_are_in_the_query_string(page, stack):
    label = f"reg{secrets.token_hex(3)}"
    sign_in(page, "olivia")
    for name, tags in ((f"{label}-alpha", [label, "blue"]), (f"{label}-beta", [label]), (f"{label}-gamma", [label, "blue"])):
        api_post(page, stack, "/api/models/", {"name": name, "tags": tags, "description": f"model {name}"})
    page.reload()

    page.get_by_label("Search", exact=True).fill(label)
    page.get_by_role("button", name="Apply").click()
    rows = page.locator("tr[data-model]")
    expect(rows).to_have_count(3)
    assert [row.get_attribute("data-model") for row in rows.all()] == [f"{label}-alpha", f"{label}-beta", f"{label}-gamma"]

    page.get_by_label("Sort by", exact=True).select_option("created")
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url("**sort=created**")
    expect(rows.first).to_have_attribute("data-model", f"{label}-gamma")
    assert [row.get_attribute("data-model") for row in rows.all()] == [f"{label}-gamma", f"{label}-beta", f"{label}-alpha"]
    stack.screenshot(page, "registry-search-sorted")
    assert_no_serious_violations(page, "registry-search-sorted")

    page.goto(f"/?q={label}&tag=blue")  # a shared link opens the same view
    expect(rows).to_have_count(2)
    expect(page.get_by_label("Tag", exact=True)).to_have_value("blue")
    stack.screenshot(page, "registry-filter-tag")


def test_duplicate_upload_links_the_existing_version_and_can_be_sent_as_a_copy(page, stack):
    name = f"reg-dup-{secrets.token_hex(3)}"
    artifact = str(stack.export_dir / "digits-demo-1.onnx")
    sign_in(page, "olivia")
    api_post(page, stack, "/api/models/", {"name": name})
    page.goto(f"/models/{name}/")

    page.locator("#id_artifact").set_input_files(artifact)
    expect(page.locator("#upload-result")).to_contain_text("v1 is ready", timeout=VALIDATION_S)

    page.locator("#id_artifact").set_input_files(artifact)
    result = page.locator("#upload-result")
    expect(result).to_contain_text("identical to version 1")
    expect(result.get_by_role("link", name="Open v1")).to_have_attribute("href", f"/models/{name}/versions/1/")
    stack.screenshot(page, "registry-duplicate-refused")
    assert_no_serious_violations(page, "registry-duplicate-refused")

    result.get_by_role("button", name="Upload as a copy anyway").click()
    expect(result).to_contain_text("v2 is ready", timeout=VALIDATION_S)
    versions = page.request.get(f"/api/models/{name}/versions/").json()
    assert sorted(version["number"] for version in versions) == [1, 2]
    assert versions[0]["sha256"] == versions[1]["sha256"]
    stack.screenshot(page, "registry-duplicate-copied")


def test_an_upload_whose_description_is_past_the_limit_is_refused_before_the_file_is_sent(page, stack):
    # The server refuses a description past 2,000 characters only once the whole artifact
    # has arrived; a maxlength would cut a pasted one short without a word.
    name = f"reg-long-{secrets.token_hex(3)}"
    sign_in(page, "olivia")
    api_post(page, stack, "/api/models/", {"name": name})
    page.goto(f"/models/{name}/")
    posted: list[str] = []
    page.on("request", lambda request: posted.append(request.url) if request.method == "POST" else None)
    page.locator("#id_description").fill("é" * 2001)  # one character each, as the server counts them, two bytes in UTF-8

    page.locator("#id_artifact").set_input_files(str(stack.export_dir / "digits-demo-1.onnx"))

    expect(page.locator("#upload-result")).to_have_text(
        "Not sent: the description has 2001 characters, more than the 2000 a version takes. Shorten it, then choose the file again.")
    assert posted == []
    assert page.locator("#id_description").input_value() == "é" * 2001
    assert page.request.get(f"/api/models/{name}/versions/").json() == []


def test_a_try_it_input_past_the_consoles_body_limit_says_so_on_the_page(page, stack):
    # A tired operator's 3 MB paste showed "No answer.": the console's 413 came as
    # {"error"}, which the page's script did not read.
    sign_in(page, "olivia")
    page.goto("/models/digits/versions/1/")
    page.locator("#id_inputs").evaluate("(box) => { box.value = '1'.repeat(3 * 1024 * 1024); }")

    page.get_by_role("button", name="Send to v1").click()

    expect(page.locator("#try-result")).to_contain_text("the request body is larger than the limit of")


def test_a_refused_upload_keeps_the_description_and_names_the_file(page, stack, tmp_path):
    """A refusal (not ONNX, the wrong file chosen at 3 am) emptied the description typed
    for the upload, and the refusal did not say which file it was about."""
    name = f"reg-keep-{secrets.token_hex(3)}"
    sign_in(page, "olivia")
    api_post(page, stack, "/api/models/", {"name": name})
    page.goto(f"/models/{name}/")
    notes = tmp_path / "release-notes.txt"
    notes.write_text("not a model\n")
    page.locator("#id_description").fill("MLP retrained on March data")

    page.locator("#id_artifact").set_input_files(str(notes))

    expect(page.locator("#upload-result")).to_contain_text("Refused (HTTP 400)")
    expect(page.locator("#id_description")).to_have_value("MLP retrained on March data")
    expect(page.locator("#upload-result")).to_contain_text("Refused (HTTP 400): release-notes.txt: the file is not an ONNX model")

    page.locator("#id_artifact").set_input_files(str(stack.export_dir / "digits-demo-1.onnx"))

    expect(page.locator("#upload-result")).to_contain_text("v1 is ready", timeout=VALIDATION_S)
    assert page.request.get(f"/api/models/{name}/versions/").json()[0]["description"] == "MLP retrained on March data"
    expect(page.locator("#id_description")).to_have_value("")  # stored: the form is ready for the next one
