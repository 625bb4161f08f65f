"""The worker trusts only the console: signed pushes, the console's own origin for
artifacts and the bearer token, and the console's state whenever its digest differs
(a generation counter that went backwards must not freeze the worker)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time

import httpx
import pytest
from serving_testkit import make_config, state

from serving.console_client import ArtifactError, ArtifactRefused, ConsoleClient, artifact_location
from serving.contract import CONTRACT_VERSION, WORKER_KEY_HEADER, ContractError
from serving.control import Applied, ControlPlane
from serving.serving_plan import parse_state
from serving.state_signing import push_signing_key, sign_push, state_digest
from serving.worker import Worker
from tests.fixtures.push_key import CONSOLE_PUSH_KEY, PUSH_KEY_HEADERS, signed_push
from tests.fixtures.recording_host import RecordingHost

TOKEN = "worker-token-for-tests"
CONSOLE = "http://console.test:8000"
PAYLOAD = b"model bytes"
SHA256 = hashlib.sha256(PAYLOAD).hexdigest()


class FakeConsole:
    """The console's worker endpoints, in memory: serves ``state``, keeps acks and reports."""

    def __init__(self):
        self.state: dict = content(0, "epoch-x")
        self.acks: list[dict] = []
        self.reports: list[dict] = []
        self.worker_keys: list[str | None] = []  # the key each ack and report came with
        self.state_reads = 0
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        if request.url.path != "/api/serving/state":
            self.worker_keys.append(request.headers.get(WORKER_KEY_HEADER))
        if request.url.path == "/api/serving/state":
            self.state_reads += 1
            return httpx.Response(200, json=self.state, headers=PUSH_KEY_HEADERS)
        body = json.loads(request.content)
        {"/api/serving/acks": self.acks, "/api/serving/reports": self.reports}[request.url.path].append(body)
        return httpx.Response(204)


def content(generation: int, epoch: str, models: dict | None = None) -> dict:
    return state(generation, models or {}, epoch=epoch)


def signed(state: dict, console_secret: str | None = None) -> dict:
    """``state`` signed as this console pushes it, or as one with another secret would."""
    return signed_push(state) if console_secret is None else sign_push(state, push_signing_key(console_secret))


@pytest.fixture
def foreign_host():
    host = RecordingHost(PAYLOAD)
    yield host
    host.close()


@pytest.fixture
def console() -> FakeConsole:
    return FakeConsole()


@pytest.fixture
async def control(tmp_path, console):
    """A real worker (repository, no HTTP server) with its control plane on the fake console."""
    worker = Worker(make_config(tmp_path, worker_token=TOKEN, console_url=CONSOLE, allow_local_artifacts=False))
    plane = ControlPlane(worker, redis_url="", public_url="http://127.0.0.1:1", transport=console.transport)
    await plane.start(run_loops=False)
    yield plane
    await plane.stop()
    await worker.close()


async def serve(control: ControlPlane, console: FakeConsole, generation: int, epoch: str) -> None:
    console.state = content(generation, epoch)
    await control.reconcile()
    assert control.applied.generation == generation


# ---- pushes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("push", "reason"),
    [
        (content(10**18, "epoch-x"), "the state is not signed"),
        (signed(content(10**18, "epoch-x"), console_secret="another-consoles-secret"), "the signature does not match"),
        ({**signed(content(51, "epoch-x")), "generation": 10**18}, "the signature does not match"),
        ({**content(10**18, "epoch-x"), "signature": "not hex"}, "the signature is not 128 lowercase hex characters"),
        ("not a state", "the state is not an object"),
    ],
)
async def test_forged_push_changes_nothing_is_logged_once_and_does_not_freeze_the_worker(control, console, caplog, push, reason):
    await serve(control, console, 50, "epoch-x")
    acks_before = len(console.acks)

    with caplog.at_level(logging.WARNING, logger="serving.control"):
        assert await control.receive_push(push) is None

    assert control.worker.repository.generation == 50
    assert len(console.acks) == acks_before
    refusals = [record.getMessage() for record in caplog.records if "push_refused" in record.getMessage()]
    assert len(refusals) == 1 and reason in refusals[0]
    assert "models" not in refusals[0]  # the reason, never the payload
    # Not frozen: the console's next signed push still applies.
    assert (await control.receive_push(signed(content(51, "epoch-x"))))["ok"] is True
    assert control.worker.repository.generation == 51


@pytest.mark.parametrize("push", [content(10**18, "epoch-x"), signed(content(51, "epoch-x"), console_secret="another-consoles-secret"),
                                  {**signed(content(51, "epoch-x")), "generation": 10**18}])
async def test_a_forged_push_makes_the_worker_ask_the_console_nothing(control, console, push):
    # Dropped, not followed by a reconcile: anyone who can publish on Redis would otherwise
    # make every worker read the console's state once per forged message.
    await serve(control, console, 50, "epoch-x")
    reads = console.state_reads

    assert await control.receive_push(push) is None

    assert console.state_reads == reads


async def test_signed_push_is_applied_and_acked_with_its_digest(control, console):
    await serve(control, console, 1, "epoch-x")
    push = signed(content(2, "epoch-x"))

    result = await control.receive_push(push)

    assert result["ok"] is True
    assert control.applied == Applied(2, "epoch-x", push["digest"])
    assert console.acks[-1] | {"load_ms": 0} == {"worker": control.identity.id, "generation": 2, "digest": push["digest"], "epoch": "epoch-x",
                                                 "ok": True, "load_ms": 0, "contract": CONTRACT_VERSION}
    assert console.acks[-1]["load_ms"] == result["load_ms"]  # how long the apply took, as the worker measured it


async def test_a_push_the_console_signed_too_long_ago_makes_the_worker_ask_the_console_instead(control, console, caplog):
    from serving.state_signing import PUSH_VALID_S

    await serve(control, console, 1, "epoch-x")
    replayed = sign_push(content(2, "epoch-x", {"digits": {"routes": []}}), CONSOLE_PUSH_KEY, signed_at=time.time() - PUSH_VALID_S - 5)

    with caplog.at_level(logging.WARNING, logger="serving.control"):
        await control.receive_push(replayed)

    assert control.applied == Applied(1, "epoch-x", state_digest(console.state))  # the console's word: still generation 1
    assert any("push_expired" in record.getMessage() for record in caplog.records)


async def test_an_older_signed_push_in_the_same_epoch_is_ignored(control, console):
    await serve(control, console, 5, "epoch-x")
    acks_before = len(console.acks)

    assert await control.receive_push(signed(content(4, "epoch-x"))) is None

    assert control.worker.repository.generation == 5
    assert len(console.acks) == acks_before


async def test_a_signed_push_of_the_applied_generation_with_other_content_makes_the_worker_ask_the_console(control, console):
    torn = content(5, "epoch-x")  # what a torn read once answered as generation 5
    await serve(control, console, 5, "epoch-x")
    real = content(5, "epoch-x", {"digits": {"routes": []}})
    console.state = real

    result = await control.receive_push(signed(real))

    assert result["ok"] is True
    assert control.applied == Applied(5, "epoch-x", state_digest(real))
    assert state_digest(real) != state_digest(torn)
    assert console.acks[-1]["digest"] == state_digest(real)


async def test_of_a_push_and_the_console_disagreeing_on_the_applied_generation_the_console_wins(control, console):
    """Another content under the generation applied: the push is not taken as the truth
    either, the console is asked, and its answer is what the worker applies and acks."""
    await serve(control, console, 5, "epoch-x")
    answer = content(5, "epoch-x", {"digits": {"routes": []}})
    console.state = answer
    other = content(5, "epoch-x", {"other": {"routes": []}})

    result = await control.receive_push(signed(other))

    assert result["ok"] is True
    assert control.applied == Applied(5, "epoch-x", state_digest(answer))
    assert console.acks[-1]["digest"] == state_digest(answer)


async def test_a_push_of_what_is_applied_is_ignored_without_asking_the_console(control, console):
    await serve(control, console, 5, "epoch-x")
    reads, acks = console.state_reads, len(console.acks)

    assert await control.receive_push(signed(content(5, "epoch-x"))) is None

    assert (console.state_reads, len(console.acks)) == (reads, acks)


async def test_push_from_another_epoch_adopts_the_consoles_state_even_at_a_lower_generation(control, console):
    await serve(control, console, 50, "epoch-x")
    console.state = content(3, "epoch-y")

    result = await control.receive_push(signed(content(3, "epoch-y")))

    assert result["ok"] is True
    assert control.worker.repository.generation == 3
    assert control.applied == Applied(3, "epoch-y", state_digest(console.state))


async def test_a_replayed_push_from_another_epoch_is_checked_against_the_console_and_changes_nothing(control, console):
    await serve(control, console, 50, "epoch-x")
    acks_before = len(console.acks)

    assert await control.receive_push(signed(content(99, "old-epoch"))) is None

    assert control.worker.repository.generation == 50
    assert len(console.acks) == acks_before


# ---- reconcile: the generation counter going backwards --------------------------------


async def test_reconcile_adopts_generation_3_of_a_new_epoch_after_generation_50(control, console):
    await serve(control, console, 50, "epoch-x")

    await serve(control, console, 3, "epoch-y")

    assert control.worker.repository.generation == 3
    assert console.acks[-1]["generation"] == 3
    assert console.acks[-1]["digest"] == state_digest(content(3, "epoch-y"))


async def test_reconcile_adopts_a_lower_generation_of_the_same_epoch_after_a_database_restore(control, console):
    await serve(control, console, 50, "epoch-x")

    await serve(control, console, 3, "epoch-x")

    assert control.applied == Applied(3, "epoch-x", state_digest(content(3, "epoch-x")))


async def test_reconcile_of_an_unchanged_state_applies_and_acks_nothing(control, console):
    await serve(control, console, 7, "epoch-x")
    acks_before = len(console.acks)

    assert await control.reconcile() is None

    assert len(console.acks) == acks_before


async def test_fetched_state_whose_digest_does_not_match_its_content_is_refused(control, console, caplog):
    await serve(control, console, 7, "epoch-x")
    console.state = {**content(8, "epoch-x"), "digest": "0" * 64}

    with caplog.at_level(logging.WARNING, logger="serving.control"):
        assert await control.reconcile() is None

    assert control.worker.repository.generation == 7
    assert any("the digest does not match the content" in record.getMessage() for record in caplog.records)


async def test_the_first_ack_follows_a_report_and_reports_carry_the_served_digest_and_epoch(control, console):
    await serve(control, console, 4, "epoch-x")

    assert console.reports and console.reports[0]["worker"]["id"] == control.identity.id
    await control.send_report()
    assert (console.reports[-1]["generation"], console.reports[-1]["digest"], console.reports[-1]["epoch"]) == (
        4, state_digest(content(4, "epoch-x")), "epoch-x")


async def test_every_report_and_ack_carries_this_workers_own_key(control, console):
    await serve(control, console, 4, "epoch-x")
    await control.send_report()

    assert console.acks and len(console.reports) >= 2
    assert len(set(console.worker_keys)) == 1 and len(console.worker_keys[0]) >= 40


# ---- artifacts: the console's origin only ---------------------------------------------


def route(url: str, sha256: str = SHA256) -> dict:
    return {"version": 1, "weight": 100, "sha256": sha256, "artifact_url": url, "signature": {}}


async def test_state_naming_a_foreign_artifact_host_is_refused_and_no_request_reaches_it(control, console, foreign_host):
    await serve(control, console, 1, "epoch-x")
    console.state = content(2, "epoch-x", {"digits": {"routes": [route(f"{foreign_host.url}/model.onnx")]}})

    result = await control.reconcile()

    assert result["ok"] is False
    assert "is not on the console's origin http://console.test:8000" in result["error"]
    assert console.acks[-1]["ok"] is False and console.acks[-1]["error"] == result["error"]
    assert control.worker.repository.generation == 1
    assert foreign_host.received == []


@pytest.mark.parametrize(
    "url",
    ["http://console.test:8001/a", "https://console.test:8000/a", "http://evil.test:8000/a", "//evil.test/a",
     "http://console.test:8000@evil.test/a", "ftp://console.test:8000/a", "file:///etc/passwd"],
)
def test_artifact_urls_off_the_consoles_origin_are_refused(url):
    with pytest.raises(ArtifactRefused):
        artifact_location(url, CONSOLE, allow_local=False)


@pytest.mark.parametrize(
    ("url", "location"),
    [("/api/models/m/versions/1/artifact", f"{CONSOLE}/api/models/m/versions/1/artifact"),
     ("api/x", f"{CONSOLE}/api/x"), (f"{CONSOLE}/api/x", f"{CONSOLE}/api/x"), ("HTTP://Console.Test:8000/api/x", "HTTP://Console.Test:8000/api/x")],
)
def test_artifact_urls_on_the_consoles_origin_are_kept_absolute(url, location):
    assert artifact_location(url, CONSOLE, allow_local=False) == location


def test_a_foreign_artifact_url_is_refused_before_any_request(tmp_path, foreign_host):
    client = ConsoleClient(CONSOLE, TOKEN, 2.0)

    with pytest.raises(ArtifactRefused, match="not on the console's origin"):
        client.fetch_artifact(f"{foreign_host.url}/model.onnx", SHA256, tmp_path / "m.onnx")

    assert foreign_host.received == []


def test_a_redirect_off_the_console_is_not_followed_and_the_token_stays_home(tmp_path, foreign_host):
    console = httpx.MockTransport(lambda request: httpx.Response(302, headers={"Location": f"{foreign_host.url}/model.onnx"}))
    client = ConsoleClient(CONSOLE, TOKEN, 2.0, transport=console)

    with pytest.raises(ArtifactError, match="302"):
        client.fetch_artifact("/api/models/m/versions/1/artifact", SHA256, tmp_path / "m.onnx")

    assert foreign_host.received == []
    assert list(tmp_path.iterdir()) == []


def test_the_console_client_sends_no_request_to_another_origin(foreign_host):
    client = ConsoleClient(CONSOLE, TOKEN, 2.0)

    with pytest.raises(httpx.RequestError, match="not the console"):
        client._http.get(f"{foreign_host.url}/anything")

    assert foreign_host.received == []


def test_local_artifacts_are_refused_unless_the_development_setting_allows_them(tmp_path):
    source = tmp_path / "model.onnx"
    source.write_bytes(PAYLOAD)
    client = ConsoleClient(CONSOLE, TOKEN, 2.0, transport=httpx.MockTransport(lambda request: httpx.Response(500)))

    for url in (f"file://{source}", str(source)):
        with pytest.raises(ArtifactRefused, match="SERVING_ALLOW_LOCAL_ARTIFACTS"):
            client.fetch_artifact(url, SHA256, tmp_path / "copy.onnx")
    assert not (tmp_path / "copy.onnx").exists()


def test_state_file_mode_allows_local_artifacts(tmp_path):
    worker = Worker(make_config(tmp_path, allow_local_artifacts=False), state_file=tmp_path / "state.json")

    assert worker.config.allow_local_artifacts is True
    assert worker.console.allow_local is True


@pytest.mark.parametrize("sha256", [SHA256.upper(), SHA256[:63], SHA256 + "0", "g" * 64, 64])
def test_a_sha256_that_is_not_64_lowercase_hex_makes_the_state_invalid(tmp_path, sha256):
    state = content(1, "e", {"digits": {"routes": [route("/api/models/digits/versions/1/artifact", sha256)]}})

    with pytest.raises(ContractError, match=r"^models\.digits\.routes\[0\]\.sha256: must be 64 lowercase hex"):
        parse_state(state, make_config(tmp_path, console_url=CONSOLE))


def test_a_local_path_in_a_pushed_state_is_refused_by_default(tmp_path):
    source = tmp_path / "model.onnx"
    source.write_bytes(PAYLOAD)
    state = content(1, "e", {"digits": {"routes": [route(f"file://{source}")]}})

    with pytest.raises(ContractError, match=r"^models\.digits\.routes\[0\]\.artifact_url: .*SERVING_ALLOW_LOCAL_ARTIFACTS"):
        parse_state(state, make_config(tmp_path, console_url=CONSOLE, allow_local_artifacts=False))


# ---- the push channel, on a Redis of this test ------------------------------------------




async def test_the_worker_channel_takes_only_messages_for_it_and_keeps_nothing_else(redis_server):
    # channels_redis kept every message read from the worker's key for whichever local
    # channel it named, or none, up to 100 per name and never read: 150 messages of 4 MB
    # naming made-up channels held 1.4 GB; one that was not msgpack dropped the channel.
    import time

    import msgpack
    import redis.asyncio as redis
    from channels_redis.core import RedisChannelLayer

    from serving.control_channel import MAX_MESSAGE_BYTES, WorkerChannelLayer

    layer = WorkerChannelLayer(hosts=[redis_server.url], prefix="modelops")
    intruder = RedisChannelLayer(hosts=[redis_server.url], prefix="modelops", capacity=1000)
    own = await layer.new_channel(prefix="serving-worker.")
    shared_part = own[: own.index("!") + 1]  # the worker's Redis key holds every channel named so
    raw = redis.from_url(redis_server.url)
    try:
        for index in range(150):
            await intruder.send(f"{shared_part}made-up-{index}", {"type": "serving.apply", "blob": "x" * 1000})
        prefix = b"\0" * 12  # channels_redis's random prefix, which it strips
        junk = [intruder.serialize({"type": "serving.apply"}), prefix + b"\xc1 not msgpack", prefix + msgpack.packb({1: 2}),
                prefix + msgpack.packb([1, 2]), intruder.serialize({"type": "serving.apply", "__asgi_channel__": own,
                                                                    "blob": b"x" * MAX_MESSAGE_BYTES}),
                prefix + msgpack.packb({"__asgi_channel__": [[]] * 200_000})]  # small, yet 200,000 objects to build
        await raw.zadd(f"modelops{shared_part}", {message: time.time() + offset / 1000 for offset, message in enumerate(junk)})
        await asyncio.sleep(0.01)
        await intruder.send(own, {"type": "serving.apply", "state": {"from": "the console"}})

        message = await asyncio.wait_for(layer.receive(own), timeout=10)

        assert message == {"type": "serving.apply", "state": {"from": "the console"}}
        assert layer.dropped == 156
        assert not any(layer.receive_buffer.values())  # nothing kept for anyone
    finally:
        await raw.aclose()
        await intruder.close_pools()
        await layer.close_pools()


async def test_a_worker_joined_for_longer_than_the_group_expiry_still_hears_pushes(tmp_path, console, redis_server):
    """channels_redis drops members older than the group expiry at the console's next send
    (a day by default; two seconds on both sides here): the worker joins again before."""
    from channels_redis.core import RedisChannelLayer

    worker = Worker(make_config(tmp_path, worker_token=TOKEN, console_url=CONSOLE, allow_local_artifacts=False))
    plane = ControlPlane(worker, redis_url=redis_server.url, public_url="http://127.0.0.1:1", transport=console.transport,
                         reconcile_interval_s=3600.0)
    plane.group_expiry_s = 2.0
    console_layer = RedisChannelLayer(hosts=[redis_server.url], prefix="modelops", group_expiry=2)
    await plane.start()
    try:
        await asyncio.sleep(3.0)  # past the expiry since the first join
        push = signed(content(7, "epoch-x"))
        await console_layer.group_send("serving", {"type": "serving.apply", "state": push})

        for _ in range(50):
            if plane.applied.generation == 7:
                break
            await asyncio.sleep(0.1)
        assert plane.applied == Applied(7, "epoch-x", push["digest"])
    finally:
        await console_layer.close_pools()
        await plane.stop()
        await worker.close()


async def test_a_reconcile_that_fails_unexpectedly_is_logged_and_the_next_one_still_runs(tmp_path, console, caplog, monkeypatch):
    worker = Worker(make_config(tmp_path, worker_token=TOKEN, console_url=CONSOLE, allow_local_artifacts=False))
    plane = ControlPlane(worker, redis_url="", public_url="http://127.0.0.1:1", reconcile_interval_s=0.05,
                         transport=httpx.MockTransport(lambda request: console.handle(request)))
    answer = console.handle

    def broken(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/serving/state":
            raise RuntimeError("a bug nobody foresaw")
        return answer(request)

    monkeypatch.setattr(console, "handle", broken)
    with caplog.at_level(logging.ERROR, logger="serving.control"):
        await plane.start()
        try:
            await asyncio.sleep(0.3)
            monkeypatch.setattr(console, "handle", answer)
            console.state = content(3, "epoch-x")
            for _ in range(50):
                if plane.applied.generation == 3:
                    break
                await asyncio.sleep(0.05)
        finally:
            await plane.stop()
            await worker.close()

    assert plane.applied.generation == 3
    assert any("control_step_failed" in record.getMessage() and "a bug nobody foresaw" in record.getMessage() for record in caplog.records)
