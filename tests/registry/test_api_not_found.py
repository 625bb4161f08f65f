"""A 404 names what was asked for in the URL's words, not the table Django looked in
("No RegisteredModel matches the given query.")."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("path", "error"), [
    ("/api/models/nope/", "no model named 'nope'"),
    ("/api/models/nope/versions/1/", "no model named 'nope'"),
    ("/api/models/digits/versions/99/", "model 'digits' has no version 99"),
    ("/api/models/digits/versions/99/artifact", "model 'digits' has no version 99"),
    ("/api/models/digits/rollouts/999/", "model 'digits' has no rollout 999"),
    ("/api/models/digits/jobs/999/", "model 'digits' has no job 999"),
    ("/api/models/digits/datasets/missing/", "model 'digits' has no data set 'missing'"),
])
def test_a_missing_resource_is_a_404_naming_it(viewer_client, three_versions, path, error):
    response = viewer_client.get(path)

    assert (response.status_code, response.json()) == (404, {"error": error})


def test_an_upload_to_a_model_not_made_yet_says_to_make_it_first(operator_client, good_onnx):
    with open(good_onnx, "rb") as handle:
        response = operator_client.post("/api/models/tiny3/versions/", {"artifact": handle}, format="multipart")

    assert (response.status_code, response.json()) == (404, {"error": 'no model named \'tiny3\'; create it first: POST /api/models/ with {"name": "tiny3"}'})
