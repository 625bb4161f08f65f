"""Inference API keys on the worker: modes, headers, refusal before the body, refresh from the console."""

from __future__ import annotations

import asyncio
import http.client
import socket

import httpx
import numpy as np
import orjson
import pytest
from django.core.handlers.wsgi import WSGIHandler
from serving_testkit import route, state, v2_body

from serving.api_keys import (
    KEYS_PATH,
    ApiKeyRefresher,
    ApiKeyRing,
    digest,
    parse_digests,
)
from serving.errors import Unauthorized

INFER = "/v2/models/digits/infer"
GOOD, OTHER = b"mk_good-key", b"mk_other-key"
BODY = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))


@pytest.fixture
def keyed_worker(start_worker, mlp_v1):
    """start(mode) -> a worker whose key ring holds GOOD only."""

    def start(mode: str, **overrides):
        worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}), api_keys=mode, **overrides)
        worker.worker.app.api_keys.replace(frozenset({digest(GOOD)}))
        return worker

    return start


def test_required_mode_refuses_a_request_without_a_key_with_401_and_www_authenticate(keyed_worker, client):
    worker = keyed_worker("required")

    response = client.post(worker.url + INFER, content=BODY)

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer realm="modelops-serving"'
    assert "API key is required" in response.json()["error"]


@pytest.mark.parametrize("headers", [{"Authorization": "Bearer mk_good-key"}, {"X-API-Key": "mk_good-key"},
                                     {"authorization": "bearer mk_good-key"}])
def test_required_mode_serves_a_valid_key_in_either_header(keyed_worker, client, headers):
    worker = keyed_worker("required")

    for path, body in ((INFER, BODY), ("/predict", orjson.dumps({"model_name": "digits", "inputs": [0.0] * 64}))):
        response = client.post(worker.url + path, content=body, headers=headers)
        assert response.status_code == 200, response.text


@pytest.mark.parametrize("name", ["X-API-Key", "Authorization"])
def test_a_credential_header_given_twice_is_a_400_whichever_comes_first(keyed_worker, client, name):
    """The worker read the last of two: a gateway in front checking (or counting) the first
    let a key through that it never saw."""
    worker = keyed_worker("required")
    good, bad = ("mk_good-key", "nope") if name == "X-API-Key" else ("Bearer mk_good-key", "Bearer nope")

    answers = [client.post(worker.url + INFER, content=BODY, headers=[(name, first), (name, second)])
               for first, second in ((bad, good), (good, bad))]

    assert [answer.status_code for answer in answers] == [400, 400]
    assert answers[0].json() == {"error": f"header {name} must be given once"}


def test_a_key_with_spaces_after_it_is_the_key(keyed_worker):
    """Optional whitespace is no part of a field's value (RFC 9110 §5.5); sent as a client
    that keeps it sends it (httpx refuses to)."""
    worker = keyed_worker("required")
    connection = http.client.HTTPConnection(worker.url.removeprefix("http://"), timeout=10)

    connection.request("POST", INFER, body=BODY, headers={"X-API-Key": "mk_good-key  ", "Content-Type": "application/json"})

    assert connection.getresponse().status == 200
    connection.close()


@pytest.mark.parametrize("mode", ["required", "optional"])
@pytest.mark.parametrize("headers", [{"Authorization": "Bearer mk_other-key"}, {"X-API-Key": "x" * 10_000},
                                     {"Authorization": "Bearer " + "k" * 300}])
def test_a_wrong_key_is_401_in_both_modes_and_nothing_is_computed(keyed_worker, client, mode, headers):
    worker = keyed_worker(mode)
    version = worker.worker.repository.loaded[("digits", 1)]
    calls, original = [], version.engine.run
    version.engine.run = lambda feeds: calls.append(1) or original(feeds)

    response = client.post(worker.url + INFER, content=BODY, headers=headers)

    assert response.status_code == 401
    assert response.json() == {"error": "the API key is not valid (unknown or revoked)"}
    assert calls == []


def test_optional_mode_serves_requests_without_a_key(keyed_worker, client):
    worker = keyed_worker("optional")

    assert client.post(worker.url + INFER, content=BODY).status_code == 200
    assert client.post(worker.url + INFER, content=BODY, headers={"X-API-Key": "mk_good-key"}).status_code == 200


def test_probes_and_metadata_need_no_key(keyed_worker, client):
    worker = keyed_worker("required")

    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/digits", "/health"):
        assert client.get(worker.url + path).status_code == 200, path


def test_missing_key_is_refused_from_the_headers_before_the_body_arrives(keyed_worker):
    worker = keyed_worker("required", body_timeout_s=30.0)
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n".encode()

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(head)  # and never a byte of the body
        answer = connection.recv(4096)

    assert answer.startswith(b"HTTP/1.1 401 ")


def test_ring_modes():
    ring = ApiKeyRing("required", frozenset({digest(GOOD)}))

    ring.check(None, b"Bearer mk_good-key")
    with pytest.raises(Unauthorized):
        ring.check(None, b"Basic dXNlcjpwdw==")  # not a key of ours: none given
    ApiKeyRing("optional").check(None, b"Basic dXNlcjpwdw==")
    ApiKeyRing("off").check(b"anything", None)
    with pytest.raises(ValueError):
        ApiKeyRing("sometimes")


@pytest.mark.parametrize("document", [[], {"sha256": "abc"}, {"sha256": ["ABC" * 20]}, {"sha256": [1]}, {}])
def test_malformed_key_lists_are_refused(document):
    with pytest.raises(ValueError):
        parse_digests(document)


def refresher_answering(ring: ApiKeyRing, answers: list) -> ApiKeyRefresher:
    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0)
        return answer if isinstance(answer, httpx.Response) else httpx.Response(200, json=answer)

    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://console")
    return ApiKeyRefresher(ring, http, "http://console" + KEYS_PATH, interval_s=0.01)


def test_refresher_keeps_the_last_known_keys_when_the_console_fails():
    ring = ApiKeyRing("required")
    refresher = refresher_answering(ring, [{"sha256": [digest(GOOD)]}, httpx.Response(503), {"sha256": "garbage"},
                                           {"sha256": [digest(OTHER)]}])

    async def scenario():
        outcomes = [await refresher.refresh() for _ in range(3)]
        kept = ring.digests
        outcomes.append(await refresher.refresh())
        return outcomes, kept

    outcomes, kept = asyncio.run(scenario())

    assert outcomes == [True, False, False, True]
    assert kept == {digest(GOOD)}
    assert ring.digests == {digest(OTHER)}


def test_refresher_fetches_at_start_and_then_periodically():
    ring = ApiKeyRing("required")
    answers = [{"sha256": []}, {"sha256": []}, {"sha256": [digest(GOOD)]}] + [{"sha256": [digest(GOOD)]}] * 100
    refresher = refresher_answering(ring, answers)

    async def scenario():
        await refresher.start()
        at_start = ring.digests
        for _ in range(200):
            if ring.digests:
                break
            await asyncio.sleep(0.01)
        await refresher.stop()
        return at_start

    assert asyncio.run(scenario()) == frozenset()
    assert ring.digests == {digest(GOOD)}


@pytest.mark.django_db(transaction=True)
def test_key_created_in_the_console_is_accepted_by_a_refreshed_worker_until_revoked(keyed_worker, client, settings):
    from registry.actions import api_keys

    worker = keyed_worker("required")
    key_row, key = api_keys.create_key("end to end")
    console = httpx.Client(transport=httpx.WSGITransport(app=WSGIHandler()),
                           headers={"Authorization": f"Bearer {settings.SERVING_WORKER_TOKEN}"})
    refresher = ApiKeyRefresher(worker.worker.app.api_keys, console, "http://testserver" + KEYS_PATH, interval_s=60)

    def refresh() -> bool:
        return asyncio.run_coroutine_threadsafe(refresher.refresh(), worker.loop).result(timeout=10)

    assert refresh() is True
    accepted = client.post(worker.url + INFER, content=BODY, headers={"Authorization": f"Bearer {key}"})
    wrong = client.post(worker.url + INFER, content=BODY, headers={"Authorization": f"Bearer {key}x"})
    old_good = client.post(worker.url + INFER, content=BODY, headers={"X-API-Key": GOOD.decode()})
    api_keys.revoke_key(key_row)
    assert refresh() is True
    revoked = client.post(worker.url + INFER, content=BODY, headers={"Authorization": f"Bearer {key}"})

    assert [accepted.status_code, wrong.status_code, old_good.status_code, revoked.status_code] == [200, 401, 401, 401]
