"""The 403 and 404 pages look like the console (its stylesheet, its top bar) and, like
every error page, render without the database: no session, no user menu."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory

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
