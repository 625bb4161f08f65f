"""Fetching the desired state and artifacts: bearer token, sha256 verification, local URLs
(the refusals are in test_serving_control_security.py)."""

from __future__ import annotations

import hashlib
import os
import re

import httpx
import pytest

from serving.console_client import (
    SHOWN_URL_CHARS,
    ArtifactError,
    ArtifactRefused,
    ConsoleClient,
    StateError,
    artifact_location,
    read_state_file,
)

PAYLOAD = b"model bytes"
SHA256 = hashlib.sha256(PAYLOAD).hexdigest()


def console(handler) -> ConsoleClient:
    return ConsoleClient("http://console.test", "s3cret", 2.0, transport=httpx.MockTransport(handler))


def test_fetch_state_sends_the_worker_token():
    seen = []

    def handler(request):
        seen.append((request.url.path, request.headers["authorization"]))
        return httpx.Response(200, json={"generation": 3, "models": {}})

    assert console(handler).fetch_state() == {"generation": 3, "models": {}}
    assert seen == [("/api/serving/state", "Bearer s3cret")]


def test_fetch_state_failure_is_a_state_error():
    with pytest.raises(StateError, match="cannot fetch the serving state"):
        console(lambda request: httpx.Response(503)).fetch_state()


def test_artifact_is_downloaded_verified_and_cached_by_sha256(tmp_path):
    calls = []

    def handler(request):
        calls.append(str(request.url))
        return httpx.Response(200, content=PAYLOAD)

    client = console(handler)
    dest = tmp_path / f"{SHA256}.onnx"

    assert client.fetch_artifact("/api/models/m/versions/1/artifact", SHA256, dest) == dest
    assert client.fetch_artifact("/api/models/m/versions/1/artifact", SHA256, dest) == dest
    assert dest.read_bytes() == PAYLOAD
    assert calls == ["http://console.test/api/models/m/versions/1/artifact"]


def test_artifact_with_the_wrong_sha256_is_refused_and_not_cached(tmp_path):
    dest = tmp_path / f"{'0' * 64}.onnx"

    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        console(lambda request: httpx.Response(200, content=PAYLOAD)).fetch_artifact("/a", "0" * 64, dest)
    assert list(tmp_path.iterdir()) == []



def test_a_refused_download_says_the_console_s_own_words(tmp_path):
    """"Server error '503 Service Unavailable'" left out why: the console's store changed."""
    answer = {"error": "the stored artifact of digits v1 does not match its sha256 0123456789ab…"}

    with pytest.raises(ArtifactError) as refused:
        console(lambda request: httpx.Response(503, json=answer)).fetch_artifact("/a", SHA256, tmp_path / "x")

    assert str(refused.value) == f"cannot download http://console.test/a: 503 {answer['error']}"
    assert list(tmp_path.iterdir()) == []


def test_a_redirect_is_a_refused_download_not_a_sha256_mismatch(tmp_path):
    with pytest.raises(ArtifactError) as refused:
        console(lambda request: httpx.Response(302, headers={"Location": "/elsewhere"}, content=b"moved")).fetch_artifact("/a", SHA256,
                                                                                                                       tmp_path / "x")

    assert str(refused.value) == "cannot download http://console.test/a: 302 Found"


def test_an_artifact_is_asked_for_uncompressed(tmp_path):
    """A 97 KB gzip body took a worker to 291 MB: none is asked for."""
    asked = []
    console(lambda request: asked.append(request.headers["Accept-Encoding"]) or httpx.Response(200, content=PAYLOAD)).fetch_artifact(
        "/a", SHA256, tmp_path / f"{SHA256}.onnx")

    assert asked == ["identity"]


def test_a_refused_download_with_no_json_error_says_the_status(tmp_path):
    with pytest.raises(ArtifactError) as refused:
        console(lambda request: httpx.Response(502, content=b"<html>" * 10_000)).fetch_artifact("/a", SHA256, tmp_path / "x")

    assert str(refused.value) == "cannot download http://console.test/a: 502 Bad Gateway"


def test_a_cached_artifact_swapped_on_disk_is_named_when_it_cannot_be_downloaded_again(tmp_path):
    dest = tmp_path / f"{SHA256}.onnx"
    dest.write_bytes(b"someone else's bytes")

    def console_down(request):
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ArtifactError) as refused:
        console(console_down).fetch_artifact("/a", SHA256, dest)

    assert str(refused.value).startswith(f"the cached copy {dest} does not match sha256 {SHA256[:12]}…, and cannot download")


def test_a_download_never_writes_through_a_link_left_in_the_cache(tmp_path):
    import os

    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    cache = tmp_path / "cache"
    cache.mkdir()
    dest = cache / f"{SHA256}.onnx"
    (cache / f"{dest.name}.{os.getpid()}.part").symlink_to(victim)  # the name downloads used to be written to

    assert console(lambda request: httpx.Response(200, content=PAYLOAD)).fetch_artifact("/a", SHA256, dest) == dest

    assert victim.read_text() == "untouched"
    assert dest.read_bytes() == PAYLOAD and not dest.is_symlink()

def test_local_artifact_urls_are_read_in_place_and_verified_when_allowed(tmp_path):
    source = tmp_path / "model.onnx"
    source.write_bytes(PAYLOAD)
    client = ConsoleClient("http://console.test", "s3cret", 2.0, transport=httpx.MockTransport(lambda request: httpx.Response(500)), allow_local=True)

    assert client.fetch_artifact(f"file://{source}", SHA256, tmp_path / "x") == source
    assert client.fetch_artifact(str(source), SHA256, tmp_path / "x") == source
    with pytest.raises(ArtifactError):
        client.fetch_artifact(str(source), "1" * 64, tmp_path / "x")


def test_a_local_artifact_that_is_not_there_is_said_missing_and_never_asked_of_the_console(tmp_path):
    asked = []
    client = ConsoleClient("http://console.test", "s3cret", 2.0, allow_local=True,
                           transport=httpx.MockTransport(lambda request: asked.append(request.url) or httpx.Response(200, content=PAYLOAD)))
    missing = tmp_path / "gone.onnx"
    # As the worker fetches it: the location its serving plan resolved from the state.
    location = artifact_location(f"file://{missing}", client.base_url, allow_local=True)

    with pytest.raises(ArtifactError, match="cannot read .*gone.onnx"):
        client.fetch_artifact(location, SHA256, tmp_path / "x")
    assert asked == []


def test_a_file_url_naming_another_host_is_refused():
    with pytest.raises(ArtifactRefused, match="names no host but this one"):
        artifact_location("file://otherhost/etc/hostname", "http://console.test", allow_local=True)


def test_a_local_artifact_that_is_a_named_pipe_is_refused_without_blocking(tmp_path):
    pipe = tmp_path / "model.onnx"
    os.mkfifo(pipe)
    client = ConsoleClient("http://console.test", "s3cret", 2.0, allow_local=True, transport=httpx.MockTransport(lambda request: httpx.Response(500)))

    with pytest.raises(ArtifactError, match="not a regular file"):
        client.fetch_artifact(f"file://{pipe}", SHA256, tmp_path / "x")


def test_a_bare_path_with_no_file_there_says_so_beside_the_console_s_answer(tmp_path):
    client = ConsoleClient("http://console.test", "s3cret", 2.0, allow_local=True, transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    missing = tmp_path / "typo.onnx"
    # The message shows the path's first SHOWN_URL_CHARS characters: under pytest-xdist
    # tmp_path is longer (…/popen-gw0/…), and a path of 81 characters was cut.
    shown = str(missing)[:SHOWN_URL_CHARS]

    with pytest.raises(ArtifactError, match=re.escape(f"no local file at {shown}, and as a console path: cannot download")):
        client.fetch_artifact(str(missing), SHA256, tmp_path / "x")


def test_state_file_must_hold_an_object(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("[]")

    with pytest.raises(StateError, match="does not hold a JSON object"):
        read_state_file(path)


# ---- a download that could not be kept is not made again at once ---------------------------


def counting(handler):
    calls = []

    def counted(request):
        calls.append(request.url.path)
        return handler(request)
    return counted, calls


def test_an_artifact_whose_download_could_not_be_kept_is_not_downloaded_again_at_once(tmp_path):
    """A model too large for the cache was downloaded again at every reconcile, 19 times a
    minute: about 380 MB a minute of the console's egress per worker (a fault test, 7 Dec)."""
    handler, calls = counting(lambda request: httpx.Response(200, content=PAYLOAD))
    client = console(handler)
    dest = tmp_path / f"{'0' * 64}.onnx"

    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        client.fetch_artifact("/a", "0" * 64, dest)
    with pytest.raises(ArtifactError) as again:
        client.fetch_artifact("/a", "0" * 64, dest)

    assert calls == ["/a"]
    assert str(again.value).startswith("sha256 mismatch for http://console.test/a: got ")  # the cause first, as the download said it
    assert str(again.value).endswith("; not downloaded again within 3 s of that download")
    assert client.fetch_artifact("/b", SHA256, tmp_path / f"{SHA256}.onnx").read_bytes() == PAYLOAD  # another artifact: unaffected


def test_the_wait_doubles_while_downloads_of_an_artifact_cannot_be_kept_and_starts_over_once_one_is(tmp_path):
    served = {"bytes": b"cut short"}
    handler, calls = counting(lambda request: httpx.Response(200, content=served["bytes"]))
    client, now = console(handler), [100.0]
    client.clock = lambda: now[0]
    dest = tmp_path / f"{SHA256}.onnx"

    def waits() -> str:
        with pytest.raises(ArtifactError) as refused:
            client.fetch_artifact("/a", SHA256, dest)
        return str(refused.value).rsplit("; ", 1)[1]

    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        client.fetch_artifact("/a", SHA256, dest)
    first = waits()
    now[0] += 3.1
    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        client.fetch_artifact("/a", SHA256, dest)
    second = waits()
    now[0] += 6.1
    served["bytes"] = PAYLOAD
    assert client.fetch_artifact("/a", SHA256, dest) == dest
    dest.unlink()
    served["bytes"] = b"cut short again"
    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        client.fetch_artifact("/a", SHA256, dest)

    assert (first, second, waits()) == tuple(f"not downloaded again within {wait_s} s of that download" for wait_s in (3, 6, 3))
    assert len(calls) == 4


@pytest.mark.parametrize("answer", [httpx.Response(503, json={"error": "the store is being repaired"}), httpx.Response(404)])
def test_a_download_the_console_refused_is_tried_again_at_the_next_reconcile(tmp_path, answer):
    # Nothing was fetched: a console that answers again is not waited out.
    handler, calls = counting(lambda request: answer)
    client = console(handler)

    for _ in range(2):
        with pytest.raises(ArtifactError, match="cannot download"):
            client.fetch_artifact("/a", SHA256, tmp_path / "x")

    assert calls == ["/a", "/a"]
