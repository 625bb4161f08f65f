"""An API request names each query parameter once: a repeated one is a 400 naming it,
where it took the last value while a proxy or a log in front may read the first."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("url", "named"), [
    ("/api/workers/?all=1&all=0", "all"),
    ("/api/models/?limit=1&limit=500", "limit"),
    ("/api/models/digits/release/?at=2026-01-01T00:00:00Z&at=2030-01-01T00:00:00Z", "at"),
])
def test_a_repeated_query_parameter_is_a_400_naming_it(viewer_client, three_versions, url, named):
    response = viewer_client.get(url)

    assert response.status_code == 400
    assert response.json() == {"error": f"the query parameter '{named}' is given 2 times: send it once"}


def test_a_repeated_query_parameter_on_a_change_is_refused_before_the_change(operator_client, three_versions):
    response = operator_client.post("/api/models/digits/release/rollback/?reason=a&reason=b", {}, format="json")

    assert response.status_code == 400
    assert three_versions.current_release().generation == 1


def test_query_parameters_given_once_are_read_as_before(viewer_client, three_versions):
    assert viewer_client.get("/api/workers/?all=1").status_code == 200
    assert viewer_client.get("/api/models/?limit=1").status_code == 200


def test_a_semicolon_in_the_query_string_is_a_400_saying_how_to_separate_parameters(viewer_client, three_versions):
    response = viewer_client.get("/api/workers/?all=1;all=0")

    assert response.status_code == 400
    assert response.json()["error"].startswith("a ';' in the query string: separate parameters with '&'")


def test_an_encoded_semicolon_in_a_value_is_read_as_before(viewer_client, three_versions):
    assert viewer_client.get("/api/workers/?all=1%3B").status_code == 200


def test_more_query_parameters_than_django_reads_is_a_json_400(viewer_client, three_versions, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10

    response = viewer_client.get("/api/workers/?" + "&".join(f"p{index}=1" for index in range(11)))

    assert response.status_code == 400
    assert "exceeded settings.DATA_UPLOAD_MAX_NUMBER_FIELDS" in response.json()["error"]


async def test_a_repeated_query_parameter_is_refused_under_asgi_too():
    from django.test import AsyncClient

    response = await AsyncClient().get("/api/workers/?all=1&all=0")

    assert response.status_code == 400
    assert response.json() == {"error": "the query parameter 'all' is given 2 times: send it once"}
