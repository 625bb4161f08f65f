"""Edges of the KServe V2 / Open Inference Protocol contract, as Triton and its clients
expect them: which versions are offered, readiness documents, paths, methods (HEAD, 405
with Allow), output selection and parameters, and the binary tensor header."""

from __future__ import annotations

import socket

import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from serving_testkit import ort_reference, route, state, v2_body
from tritonclient.utils import InferenceServerException

INFER = "/v2/models/digits/infer"
ONE_ROW = np.ones((1, 64), np.float32)


@pytest.fixture
def canary_worker(start_worker, mlp_v1, mlp_v2):
    """v1 routed, v2 warm (a rollback target), v3 a shadow; pinning unrouted versions is off (the default)."""
    routes = [route(1, 100, *mlp_v1), {**route(3, 0, *mlp_v1), "shadow": 0.5}]
    return start_worker(state(1, {"digits": {"routes": routes, "warm": [route(2, 0, *mlp_v2)]}}))


# ---- versions offered: the ones a request may name ------------------------------------------


def test_model_metadata_lists_only_versions_a_request_may_name(canary_worker, client):
    document = client.get(canary_worker.url + "/v2/models/digits").json()

    assert document["versions"] == ["1"]
    assert document["parameters"]["warm"] == [2, 3]  # still shown to operators, as what they are


@pytest.mark.parametrize("versions", [(1, 2), (2, 1)], ids=["older listed first", "newer listed first"])
def test_at_an_even_split_the_model_metadata_describes_the_older_version(start_worker, client, mlp_v1, mlp_v2, versions):
    """Usually the stable one: a 50/50 split described the canary (the higher number)."""
    models = {"even": {"routes": [route(versions[0], 50, *(mlp_v1 if versions[0] == 1 else mlp_v2)),
                                  route(versions[1], 50, *(mlp_v1 if versions[1] == 1 else mlp_v2))]}}
    worker = start_worker(state(1, models))

    document = client.get(worker.url + "/v2/models/even").json()

    assert document["parameters"]["default_version"] == 1


def test_model_config_lists_only_versions_a_request_may_name(canary_worker, client):
    document = client.get(canary_worker.url + "/v2/models/digits/config").json()

    assert document["version_policy"] == {"specific": {"versions": [1]}}


@pytest.mark.parametrize("asked", ["ready", "metadata", "config"])
@pytest.mark.parametrize("version", [2, 3])
def test_a_version_taking_no_traffic_is_the_404_its_inference_gets(canary_worker, client, version, asked):
    path = f"{canary_worker.url}/v2/models/digits/versions/{version}"
    answer = client.get(path if asked == "metadata" else f"{path}/{asked}")
    infer = client.post(path + "/infer", json=v2_body(ONE_ROW))

    assert infer.status_code == 404
    assert (answer.status_code, answer.json()) == (404, infer.json())
    assert "takes no traffic" in answer.json()["error"]


def test_a_pinnable_warm_versions_metadata_is_served(digits_worker, client):
    """SERVING_ALLOW_PINNING_UNROUTED: a request may name the warm version, so may its metadata."""
    answer = client.get(digits_worker.url + "/v2/models/digits/versions/2")

    assert (answer.status_code, answer.json()["versions"]) == (200, ["2"])


def test_tritonclient_sees_a_warm_version_as_not_ready(canary_worker, triton_of):
    client = triton_of(canary_worker)

    assert client.is_model_ready("digits", "1")
    assert not client.is_model_ready("digits", "2")


# ---- readiness documents and paths ----------------------------------------------------------


def test_model_ready_names_the_model_and_the_version_asked_about(digits_worker, client):
    model = client.get(digits_worker.url + "/v2/models/digits/ready")
    version = client.get(digits_worker.url + "/v2/models/digits/versions/1/ready")

    assert (model.status_code, model.json()) == (200, {"name": "digits", "ready": True})
    assert (version.status_code, version.json()) == (200, {"name": "digits", "ready": True, "version": "1"})


def test_server_metadata_answers_with_and_without_the_trailing_slash(digits_worker, client):
    bare, slashed = client.get(digits_worker.url + "/v2"), client.get(digits_worker.url + "/v2/")

    assert (slashed.status_code, slashed.json()) == (200, bare.json())
    assert slashed.json()["name"] == "modelops-serving"


# ---- methods --------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", INFER, "POST"),
    ("OPTIONS", INFER, "POST"),
    ("PUT", "/predict", "POST"),
    ("POST", "/v2/health/live", "GET, HEAD"),
    ("OPTIONS", "/v2/models/digits", "GET, HEAD"),
    ("DELETE", "/v2/models/digits/versions/1/ready", "GET, HEAD"),
    ("POST", "/v2/models/digits/config", "GET, HEAD"),
])
def test_every_405_names_the_allowed_methods(digits_worker, client, method, path, allow):
    response = client.request(method, digits_worker.url + path)

    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert "error" in response.json()


GET_PATHS = ["/v2/health/live", "/v2/health/ready", "/v2", "/v2/", "/v2/models/digits", "/v2/models/digits/versions/1",
             "/v2/models/digits/ready", "/v2/models/digits/versions/1/ready", "/v2/models/nope"]


@pytest.mark.parametrize("path", GET_PATHS)
def test_head_answers_like_get_without_the_body(digits_worker, client, path):
    get, head = client.get(digits_worker.url + path), client.head(digits_worker.url + path)

    def comparable(response) -> dict:
        return {name: value for name, value in response.headers.items() if name not in ("date", "x-request-id")}

    assert head.status_code == get.status_code
    assert comparable(head) == comparable(get)
    assert head.headers["content-length"] == str(len(get.content))
    assert head.content == b""


def test_a_head_answer_leaves_a_keep_alive_connection_in_step(digits_worker):
    """Its head alone: a body after it would be read as the start of the next answer."""
    host, port = digits_worker.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\nGET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while answer.count(b"HTTP/1.1 ") < 2 or not answer.endswith(b'{"live":true}'):
            chunk = connection.recv(4096)
            assert chunk, f"closed after {answer[:300]!r}"
            answer += chunk

    head, get = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 ") and b"content-length: 13" in head.lower()
    assert get.startswith(b"HTTP/1.1 200 ") and get.endswith(b"\r\n\r\n" + b'{"live":true}')


# ---- outputs --------------------------------------------------------------------------------


@pytest.mark.parametrize(("parameters", "binary"), [(None, False), ({"binary_data_output": True}, True)])
def test_an_empty_outputs_list_answers_every_output(digits_worker, client, parameters, binary):
    body = {**v2_body(ONE_ROW), "outputs": [], **({"parameters": parameters} if parameters else {})}

    response = client.post(digits_worker.url + INFER, content=orjson.dumps(body))

    assert response.status_code == 200
    header_length = int(response.headers.get("inference-header-content-length", len(response.content)))
    outputs = orjson.loads(response.content[:header_length])["outputs"]
    assert [output["name"] for output in outputs] == ["probabilities"]
    assert ("data" not in outputs[0]) is binary


def test_an_output_asking_for_classification_is_a_400_naming_it(digits_worker, client):
    body = {**v2_body(ONE_ROW), "outputs": [{"name": "probabilities", "parameters": {"classification": 3}}]}

    response = client.post(digits_worker.url + INFER, content=orjson.dumps(body))

    assert response.status_code == 400
    assert response.json() == {"error": "output 'probabilities': parameter \"classification\" is not supported "
                                        "(this server does not implement Triton's classification extension)"}


def test_tritonclients_class_count_is_refused_not_ignored(digits_worker, triton_of):
    tensor = triton.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(ONE_ROW)

    with pytest.raises(InferenceServerException, match='"classification" is not supported'):
        triton_of(digits_worker).infer("digits", [tensor], outputs=[triton.InferRequestedOutput("probabilities", class_count=3)])


def test_unknown_output_parameters_are_still_accepted(digits_worker, client, mlp_v1):
    body = {**v2_body(ONE_ROW), "outputs": [{"name": "probabilities", "parameters": {"my_tag": "x", "binary_data": False}}]}

    response = client.post(digits_worker.url + INFER, content=orjson.dumps(body))

    assert response.status_code == 200
    np.testing.assert_allclose(response.json()["outputs"][0]["data"], ort_reference(mlp_v1[0], ONE_ROW)[0], atol=1e-5)


@pytest.mark.parametrize("parameters", [[], 0, False, ""], ids=["empty list", "zero", "false", "empty string"])
def test_parameters_that_are_no_object_are_a_400_even_when_empty_or_false(digits_worker, client, parameters):
    # Read as `parameters or {}`, these passed as no parameters while "x" was a 400.
    on_request = {**v2_body(ONE_ROW), "parameters": parameters}
    on_output = {**v2_body(ONE_ROW), "outputs": [{"name": "probabilities", "parameters": parameters}]}

    answers = [client.post(digits_worker.url + INFER, content=orjson.dumps(body)) for body in (on_request, on_output)]

    assert [answer.status_code for answer in answers] == [400, 400]
    assert "'parameters' must be an object" in answers[0].json()["error"]
    assert "output 'probabilities': parameters must be an object" in answers[1].json()["error"]


# ---- the binary tensor header ---------------------------------------------------------------


def test_a_zero_inference_header_length_reads_the_whole_body_as_json(digits_worker, client, mlp_v1):
    content = orjson.dumps(v2_body(ONE_ROW))

    response = client.post(digits_worker.url + INFER, content=content, headers={"Inference-Header-Content-Length": "0"})

    assert response.status_code == 200
    np.testing.assert_allclose(response.json()["outputs"][0]["data"], ort_reference(mlp_v1[0], ONE_ROW)[0], atol=1e-5)


def binary_request(rows: np.ndarray) -> bytes:
    header = orjson.dumps({"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32",
                                       "parameters": {"binary_data_size": rows.nbytes}}]})
    return header + rows.tobytes()


@pytest.mark.parametrize("content_type", [None, "application/octet-stream"])
@pytest.mark.parametrize("rows", [np.random.default_rng(1).standard_normal((1, 64), dtype=np.float32),
                                  np.zeros((1, 64), np.float32)], ids=["not UTF-8", "zero bytes"])
def test_binary_data_without_its_header_is_a_400_naming_the_header(digits_worker, client, content_type, rows):
    headers = {"Content-Type": content_type} if content_type else {}

    response = client.post(digits_worker.url + INFER, content=binary_request(rows), headers=headers)

    assert response.status_code == 400
    assert "binary tensor data needs the Inference-Header-Content-Length header" in response.json()["error"]


def test_binary_data_with_a_zero_header_length_says_the_zero_is_what_is_wrong(digits_worker, client):
    rows = np.random.default_rng(1).standard_normal((1, 64), dtype=np.float32)

    response = client.post(digits_worker.url + INFER, content=binary_request(rows), headers={"Inference-Header-Content-Length": "0"})

    assert response.status_code == 400  # it said the header was needed, though it had been sent
    assert "Inference-Header-Content-Length 0 says the body is all JSON" in response.json()["error"]


def test_a_header_length_past_the_json_names_the_json_part_it_marked(digits_worker, client):
    rows = np.random.default_rng(1).standard_normal((1, 64), dtype=np.float32)
    content = binary_request(rows)
    json_length = len(content) - rows.nbytes

    response = client.post(digits_worker.url + INFER, content=content, headers={"Inference-Header-Content-Length": str(json_length + 1)})

    assert response.status_code == 400  # it said only "str is not valid UTF-8"
    assert response.json()["error"].startswith(f"the JSON part of the body (its first {json_length + 1} bytes, Inference-Header-Content-Length)")


def test_octet_stream_that_is_not_json_at_all_names_the_header(digits_worker, client):
    response = client.post(digits_worker.url + INFER, content=ONE_ROW.tobytes(), headers={"Content-Type": "application/octet-stream"})

    assert response.status_code == 400
    assert "Inference-Header-Content-Length" in response.json()["error"]


def test_plain_invalid_json_is_still_called_just_that(digits_worker, client):
    response = client.post(digits_worker.url + INFER, content=b'{"inputs": [oops', headers={"Content-Type": "application/json"})

    assert response.status_code == 400
    assert response.json()["error"].startswith("request body is not valid JSON")
    assert "Inference-Header-Content-Length" not in response.json()["error"]


# ---- headers that only inference reads --------------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/v2/models/digits", "/metrics"])
def test_inference_headers_on_other_requests_are_ignored_not_refused(digits_worker, client, path):
    # A proxy adding a default deadline to every request took the worker out of rotation: its probes were 400s.
    headers = {"X-Request-Timeout-S": "-1", "Inference-Header-Content-Length": "x"}

    assert client.get(digits_worker.url + path, headers=headers).status_code == 200


def test_a_deadline_written_with_an_underscore_is_refused_not_read_as_ten_seconds(digits_worker, client):
    response = client.post(digits_worker.url + INFER, content=orjson.dumps(v2_body(ONE_ROW)), headers={"X-Request-Timeout-S": "1_0"})

    assert response.status_code == 400
    assert response.json()["error"] == "header X-Request-Timeout-S must be a number of seconds"
