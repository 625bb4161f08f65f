"""BYTES (string) outputs in binary form follow Triton's layout: per element, in row-major
order, a 4-byte little-endian length and then the element's UTF-8 bytes; never the
object array's memory (heap pointers). Read back as tritonclient reads them."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper
from serving_testkit import route, state, write_model
from tritonclient.utils import deserialize_bytes_tensor

from tests.fixtures.onnx_files import float_batch, make_model

WORDS = ["zéro", "", "二", "four"]  # multi-byte UTF-8, an empty element, plain ASCII
ROWS = np.array([[0, 1], [2, 3]], np.float32)
WORD_BYTES = [word.encode() for word in WORDS]
TEXT_BYTES = [b"0", b"1", b"2", b"3"]  # ONNX Runtime's Cast of those floats to STRING


def build_words_model():
    """input [batch, 2] FP32 -> word: WORDS[input] (Gather), text: Cast to STRING, echo: the input."""
    table = helper.make_tensor("words", TensorProto.STRING, [len(WORDS)], WORD_BYTES)
    nodes = [helper.make_node("Cast", ["input"], ["index"], to=TensorProto.INT64),
             helper.make_node("Gather", ["words", "index"], ["word"], axis=0),
             helper.make_node("Cast", ["input"], ["text"], to=TensorProto.STRING),
             helper.make_node("Identity", ["input"], ["echo"])]
    strings = [helper.make_tensor_value_info(name, TensorProto.STRING, ["batch", 2]) for name in ("word", "text")]
    return make_model(nodes, [float_batch("input", 2)], [*strings, float_batch("echo", 2)], initializers=[table])


@pytest.fixture
def words_worker(start_worker, model_dir):
    model = write_model(model_dir, "words", build_words_model())
    return start_worker(state(1, {"words": {"routes": [route(1, 100, *model)]}}))


@pytest.fixture
def triton_client(words_worker):
    connection = triton.InferenceServerClient(words_worker.url.removeprefix("http://"))
    yield connection
    connection.close()


def infer_binary(client, worker, outputs=None, parameters=None):
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 2], "data": ROWS.ravel().tolist()}]}
    if outputs is not None:
        body["outputs"] = outputs
    if parameters is not None:
        body["parameters"] = parameters
    return client.post(worker.url + "/v2/models/words/infer", content=orjson.dumps(body))


def split(response) -> tuple[list, dict[str, bytes]]:
    """(output entries, binary part of each by name) of a binary answer."""
    header_length = int(response.headers["inference-header-content-length"])
    entries = orjson.loads(response.content[:header_length])["outputs"]
    blobs, offset = {}, header_length
    for entry in entries:
        if "data" in entry:
            continue
        size = entry["parameters"]["binary_data_size"]
        blobs[entry["name"]] = response.content[offset:offset + size]
        offset += size
    assert offset == len(response.content)  # nothing after the tensors the header declares
    return entries, blobs


def length_prefixed(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(element)) + element for element in elements)


def test_binary_data_output_sends_each_string_length_prefixed_not_the_object_pointers(words_worker, client):
    response = infer_binary(client, words_worker, parameters={"binary_data_output": True})

    assert response.status_code == 200
    entries, blobs = split(response)
    assert [(entry["name"], entry["datatype"], entry["shape"]) for entry in entries] == [
        ("word", "BYTES", [2, 2]), ("text", "BYTES", [2, 2]), ("echo", "FP32", [2, 2])]
    assert blobs["word"] == length_prefixed(WORD_BYTES)
    assert entries[0]["parameters"]["binary_data_size"] == sum(4 + len(word) for word in WORD_BYTES)
    assert blobs["text"] == length_prefixed(TEXT_BYTES)
    assert np.frombuffer(blobs["echo"], np.float32).tolist() == ROWS.ravel().tolist()  # offsets after BYTES hold


def test_a_per_output_binary_bytes_tensor_decodes_with_tritonclients_deserializer(words_worker, client):
    response = infer_binary(client, words_worker, outputs=[{"name": "word", "parameters": {"binary_data": True}},
                                                           {"name": "text", "parameters": {"binary_data": False}}])

    assert response.status_code == 200
    entries, blobs = split(response)
    assert deserialize_bytes_tensor(blobs["word"]).tolist() == WORD_BYTES
    assert entries[1]["data"] == ["0", "1", "2", "3"]  # in JSON, strings


# tritonclient reads a binary BYTES tensor as bytes and a JSON one as the strings it holds (as from Triton).
@pytest.mark.parametrize(("binary_data", "expected"), [(True, WORD_BYTES), (False, WORDS)])
def test_tritonclient_reads_string_outputs_as_the_model_made_them(triton_client, binary_data, expected):
    tensor = triton.InferInput("input", [2, 2], "FP32")
    tensor.set_data_from_numpy(ROWS)
    outputs = [triton.InferRequestedOutput("word", binary_data=binary_data), triton.InferRequestedOutput("echo")]

    result = triton_client.infer("words", [tensor], outputs=outputs)

    assert result.as_numpy("word").tolist() == [expected[:2], expected[2:]]
    assert result.as_numpy("echo").tolist() == ROWS.tolist()
