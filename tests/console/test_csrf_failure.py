"""A form refused by the CSRF check says it expired, not that the role may not act: a new
sign-in (in another tab too) rotates the token, so a page loaded before it sends a stale
one. The page's scripts get the words as JSON; a plain form post, a styled page."""

from __future__ import annotations

import pytest
from django.test import Client

from console.views import CSRF_EXPIRED, CSRF_NOT_FROM_HERE
from registry.models import Release

pytestmark = pytest.mark.django_db

SPLIT = {"canary_version": "2", "preset": "10"}


def stale_page(operator) -> tuple[Client, str]:
    """A page and the token a form of an earlier sign-in holds (another CSRF secret, as
    after the rotation a new sign-in makes)."""
    earlier = Client()
    earlier.force_login(operator)
    earlier.get("/models/digits/")
    page = Client(enforce_csrf_checks=True)
    page.force_login(operator)
    page.get("/models/digits/")
    assert page.cookies["csrftoken"].value != earlier.cookies["csrftoken"].value
    return page, earlier.cookies["csrftoken"].value


def test_a_script_posting_a_stale_form_is_told_it_expired_and_nothing_changes(operator, canary_digits):
    page, stale = stale_page(operator)
    releases = Release.objects.count()

    response = page.post("/models/digits/split/", SPLIT, HTTP_ACCEPT="application/json", HTTP_X_CSRFTOKEN=stale)

    assert response.status_code == 403
    assert response.json() == {"level": "error", "message": CSRF_EXPIRED}
    assert Release.objects.count() == releases


def test_a_plain_form_post_with_a_stale_token_gets_the_consoles_page_saying_it_expired(operator, canary_digits):
    page, stale = stale_page(operator)

    response = page.post("/models/digits/split/", {**SPLIT, "csrfmiddlewaretoken": stale})

    assert response.status_code == 403
    text = response.content.decode()
    assert "This form has expired" in text and "reload the page" in text
    assert "CSRF verification failed" not in text
    assert 'class="error-page"' in text  # the console's own error page


def test_a_form_with_no_token_is_told_it_did_not_come_from_the_console_not_that_it_expired(operator, canary_digits):
    """It read "your sign-in changed since the page was loaded" to a form that never had a token."""
    page, _ = stale_page(operator)
    releases = Release.objects.count()

    script = page.post("/models/digits/split/", SPLIT, HTTP_ACCEPT="application/json")
    plain = page.post("/models/digits/split/", SPLIT)

    assert (script.status_code, script.json()) == (403, {"level": "error", "message": CSRF_NOT_FROM_HERE})
    assert plain.status_code == 403 and "This form was not sent from the console" in plain.content.decode()
    assert "expired" not in plain.content.decode()
    assert Release.objects.count() == releases


def test_a_form_from_another_site_is_told_so(operator, canary_digits):
    page, _ = stale_page(operator)

    response = page.post("/models/digits/split/", {**SPLIT, "csrfmiddlewaretoken": page.cookies["csrftoken"].value},
                         HTTP_ACCEPT="application/json", HTTP_ORIGIN="https://evil.example")

    assert (response.status_code, response.json()["message"]) == (403, CSRF_NOT_FROM_HERE)


def test_a_form_whose_csrf_cookie_is_gone_is_told_to_reload(operator, canary_digits):
    """A cleared or expired cookie mends with a reload: not a form from another site."""
    page = Client(enforce_csrf_checks=True)
    page.force_login(operator)  # no page loaded: no CSRF cookie

    response = page.post("/models/digits/split/", SPLIT, HTTP_ACCEPT="application/json", HTTP_X_CSRFTOKEN="x" * 32)

    assert (response.status_code, response.json()["message"]) == (403, CSRF_EXPIRED)
