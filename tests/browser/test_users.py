"""Users and roles in a real browser: an admin creates a viewer from the console, the
viewer signs in with the one-time password, chooses their own, and finds no controls;
once deactivated, they can no longer sign in.

Screenshots land in test-artifacts/users-*.png.
"""

from __future__ import annotations

import secrets

import pytest
from playwright.sync_api import expect

from tests.browser.accessibility import assert_no_serious_violations
from tests.browser.conftest import sign_in

pytestmark = pytest.mark.browser

expect.set_options(timeout=10_000)
MODEL_CONTROLS = ("#rollback-button", ".split-form", "#upload-form", "#drill-button", "button[name=preset]")


def sign_in_with(page, username: str, password: str) -> None:
    page.goto("/login/")
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def sign_out(page) -> None:
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/login/**")


def create_viewer(page, stack, username: str) -> str:
    """As the signed-in admin: the one-time password the console shows."""
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Users & roles").click()
    expect(page.locator("tr[data-user=ada]")).to_have_attribute("data-role", "admin")
    stack.screenshot(page, "users-list")
    assert_no_serious_violations(page, "users-list")
    page.get_by_role("link", name="New user").click()
    page.get_by_label("User name").fill(username)
    page.get_by_label("Role").select_option("viewer")
    page.get_by_role("button", name="Create user").click()
    expect(page.get_by_role("status").first).to_contain_text(f"{username} created as viewer")
    expect(page.get_by_role("button", name="Copy")).to_be_visible()
    stack.screenshot(page, "users-created")
    assert_no_serious_violations(page, "users-created")
    return page.locator("#secret").input_value()


def test_an_admin_creates_a_viewer_who_finds_no_controls_and_cannot_sign_in_once_deactivated(page, stack):
    username = f"vera-{secrets.token_hex(3)}"  # the stack is shared: a name of this test's own
    new_password = f"tidal-lantern-{secrets.token_hex(4)}"
    sign_in(page, "ada")
    one_time = create_viewer(page, stack, username)
    sign_out(page)

    sign_in_with(page, username, one_time)
    page.wait_for_url("**/account/password/")
    expect(page.locator("#password-required")).to_contain_text("one-time password")
    page.get_by_label("Old password").fill(one_time)
    page.get_by_label("New password", exact=True).fill(new_password)
    page.get_by_label("New password confirmation").fill(new_password)
    stack.screenshot(page, "users-choose-password")
    page.get_by_role("button", name="Change password").click()
    page.wait_for_url(f"{stack.console_url}/")
    expect(page.locator(".who .role")).to_have_text("viewer")
    expect(page.get_by_role("link", name="Users & roles")).to_have_count(0)
    page.goto("/models/digits/")
    expect(page.locator(".readonly-note")).to_contain_text("operators change traffic")
    for control in MODEL_CONTROLS:
        expect(page.locator(control)).to_have_count(0)
    stack.screenshot(page, "users-viewer-model")
    assert page.request.get("/users/").status == 403
    sign_out(page)

    sign_in(page, "ada")
    page.goto("/users/")
    page.locator(f"tr[data-user={username}]").get_by_role("link", name=username).click()
    page.get_by_role("link", name="Deactivate…").click()
    expect(page.locator("#confirm-title")).to_have_text(f"Deactivate {username}?")
    stack.screenshot(page, "users-confirm-deactivate")
    page.get_by_role("button", name="Deactivate").click()
    expect(page.get_by_role("status").first).to_contain_text(f"{username} deactivated")
    expect(page.locator("#user-status")).to_contain_text("inactive")
    stack.screenshot(page, "users-detail-deactivated")
    sign_out(page)

    sign_in_with(page, username, new_password)
    expect(page.get_by_role("alert")).to_contain_text("correct username and password")
    assert page.url.endswith("/login/")
    stack.screenshot(page, "users-deactivated-sign-in")
