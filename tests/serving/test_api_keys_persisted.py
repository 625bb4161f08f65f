"""API keys persisted beside the artifact cache: a worker restarted while the console
cannot answer serves its clients' keys as it serves its persisted routes; a file that is
corrupt, oversized, foreign or tampered with is refused (logged) and no key is valid; the
file holds digests only."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import orjson
import pytest
from serving_testkit import ThreadedWorker, make_config, route, state, v2_body

from serving.api_key_store import FILE_NAME, MAX_FILE_BYTES, ApiKeyStore, PersistedStateRefused, api_keys_signing_key
from serving.api_keys import KEYS_PATH, ApiKeyRefresher, ApiKeyRing, digest
from serving.state_signing import sign_state, signing_key, state_digest

TOKEN = "worker-token-for-tests"
KEY = api_keys_signing_key(TOKEN)
INFER = "/v2/models/digits/infer"
GOOD, OTHER = b"mk_good-key", b"mk_other-key"
BODY = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))


class Console:
    """A real HTTP console answering the worker's state and key fetches (worker token only)."""

    def __init__(self, desired: dict, digests: list[str]):
        self.desired, self.digests = desired, digests
        console = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self.answer(401, {"error": "unauthorized"})
                if self.path == "/api/serving/state":
                    return self.answer(200, console.desired)
                if self.path == KEYS_PATH:
                    return self.answer(200, {"sha256": console.digests})
                return self.answer(404, {"error": "not found"})

            def answer(self, status: int, document: dict) -> None:
                body = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def go_down(self) -> None:
        """Its port closed: every fetch fails to connect, like a console that is down."""
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def console(mlp_v1):
    content = state(3, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}, epoch="epoch-x")
    console = Console({**content, "digest": state_digest(content)}, [digest(GOOD)])
    yield console
    console.go_down()


@pytest.fixture
def lives(tmp_path, console):
    """life() -> a started real worker (SERVING_API_KEYS=required) asking `console`; each
    life shares the one SERVING_CACHE_DIR, like a worker process restarted on its host."""
    started: list[ThreadedWorker] = []
    config = make_config(tmp_path, api_keys="required", worker_token=TOKEN, console_url=console.url, console_timeout_s=2.0)

    def life() -> ThreadedWorker:
        for worker in started:
            worker.stop()
        worker = ThreadedWorker(config, None).start()
        started.append(worker)
        return worker

    yield life
    started[-1].stop()


def first_life_with_the_console_up(lives, console) -> ThreadedWorker:
    worker = lives()
    assert worker.worker.app.api_keys.digests == {digest(GOOD)}
    # What the control plane does after each apply (serving/control.py), so the next life has routes.
    worker.worker.state_store.save(console.desired)
    return worker


def post(worker: ThreadedWorker, key: bytes | None) -> int:
    headers = {} if key is None else {"Authorization": f"Bearer {key.decode()}"}
    return httpx.post(worker.url + INFER, content=BODY, headers=headers, timeout=10).status_code


def test_a_worker_restarted_while_the_console_is_down_serves_the_keys_it_last_fetched(lives, console, caplog):
    first = first_life_with_the_console_up(lives, console)
    assert [post(first, GOOD), post(first, OTHER)] == [200, 401]
    console.go_down()

    caplog.set_level(logging.WARNING)
    second = lives()

    assert second.worker.repository.is_ready  # the persisted routes
    assert second.worker.app.api_keys.digests == {digest(GOOD)}
    assert [post(second, GOOD), post(second, OTHER), post(second, None)] == [200, 401, 401]
    assert any('"serving_persisted_api_keys"' in record.getMessage() for record in caplog.records)


def test_the_file_holds_digests_only_privately_and_no_temporary_file_is_left(lives, console):
    worker = first_life_with_the_console_up(lives, console)
    path = worker.worker.api_key_refresher.store.path

    raw = path.read_bytes()

    assert path.parent == worker.worker.state_store.path.parent  # beside the persisted state, in SERVING_CACHE_DIR
    assert path.name == FILE_NAME
    assert GOOD not in raw
    assert digest(GOOD).encode() in raw
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not [name for name in os.listdir(path.parent) if name.endswith(".tmp")]


@pytest.mark.parametrize(("spoil", "reason"), [
    (lambda path: path.write_bytes(b"{not json"), "is not JSON"),
    (lambda path: path.write_bytes(b" " * (MAX_FILE_BYTES + 1)), f"is larger than {MAX_FILE_BYTES} bytes"),
])
def test_a_corrupt_or_oversized_key_file_is_refused_and_the_worker_starts_with_no_key(lives, console, caplog, spoil, reason):
    first = first_life_with_the_console_up(lives, console)
    spoil(first.worker.api_key_refresher.store.path)
    console.go_down()

    caplog.set_level(logging.WARNING)
    second = lives()

    assert second.worker.repository.is_ready  # the routes still serve
    assert second.worker.app.api_keys.digests == frozenset()
    assert [post(second, GOOD), post(second, None)] == [401, 401]
    refusals = [record.getMessage() for record in caplog.records if '"api_keys_persisted_refused"' in record.getMessage()]
    assert len(refusals) == 1 and reason in refusals[0]


# ---- the store and the refresher -------------------------------------------------------


@pytest.fixture
def store(tmp_path) -> ApiKeyStore:
    return ApiKeyStore(tmp_path / "cache", KEY)


def test_a_saved_set_loads_back(store):
    store.save(frozenset({digest(GOOD), digest(OTHER)}))

    assert store.load() == {digest(GOOD), digest(OTHER)}


def test_no_file_loads_as_no_set(store):
    assert store.load() is None


def signed(document: dict, key: bytes = KEY) -> bytes:
    return orjson.dumps(sign_state(document, key))


@pytest.mark.parametrize(("raw", "reason"), [
    (b"[1, 2]", "does not hold a JSON object"),
    # The persisted state's own file, or anything signed with the state's key: not a key set.
    (signed({"format": "modelops-api-keys-v1", "sha256": []}, signing_key(TOKEN)), "the signature does not match"),
    (signed({"format": "modelops-api-keys-v1", "sha256": []}, api_keys_signing_key("someone-elses-token")), "the signature does not match"),
    (signed({"generation": 1, "models": {}}), "not an API-key file of this worker"),
    (signed({"format": "modelops-api-keys-v1", "sha256": ["ABC" * 20]}), "expected {\"sha256\""),
    (signed({"format": "modelops-api-keys-v1", "sha256": "mk_good-key"}), "expected {\"sha256\""),
])
def test_a_foreign_or_malformed_file_is_refused(store, raw, reason):
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(raw)
    store.path.chmod(0o600)

    with pytest.raises(PersistedStateRefused) as refused:
        store.load()

    assert reason in str(refused.value)


def test_a_digest_added_to_the_file_is_refused_by_the_signature(store):
    store.save(frozenset({digest(GOOD)}))
    document = json.loads(store.path.read_text())
    document["sha256"].append(digest(OTHER))
    document["digest"] = state_digest(document)
    store.path.write_text(json.dumps(document))

    with pytest.raises(PersistedStateRefused, match="the signature does not match"):
        store.load()


def test_a_file_others_can_write_is_refused(store):
    store.save(frozenset({digest(GOOD)}))
    store.path.chmod(0o666)

    with pytest.raises(PersistedStateRefused, match="writable by other users"):
        store.load()


def test_a_linked_file_is_refused(store, tmp_path):
    elsewhere = ApiKeyStore(tmp_path / "elsewhere", KEY)
    elsewhere.save(frozenset({digest(GOOD)}))
    store.path.parent.mkdir(parents=True)
    store.path.symlink_to(elsewhere.path)

    with pytest.raises(PersistedStateRefused, match="symbolic link"):
        store.load()


def refresher(store: ApiKeyStore, answers: list) -> ApiKeyRefresher:
    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer if isinstance(answer, httpx.Response) else httpx.Response(200, json=answer)

    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://console")
    return ApiKeyRefresher(ApiKeyRing("required"), http, "http://console" + KEYS_PATH, interval_s=60, store=store)


def test_the_consoles_set_wins_and_is_persisted_when_it_answers(store):
    store.save(frozenset({digest(GOOD)}))  # what an earlier life fetched
    revoking = refresher(store, [{"sha256": [digest(OTHER)]}])

    async def scenario():
        await revoking.start()
        await revoking.stop()

    asyncio.run(scenario())

    assert revoking.ring.digests == {digest(OTHER)}
    assert store.load() == {digest(OTHER)}  # GOOD, revoked, is not valid at the next restart


def test_a_console_that_cannot_answer_at_start_leaves_the_persisted_set_and_a_later_answer_replaces_it(store):
    store.save(frozenset({digest(GOOD)}))
    request = httpx.Request("GET", "http://console" + KEYS_PATH)
    restarted = refresher(store, [httpx.ConnectError("refused", request=request), httpx.Response(503), {"sha256": []}])

    async def scenario():
        await restarted.start()
        during_outage = [restarted.ring.digests]
        await restarted.refresh()  # still down: the set is kept, the file is not touched
        during_outage.append(restarted.ring.digests)
        await restarted.refresh()  # back, with every key revoked
        await restarted.stop()
        return during_outage

    assert asyncio.run(scenario()) == [{digest(GOOD)}, {digest(GOOD)}]
    assert restarted.ring.digests == frozenset()
    assert store.load() == frozenset()


def test_a_set_that_cannot_be_written_is_logged_and_served_anyway(tmp_path, caplog):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    answering = refresher(ApiKeyStore(blocked, KEY), [{"sha256": [digest(GOOD)]}])

    async def scenario():
        await answering.start()
        await answering.stop()

    asyncio.run(scenario())

    assert answering.ring.digests == {digest(GOOD)}
    assert any('"api_keys_not_persisted"' in record.getMessage() for record in caplog.records)
