"""Compressed request bodies (Content-Encoding gzip or deflate, as tritonclient's
`request_compression_algorithm` sends them) are served, and never inflated past the
body limit: a decompression bomb is a prompt 413 that leaves the worker's memory as it was."""

from __future__ import annotations

import gzip
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from serving_testkit import SubprocessWorker, ort_reference, route, state, v2_body, write_state

INFER = "/v2/models/digits/infer"
ROWS = np.random.default_rng(7).standard_normal((3, 64), dtype=np.float32)
BOMB_BYTES = 1 << 30  # what the bomb inflates to
BOMB_LIMIT_BYTES = 2 * 1024 * 1024  # the bomb worker's SERVING_MAX_BODY_BYTES: the compressed bomb (~1 MB) fits


def compressed(body: bytes, coding: str) -> bytes:
    return gzip.compress(body) if coding == "gzip" else zlib.compress(body)


def zeros_bomb(coding: str, size: int = BOMB_BYTES) -> bytes:
    """`size` zero bytes, compressed (about 1,000:1) in a fraction of a second: every MiB
    ends in a full flush, so each compresses to the same bytes, written once and repeated."""
    mebibyte = bytes(1 << 20)
    deflater = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = deflater.compress(mebibyte) + deflater.flush(zlib.Z_FULL_FLUSH)
    assert deflater.compress(mebibyte) + deflater.flush(zlib.Z_FULL_FLUSH) == block
    raw = block * (size >> 20) + deflater.flush()
    if coding == "gzip":
        crc = 0
        for _ in range(size >> 20):
            crc = zlib.crc32(mebibyte, crc)
        return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + raw + struct.pack("<II", crc, size & 0xFFFFFFFF)
    adler = 1
    for _ in range(size >> 20):
        adler = zlib.adler32(mebibyte, adler)
    return b"\x78\xda" + raw + struct.pack(">I", adler)


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def bomb_worker(tmp_path_factory, relu_model):
    """A worker in its own process, so its peak memory is its own. Its model takes any
    width (a dynamic dimension): its bodies are held to SERVING_MAX_BODY_BYTES alone, not
    to a smaller bound of the version's."""
    tmp_path = tmp_path_factory.mktemp("bomb")
    state_file = write_state(tmp_path / "state.json", state(1, {"digits": {"routes": [route(1, 100, *relu_model)]}}))
    worker = SubprocessWorker(state_file, tmp_path, SERVING_MAX_BODY_BYTES=str(BOMB_LIMIT_BYTES)).wait_ready()
    yield worker
    worker.stop()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_compressed_v2_body_is_inflated_and_served(digits_worker, client, mlp_v1, coding):
    content = compressed(orjson.dumps(v2_body(ROWS)), coding)

    response = client.post(digits_worker.url + INFER, content=content, headers={"Content-Encoding": coding})

    assert response.status_code == 200
    output = np.array(response.json()["outputs"][0]["data"], np.float32).reshape(3, 10)
    np.testing.assert_allclose(output, ort_reference(mlp_v1[0], ROWS), atol=1e-5)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_tritonclient_request_compression_is_served_with_binary_tensors(digits_worker, mlp_v1, coding):
    connection = triton.InferenceServerClient(digits_worker.url.removeprefix("http://"))
    tensor = triton.InferInput("input", list(ROWS.shape), "FP32")
    tensor.set_data_from_numpy(ROWS)
    try:
        result = connection.infer("digits", [tensor], request_compression_algorithm=coding)
    finally:
        connection.close()

    np.testing.assert_allclose(result.as_numpy("probabilities"), ort_reference(mlp_v1[0], ROWS), atol=1e-5)


def test_a_compressed_predict_body_is_served(digits_worker, client, mlp_v1):
    content = gzip.compress(orjson.dumps({"model_name": "digits", "inputs": ROWS[0].tolist()}))

    response = client.post(digits_worker.url + "/predict", content=content, headers={"Content-Encoding": "GZIP"})

    assert response.status_code == 200
    np.testing.assert_allclose(response.json()["outputs"]["probabilities"], ort_reference(mlp_v1[0], ROWS[:1])[0], atol=1e-5)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_decompression_bomb_is_a_prompt_413_and_the_worker_does_not_inflate_it(bomb_worker, client, coding):
    bomb = zeros_bomb(coding)
    assert len(bomb) < BOMB_LIMIT_BYTES  # the compressed body itself is within the limit
    before = peak_rss_bytes(bomb_worker.process.pid)

    started = time.monotonic()
    response = client.post(bomb_worker.url + INFER, content=bomb, headers={"Content-Encoding": coding})
    elapsed_s = time.monotonic() - started

    assert response.status_code == 413
    assert response.json() == {"error": f"body inflated ({coding}) exceeds the limit of {BOMB_LIMIT_BYTES} bytes"}
    assert elapsed_s < 3
    assert peak_rss_bytes(bomb_worker.process.pid) - before < 64 * 1024 * 1024  # not the gigabyte it claims
    assert client.get(bomb_worker.url + "/v2/health/ready").status_code == 200


def test_a_body_that_inflates_past_the_limit_on_predict_is_a_413(digits_worker, client):
    content = gzip.compress(b" " * (1024 * 1024 + 1))  # past the test worker's 1 MiB, and past what digits takes

    response = client.post(digits_worker.url + "/predict", content=content, headers={"Content-Encoding": "gzip"})

    assert response.status_code == 413
    assert "body inflated (gzip) is too large: no model this worker serves takes more" in response.json()["error"]


@pytest.mark.parametrize("coding", ["br", "compress", "gzip, br", "x" * 500], ids=["br", "compress", "two codings", "long"])
def test_an_unsupported_content_coding_is_a_415_naming_the_supported_ones(digits_worker, client, coding):
    response = client.post(digits_worker.url + INFER, content=b"{}", headers={"Content-Encoding": coding})

    assert response.status_code == 415
    assert "is not supported: send gzip, deflate or identity" in response.json()["error"]
    assert response.headers["accept-encoding"] == "gzip, deflate, identity"
    assert len(response.content) < 250


@pytest.mark.parametrize(("content", "error"), [
    pytest.param(b'{"inputs": []}', "body is not valid gzip data (Content-Encoding: gzip)", id="not gzip"),
    pytest.param(gzip.compress(orjson.dumps(v2_body(ROWS)))[:-12], "body ends before its gzip data does (Content-Encoding: gzip)",
                 id="cut short"),
    pytest.param(gzip.compress(b"{}") + b"junk", "body has bytes after the end of its gzip data (Content-Encoding: gzip)",
                 id="bytes after"),
    pytest.param(b"", "body ends before its gzip data does (Content-Encoding: gzip)", id="empty"),
])
def test_a_body_that_is_not_what_its_coding_says_is_a_400(digits_worker, client, content, error):
    response = client.post(digits_worker.url + INFER, content=content, headers={"Content-Encoding": "gzip"})

    assert response.status_code == 400
    assert response.json()["error"].startswith(error)


def test_identity_coding_is_the_body_as_it_is(digits_worker, client):
    response = client.post(digits_worker.url + INFER, json=v2_body(ROWS), headers={"Content-Encoding": "identity"})

    assert response.status_code == 200
