"""A request to an endpoint's URL without its trailing slash: Django's empty 301 made a
client re-send a change as a GET or without its body, and one that does not follow
redirects saw nothing while nothing was done."""

from __future__ import annotations

import asyncio

import pytest
from django.test import Client

from registry.models import Release

pytestmark = pytest.mark.django_db


def test_a_change_sent_without_the_trailing_slash_does_nothing_and_says_where_to_send_it(operator_client, three_versions):
    response = operator_client.post("/api/models/digits/release", {"routes": [{"version": 2, "weight": 100}]}, format="json")

    assert (response.status_code, response["Location"]) == (308, "/api/models/digits/release/")
    assert response.json() == {"error": "POST /api/models/digits/release: this endpoint's URL ends with a slash "
                                        "(/api/models/digits/release/); nothing was done here. Send the request there (a client that "
                                        "follows redirects, such as curl -L, sends it again with the same method and body)"}
    assert Release.objects.count() == 1


def test_a_client_following_the_redirect_sends_the_change_again_with_its_body(operator_client, three_versions):
    body = {"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], "reason": "try v2"}

    response = operator_client.post("/api/models/digits/release", body, format="json", follow=True)

    assert response.status_code == 201, response.content
    assert response.redirect_chain == [("/api/models/digits/release/", 308)]
    assert (Release.objects.latest("generation").routes, Release.objects.latest("generation").reason) == (body["routes"], "try v2")


def test_a_read_without_the_trailing_slash_is_a_permanent_redirect_saying_where(operator_client, three_versions):
    response = operator_client.get("/api/models/digits?fields=name")

    assert (response.status_code, response["Location"]) == (301, "/api/models/digits/?fields=name")
    assert response.json() == {"error": "/api/models/digits is at /api/models/digits/?fields=name (the URL ends with a slash)"}


def test_a_page_form_posted_without_the_trailing_slash_is_redirected_keeping_its_method_even_in_debug(settings, operator, three_versions):
    # In DEBUG Django raised a RuntimeError (a 500) rather than lose a POST's body.
    settings.DEBUG = True
    client = Client()
    client.force_login(operator)

    response = client.post("/models/digits/rollback", {"reason": "x"})

    assert (response.status_code, response["Location"]) == (308, "/models/digits/rollback/")


def test_an_upload_of_any_size_sent_without_the_trailing_slash_is_sent_on_before_its_body_is_read():
    # Over the form size it was refused 413 as "not an operator's upload"; a small one got its 308.
    from console.asgi import application
    from tests.fixtures.asgi_calls import call, http_scope

    scope = http_scope("/api/models/digits/versions", [(b"content-length", str(3 * 1024 * 1024).encode())])

    sent, received = asyncio.run(call(application, scope, [{"type": "http.request", "body": b"x", "more_body": True}]))

    assert sent[0]["status"] == 308
    assert (b"location", b"/api/models/digits/versions/") in sent[0]["headers"]
    assert b"nothing was done here" in sent[1]["body"]
    assert received == []
