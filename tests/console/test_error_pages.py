"""The 403 and 404 pages look like the console (its stylesheet, its top bar) and, like
every error page, render without the database: no session, no user menu."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import PermissionDenied
from django.test import AsyncClient, RequestFactory

from console import views
from tests.console.test_outage import signed_in_request, unreachable_database

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_viewer_asking_to_change_traffic_gets_the_styled_403_page(viewer_page, digits):
    response = viewer_page.get("/models/digits/promote/")

    html = response.content.decode()
    assert response.status_code == 403
    assert "<title>Not allowed · ModelOps console</title>" in html
    assert 'rel="stylesheet" href="/static/css/console.css"' in html
    assert "Sign out" not in html  # no user menu: nothing read the session


def test_the_403_page_renders_for_a_signed_in_user_without_the_database(viewer):
    request = signed_in_request(viewer, "/models/digits/promote/")

    with unreachable_database():
        response = views.permission_denied(request, PermissionDenied("your role may only read"))

    assert response.status_code == 403
    assert b"Not allowed" in response.content


def test_a_403_under_the_api_is_json_naming_the_reason():
    response = views.permission_denied(RequestFactory().get("/api/models/"), PermissionDenied("your role may only read"))

    assert response.status_code == 403
    assert json.loads(response.content) == {"error": "your role may only read"}


def test_the_404_page_is_styled_and_offers_ways_on(operator_page):
    response = operator_page.get("/models/no-such-model/")

    html = response.content.decode()
    assert response.status_code == 404
    assert "<title>Not found · ModelOps console</title>" in html
    assert 'rel="stylesheet" href="/static/css/console.css"' in html
    assert '<nav class="error-links" aria-label="Ways on">' in html
    assert "Sign out" not in html


@pytest.mark.parametrize("charset", ["utf-7", "latin-1"])
def test_a_sign_in_form_in_another_charset_is_a_400_naming_it_not_a_500(charset):
    """Django's own 400 view read the body again, whose charset had made the 400: under ASGI
    (the console's server) a 500 with a traceback in the log, for anyone, before any sign-in."""
    browser = AsyncClient(enforce_csrf_checks=True)
    async_to_sync(browser.get)("/login/")  # its CSRF cookie: the form's token is what is read next

    response = async_to_sync(browser.post)("/login/", "username=a&password=b", content_type=f"application/x-www-form-urlencoded; charset={charset}")

    html = response.content.decode()
    assert response.status_code == 400
    assert "must be UTF-8 encoded" in html
    assert "<title>Bad request · ModelOps console</title>" in html


def test_a_signed_in_form_in_another_charset_is_a_400_and_changes_nothing(operator_page, digits):
    response = operator_page.post("/models/digits/details/", "description=changed&tags=",
                                  content_type="application/x-www-form-urlencoded; charset=latin-1")

    assert response.status_code == 400
    digits.refresh_from_db()
    assert digits.description == "test digits"


def test_a_form_of_too_many_fields_is_a_400_saying_so_once_without_the_charset_hint():
    from django.core.exceptions import TooManyFieldsSent

    response = views.bad_request(RequestFactory().post("/login/"), TooManyFieldsSent("The number of GET/POST parameters exceeded "
                                                                                     "settings.DATA_UPLOAD_MAX_NUMBER_FIELDS."))

    html = response.content.decode()
    assert response.status_code == 400
    assert "<p>The number of GET/POST parameters exceeded settings.DATA_UPLOAD_MAX_NUMBER_FIELDS.</p><p>Nothing was changed.</p>" in html
    assert "UTF-8" not in html


def test_a_bad_request_that_is_suspicious_names_no_detail():
    """A Host not allowed would name the setting to change: the page says only what is wrong."""
    from django.core.exceptions import DisallowedHost

    response = views.bad_request(RequestFactory().get("/"), DisallowedHost("Invalid HTTP_HOST header: 'x'. You may need to add 'x' to ALLOWED_HOSTS."))

    assert response.status_code == 400
    assert b"ALLOWED_HOSTS" not in response.content


def test_a_400_under_the_api_is_json():
    from django.core.exceptions import BadRequest

    response = views.bad_request(RequestFactory().get("/api/models/"), BadRequest("HTTP requests with the form content type must be UTF-8 encoded"))

    assert (response.status_code, json.loads(response.content)) == (400, {"error": "HTTP requests with the form content type must be UTF-8 encoded"})


def test_a_session_deleted_during_the_request_does_not_say_nothing_was_changed():
    """Found when the answer saves the session: the change the request made may be saved
    (an admin's form in the Django admin was, under "Nothing was changed")."""
    from django.contrib.sessions.exceptions import SessionInterrupted

    response = views.bad_request(RequestFactory().post("/admin/auth/user/1/change/"), SessionInterrupted("The request's session was deleted "
                                                                                                         "before the request completed."))

    html = response.content.decode()
    assert "Nothing was changed" not in html
    assert "may have been done before it was cut off: check it before sending it again" in html
