"""Models, authentication, the schema and error bodies."""

from __future__ import annotations

import re
from collections import OrderedDict

import pytest
from django.core.management import call_command
from drf_spectacular.generators import SchemaGenerator

from registry.api.schema_view import SchemaView
from registry.models import AuditEvent, RegisteredModel

pytestmark = pytest.mark.django_db


def test_anonymous_request_gets_401_as_json(stranger_client):
    response = stranger_client.get("/api/models/")

    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
    assert "credentials" in response.json()["error"].lower()


def test_bad_token_gets_401(stranger_client):
    stranger_client.credentials(HTTP_AUTHORIZATION="Token nope")

    response = stranger_client.get("/api/models/")

    assert response.status_code == 401
    assert response.json()["error"] == "Invalid token."


@pytest.mark.parametrize(("header", "words"), [
    ("Bearer some-token", "the Authorization header's scheme 'Bearer' is not accepted here: send 'Authorization: Token <token>'"),
    ("some-token", "the Authorization header has no scheme before its token: send 'Authorization: Token <token>'"),
    ("some-token extra", "the Authorization header's first word is not a scheme accepted here: send 'Authorization: Token <token>'"),
])
def test_credentials_in_a_scheme_the_api_does_not_take_are_a_401_saying_which_it_takes(stranger_client, header, words):
    # "Authentication credentials were not provided." read as if the header had been lost.
    stranger_client.credentials(HTTP_AUTHORIZATION=header)

    response = stranger_client.get("/api/models/")

    assert response.status_code == 401
    assert response.json()["error"] == words
    assert "some-token" not in response.content.decode()


def test_a_worker_endpoint_names_both_schemes_it_takes(stranger_client):
    stranger_client.credentials(HTTP_AUTHORIZATION="Basic dXNlcjpwYXNz")

    response = stranger_client.get("/api/serving/state")

    assert response.status_code == 401
    assert response.json()["error"] == ("the Authorization header's scheme 'Basic' is not accepted here: "
                                        "send 'Authorization: Bearer <token>' or 'Authorization: Token <token>'")


def test_an_anonymous_request_for_the_schema_is_a_json_401(stranger_client):
    response = stranger_client.get("/api/schema/")

    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"error": "Authentication credentials were not provided."}


def test_session_authentication_works(client, operator):
    client.force_login(operator)

    assert client.get("/api/models/").status_code == 200


def test_schema_endpoint_describes_the_api(operator_client):
    response = operator_client.get("/api/schema/", HTTP_ACCEPT="application/json")

    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/api/models/{name}/versions/" in paths
    assert "/api/models/{name}/release/rollback/" in paths


def test_the_schema_is_built_once_and_answered_alike_after(operator_client, viewer_client, monkeypatch):
    # About 85 ms of the console's CPU a build, repeatable at will by any signed-in user.
    monkeypatch.setattr(SchemaView, "_built", OrderedDict())
    builds = []
    build = SchemaGenerator.get_schema
    monkeypatch.setattr(SchemaGenerator, "get_schema", lambda self, **kw: builds.append(1) or build(self, **kw))

    first = operator_client.get("/api/schema/", HTTP_ACCEPT="application/json")
    second = viewer_client.get("/api/schema/", HTTP_ACCEPT="application/json")

    assert (first.status_code, second.status_code, len(builds)) == (200, 200, 1)
    assert first.json() == second.json()


def test_a_version_in_the_query_string_builds_no_other_schema(operator_client, monkeypatch):
    monkeypatch.setattr(SchemaView, "_built", OrderedDict())
    builds = []
    build = SchemaGenerator.get_schema
    monkeypatch.setattr(SchemaGenerator, "get_schema", lambda self, **kw: builds.append(1) or build(self, **kw))

    answers = [operator_client.get(f"/api/schema/?version={name}", HTTP_ACCEPT="application/json") for name in ("", "a", "b", "evil")]

    assert len(builds) == 1
    assert {answer.json()["info"]["version"] for answer in answers} == {"1.0.0"}


def test_the_schema_is_still_refused_to_anonymous_callers_once_built(operator_client, stranger_client):
    operator_client.get("/api/schema/", HTTP_ACCEPT="application/json")

    assert stranger_client.get("/api/schema/", HTTP_ACCEPT="application/json").status_code == 401


def test_the_schema_builds_without_a_warning(tmp_path):
    # A warning is something the schema gets wrong or leaves out (an unknown
    # authentication class left the worker endpoints with no security at all).
    call_command("spectacular", "--fail-on-warn", "--validate", "--file", str(tmp_path / "schema.yml"))


def test_the_schema_says_how_each_endpoint_authenticates(operator_client):
    schema = operator_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()

    worker_token = schema["components"]["securitySchemes"]["workerToken"]
    assert (worker_token["in"], worker_token["name"]) == ("header", "Authorization") and "Bearer" in worker_token["description"]
    assert schema["paths"]["/api/serving/acks"]["post"]["security"] == [{"workerToken": []}]
    assert {"workerToken": []} in schema["paths"]["/api/serving/state"]["get"]["security"]
    upload_security = schema["paths"]["/api/models/{name}/versions/"]["post"]["security"]
    assert {"cookieAuthCsrfHeader": []} in upload_security and {"tokenAuth": []} in upload_security


def test_each_status_enum_is_named_for_its_model(operator_client):
    names = set(operator_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()["components"]["schemas"])

    assert {"VersionStatusEnum", "DrillStatusEnum", "RolloutStatusEnum", "JobStatusEnum"} <= names


def test_operator_creates_a_model(operator_client):
    response = operator_client.post("/api/models/", {"name": "fraud", "description": "cards"}, format="json")

    assert response.status_code == 201
    assert response.json()["name"] == "fraud"
    assert response.json()["current_release"] is None
    assert AuditEvent.objects.filter(kind="model_created", model__name="fraud").count() == 1


def test_model_name_must_be_a_slug(operator_client):
    response = operator_client.post("/api/models/", {"name": "no spaces!"}, format="json")

    assert response.status_code == 400
    assert response.json()["error"].startswith("name:")
    assert RegisteredModel.objects.count() == 0


def test_duplicate_model_name_is_refused(operator_client):
    operator_client.post("/api/models/", {"name": "fraud"}, format="json")

    response = operator_client.post("/api/models/", {"name": "fraud"}, format="json")

    assert response.status_code == 409  # as a name taken but for its case is
    assert response.json()["error"] == "a model named 'fraud' already exists"
    assert RegisteredModel.objects.count() == 1


def test_viewer_cannot_create_a_model(viewer_client):
    response = viewer_client.post("/api/models/", {"name": "fraud"}, format="json")

    assert response.status_code == 403
    assert "only read" in response.json()["error"]
    assert RegisteredModel.objects.count() == 0


def test_unknown_model_is_a_json_404(operator_client):
    response = operator_client.get("/api/models/nope/")

    assert response.status_code == 404
    assert response.json()["error"]


def test_a_model_description_past_2000_characters_is_refused(operator_client):
    response = operator_client.post("/api/models/", {"name": "fraud", "description": "x" * 2001}, format="json")

    assert response.status_code == 400
    assert response.json()["error"] == "description: Ensure this field has no more than 2000 characters."


def test_the_api_root_names_its_collections_and_schema(viewer_client):
    response = viewer_client.get("/api/")

    assert response.status_code == 200
    assert response.json() == {"models": "http://testserver/api/models/", "workers": "http://testserver/api/workers/",
                               "drills": "http://testserver/api/drills/", "schema": "http://testserver/api/schema/"}


def test_an_unknown_format_is_a_404_naming_it(viewer_client):
    response = viewer_client.get("/api/workers/?format=xml")

    assert response.status_code == 404
    assert response.json()["error"] == "format 'xml' is not one this endpoint answers: leave out ?format= for JSON"


def test_unknown_api_path_is_a_json_404(operator_client):
    response = operator_client.get("/api/nothing-here/")

    assert response.status_code == 404
    assert response.json()["error"].startswith("no such resource")


def test_malformed_json_is_a_400_naming_the_problem(operator_client):
    response = operator_client.post("/api/models/", "{not json", content_type="application/json")

    assert response.status_code == 400
    assert "JSON parse error" in response.json()["error"]


@pytest.mark.parametrize("path", ["/api/models/", "/api/models/digits/release/", "/api/models/digits/drills/"])
def test_json_nested_past_the_decoder_s_depth_is_a_400_not_a_500(operator_client, three_versions, path):
    response = operator_client.post(path, "[" * 5000 + "]" * 5000, content_type="application/json")

    assert response.status_code == 400
    assert response.json()["error"] == "JSON parse error - nested too deeply"


@pytest.mark.parametrize("body", ['{"routes": [{"version": 1, "weight": 0, "weight": 100}]}',
                                  '{"routes": [], "reason": "a", "routes": [{"version": 1, "weight": 100}]}'])
def test_a_key_given_twice_in_one_object_is_a_400_naming_it_and_changes_nothing(operator_client, three_versions, body):
    # The last value won in silence, where a proxy or a client library in front may read the first.
    before = three_versions.current_release().generation

    response = operator_client.post("/api/models/digits/release/", body, content_type="application/json")

    assert response.status_code == 400
    assert response.json()["error"].startswith("JSON parse error - the key '")
    assert response.json()["error"].endswith("' appears more than once in one object")
    assert three_versions.current_release().generation == before


def test_the_same_key_in_different_objects_is_accepted(operator_client, three_versions):
    body = '{"routes": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], "reason": "half"}'

    assert operator_client.post("/api/models/digits/release/", body, content_type="application/json").status_code == 201


def test_a_worker_report_nested_past_the_decoder_s_depth_is_a_400_not_a_500(worker_client):
    body = '{"contract": 1, "shadow": ' + "[" * 5000 + "]" * 5000 + "}"
    response = worker_client.post("/api/serving/reports", body, content_type="application/json")

    assert response.status_code == 400
    assert "nested too deeply" in response.json()["error"]


def test_serving_state_needs_the_worker_token(client, settings):
    assert client.get("/api/serving/state").status_code == 401
    assert client.get("/api/serving/state", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401

    response = client.get("/api/serving/state", HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}")

    assert response.status_code == 200
    assert (response.json()["generation"], response.json()["models"]) == (0, {})


@pytest.mark.parametrize("field", ["max_batch_size", "name", "descripton"])
def test_a_patch_of_a_field_it_does_not_take_is_refused_naming_it(operator_client, field):
    operator_client.post("/api/models/", {"name": "fraud", "description": "cards"}, format="json")

    response = operator_client.patch("/api/models/fraud/", {field: 8}, format="json")

    assert response.status_code == 400
    assert response.json()["error"] == f"{field}: this request does not take this field (it takes: description, tags, owner, analysis)"
    assert RegisteredModel.objects.get(name="fraud").description == "cards"


def test_a_model_created_with_a_field_it_does_not_take_is_refused_and_not_created(operator_client):
    response = operator_client.post("/api/models/", {"name": "fraud", "max_batch_sise": 8}, format="json")

    assert response.status_code == 400
    assert response.json()["error"].startswith("max_batch_sise: this request does not take this field (it takes: name, description,")
    assert not RegisteredModel.objects.filter(name="fraud").exists()


def _example_paths() -> list[str]:
    from registry.api.urls import urlpatterns

    values = {"slug:name": "digits", "int:number": "1", "int:pk": "1", "int:job_id": "1", "slug:dataset": "holdout"}
    return ["/api/" + re.sub(r"<([^>]+)>", lambda found: values[found.group(1)], str(pattern.pattern)) for pattern in urlpatterns]


@pytest.mark.parametrize("path", _example_paths())
def test_an_anonymous_options_request_is_refused_on_every_api_route(stranger_client, path):
    """The artifact route took anyone (it checks the caller itself), so DRF answered an
    anonymous OPTIONS with the API's metadata before that check ran."""
    assert stranger_client.options(path).status_code == 401


@pytest.mark.parametrize("description", ["\u202egnp.exe", "\x1b[31m red", "a\u2066b", "hidden\U000E0041text"])
def test_a_description_with_control_characters_or_directional_overrides_is_refused_and_nothing_changes(operator_client, three_versions,
                                                                                                      description):
    # Pages and the audit timeline showed them raw: an override shows other text than is stored.
    created = operator_client.post("/api/models/", {"name": "fraud", "description": description}, format="json")
    changed = operator_client.patch("/api/models/digits/", {"description": description}, format="json")

    for response in (created, changed):
        assert response.status_code == 400
        assert response.json()["error"].startswith("description: must not hold ")
    assert not RegisteredModel.objects.filter(name="fraud").exists()
    assert RegisteredModel.objects.get(name="digits").description == three_versions.description


def test_a_description_keeps_its_lines_tabs_and_marks(operator_client):
    description = "Cards fraud.\r\n\tSecond line: \u200fעברית\u200f, a soft\u00adhyphen"

    response = operator_client.post("/api/models/", {"name": "fraud", "description": description}, format="json")

    assert response.status_code == 201
    assert RegisteredModel.objects.get(name="fraud").description == description


@pytest.mark.parametrize("name", ["stats", "Stats"])
def test_a_model_named_as_a_worker_route_is_refused(operator_client, name):
    # The worker's /v2/models/stats answers every model's statistics: a model named so lost
    # its metadata. Names differing only by case are one name to the catalogue.
    response = operator_client.post("/api/models/", {"name": name}, format="json")

    assert response.status_code == 400
    assert response.json()["error"] == (f"name: {name!r} is reserved: a worker's /v2/models/stats answers every model's statistics, "
                                        "so a model of that name could not be described")
    assert not RegisteredModel.objects.exists()


@pytest.mark.parametrize("charset", ["utf-7", "utf-16", "unicode_escape", "latin-1"])
def test_a_json_body_in_a_charset_other_than_utf_8_is_a_415_and_changes_nothing(operator_client, three_versions, charset):
    # A proxy in front reads the bytes as UTF-8 (RFC 8259); the API read "\\u0041" as "A" under unicode_escape.
    body = '{"description": "+AEE-"}'.encode("ascii")

    response = operator_client.patch("/api/models/digits/", body, content_type=f"application/json; charset={charset}")

    assert response.status_code == 415
    assert response.json()["error"] == f"JSON is read as UTF-8 only (RFC 8259), not charset={charset}. This endpoint takes application/json."
    assert RegisteredModel.objects.get(name="digits").description == three_versions.description


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", "utf8"])
def test_a_json_body_declared_utf_8_is_read(operator_client, three_versions, charset):
    response = operator_client.patch("/api/models/digits/", '{"description": "café"}'.encode(), content_type=f"application/json; charset={charset}")

    assert response.status_code == 200
    assert RegisteredModel.objects.get(name="digits").description == "café"


def test_a_json_body_declared_ascii_is_read_as_the_utf_8_it_is_part_of(operator_client, three_versions):
    response = operator_client.patch("/api/models/digits/", b'{"description": "caf\\u00e9"}', content_type="application/json; charset=us-ascii")

    assert response.status_code == 200
    assert RegisteredModel.objects.get(name="digits").description == "café"
