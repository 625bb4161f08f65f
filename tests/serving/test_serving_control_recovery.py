"""Recovery paths of the control plane: the reconnect back-off starts over after a
connection held; every applied state is persisted; a worker whose console cannot answer
at start serves the persisted state, reports it, and acks it once the console answers."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import pytest
from redis.exceptions import ResponseError
from serving_testkit import free_port, make_config, route, state

import serving.control as control
from serving.contract import CONTRACT_VERSION, MAX_MODEL_DIGESTS
from serving.control import Applied, Backoff, ControlPlane
from serving.state_signing import model_digests, state_digest
from serving.worker import Worker
from tests.fixtures.push_key import PUSH_KEY_HEADERS, signed_push

TOKEN = "worker-token-for-tests"


class Console:
    """The console's worker endpoints in memory; ``is_down`` makes every call fail to connect."""

    def __init__(self):
        self.state: dict | None = None
        self.is_down = False
        self.report_status = 204  # 503: the console's database is down
        self.report_refusal = {"error": "the database is unavailable; retry in 5 s"}
        self.ack_status = 204
        self.ack_posts = 0
        self.state_reads = 0
        self.acks: list[dict] = []
        self.reports: list[dict] = []
        self.hold_reports: asyncio.Event | None = None  # set: reports wait for it, then take the status of that moment
        self.push_key_headers = PUSH_KEY_HEADERS  # {}: a console that names no push key
        self.transport = httpx.MockTransport(self.handle_held)

    async def handle_held(self, request: httpx.Request) -> httpx.Response:
        if self.hold_reports is not None and request.url.path == "/api/serving/reports":
            status = self.report_status
            await self.hold_reports.wait()
            if status != 204:
                return httpx.Response(status, json=self.report_refusal)
        return self.handle(request)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.is_down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/api/serving/state":
            self.state_reads += 1
            return httpx.Response(200, json=self.state, headers=self.push_key_headers)
        if request.url.path == "/api/serving/reports" and self.report_status != 204:
            return httpx.Response(self.report_status, json=self.report_refusal)
        if request.url.path == "/api/serving/acks":
            self.ack_posts += 1
            if self.ack_status != 204:
                return httpx.Response(self.ack_status, json={"error": "refused"})
        {"/api/serving/acks": self.acks, "/api/serving/reports": self.reports}[request.url.path].append(json.loads(request.content))
        return httpx.Response(204)


def desired(generation: int, weights: list[tuple[int, int]], mlp_v1, mlp_v2) -> dict:
    paths = {1: mlp_v1, 2: mlp_v2}
    content = state(generation, {"digits": {"routes": [route(version, weight, *paths[version]) for version, weight in weights]}}, epoch="epoch-x")
    return {**content, "digest": state_digest(content)}


@pytest.fixture
def console() -> Console:
    return Console()


@pytest.fixture
async def start_plane(tmp_path, console):
    """start_plane() -> a started ControlPlane on a real worker whose start-up fetch goes to
    a closed port (the console's HTTP client for the plane is ``console``)."""
    started = []

    async def start() -> ControlPlane:
        config = make_config(tmp_path, worker_token=TOKEN, console_url=f"http://127.0.0.1:{free_port()}")
        worker = Worker(config)
        plane = ControlPlane(worker, redis_url="", public_url="http://127.0.0.1:1", transport=console.transport)
        await worker.load_initial_state()
        await plane.start(run_loops=False)
        started.append((worker, plane))
        return plane

    yield start
    for worker, plane in started:
        await plane.stop()
        await worker.close()


# ---- back-off -------------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap():
    backoff = Backoff(0.5, 10.0)

    assert [backoff.next_delay() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_backoff_starts_over_after_a_reset():
    backoff = Backoff(0.5, 10.0)
    for _ in range(5):
        backoff.next_delay()

    backoff.reset()

    assert [backoff.next_delay() for _ in range(3)] == [0.5, 1.0, 2.0]


# ---- persisting and serving the persisted state ----------------------------------------


async def test_each_applied_state_is_persisted_with_its_digest(start_plane, console, mlp_v1, mlp_v2):
    plane = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)

    await plane.reconcile()

    assert plane.worker.state_store.load()["digest"] == console.state["digest"]


async def test_a_state_applied_but_not_saved_is_acked_saying_so(start_plane, console, mlp_v1, mlp_v2):
    # A worker whose cache could not be written was shown converged and ok with no word of
    # it; restarted while the console was down, it served the state from before a rollback.
    plane = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    await plane.reconcile()
    plane.worker.state_store.path.unlink()
    plane.worker.state_store.path.mkdir()  # the file cannot be replaced: as a full or read-only disk
    console.state = desired(4, [(2, 100)], mlp_v1, mlp_v2)

    result = await plane.reconcile()

    assert result["ok"] is True
    assert console.acks[-1]["ok"] is True
    assert console.acks[-1]["error"].startswith(f"applied, but not saved for a restart ({plane.worker.state_store.path}: ")
    assert "would serve the state it saved before" in console.acks[-1]["error"]


async def test_a_state_not_saved_is_saved_at_a_later_reconcile_and_acked_again_without_the_warning(start_plane, console, mlp_v1, mlp_v2, caplog):
    plane = await start_plane()
    plane.worker.state_store.path.parent.mkdir(parents=True, exist_ok=True)
    plane.worker.state_store.path.mkdir()
    console.state = desired(4, [(2, 100)], mlp_v1, mlp_v2)
    with caplog.at_level(logging.WARNING, logger="serving.control"):
        await plane.reconcile()
        await plane.reconcile()  # still cannot: nothing more is said, to the console or in the log
    assert sum("state_not_persisted" in record.getMessage() for record in caplog.records) == 1
    acks = len(console.acks)
    plane.worker.state_store.path.rmdir()

    await plane.reconcile()

    assert plane.worker.state_store.load()["digest"] == console.state["digest"]
    assert [(ack["generation"], ack["ok"], ack.get("error")) for ack in console.acks[acks:]] == [(4, True, None)]


async def test_a_state_that_failed_to_apply_is_not_persisted(start_plane, console, mlp_v1, mlp_v2, tmp_path):
    plane = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    await plane.reconcile()
    broken = desired(4, [(1, 100)], mlp_v1, mlp_v2)
    broken["models"]["digits"]["routes"][0]["sha256"] = "0" * 64
    console.state = {**broken, "digest": state_digest(broken)}

    result = await plane.reconcile()

    assert result["ok"] is False
    assert plane.worker.state_store.load()["generation"] == 3


async def restarted_on_persisted_state(start_plane, console, mlp_v1, mlp_v2):
    """A worker that applied generation 3, started again while the console is down."""
    first = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    await first.reconcile()
    console.is_down = True
    return await start_plane()


async def test_a_worker_whose_console_is_down_at_start_serves_the_persisted_state_and_reports_it(start_plane, console, mlp_v1, mlp_v2):
    plane = await restarted_on_persisted_state(start_plane, console, mlp_v1, mlp_v2)
    report = plane.reports.build(plane.identity, plane.worker.repository,
                                 {"generation": plane.applied.generation, "digest": plane.applied.digest, "epoch": plane.applied.epoch})

    assert plane.worker.repository.is_ready
    assert plane.worker.repository.health()["models"]["digits"]["routes"] == [{"version": 1, "weight": 100}]
    assert plane.applied == Applied(3, "epoch-x", console.state["digest"])
    assert (report.generation, report.digest, report.epoch) == (3, console.state["digest"], "epoch-x")


async def test_a_worker_started_during_an_outage_takes_no_push_until_the_console_names_its_key(start_plane, console, mlp_v1, mlp_v2):
    # A superseded push, replayed from Redis to a worker that could not ask the console,
    # was applied and persisted: it served a canary the console had rolled back.
    plane = await restarted_on_persisted_state(start_plane, console, mlp_v1, mlp_v2)
    superseded = signed_push(desired(4, [(2, 100)], mlp_v1, mlp_v2))

    assert await plane.receive_push(superseded) is None

    assert plane.worker.repository.health()["models"]["digits"]["routes"] == [{"version": 1, "weight": 100}]
    assert plane.worker.state_store.load()["generation"] == 3


async def test_a_push_before_the_console_named_its_key_makes_the_worker_ask_the_console(start_plane, console, mlp_v1, mlp_v2):
    plane = await start_plane()
    console.state = desired(5, [(1, 100)], mlp_v1, mlp_v2)

    result = await plane.receive_push(signed_push(desired(4, [(2, 100)], mlp_v1, mlp_v2)))

    assert result["ok"] is True
    assert plane.applied == Applied(5, "epoch-x", console.state["digest"])  # the console's state, not the push's


async def test_a_console_that_names_no_push_key_is_said_once_and_its_pushes_wait_for_reconcile(start_plane, console, mlp_v1, mlp_v2, caplog):
    console.push_key_headers = {}
    plane = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)

    with caplog.at_level(logging.WARNING, logger="serving.control"):
        await plane.reconcile()
        await plane.reconcile()
        assert await plane.receive_push(signed_push(desired(4, [(2, 100)], mlp_v1, mlp_v2))) is None

    assert sum("push_key_missing" in record.getMessage() for record in caplog.records) == 1
    assert plane.worker.repository.health()["models"]["digits"]["routes"] == [{"version": 1, "weight": 100}]


async def test_the_persisted_state_is_acked_once_when_the_console_answers_with_the_same_digest(start_plane, console, mlp_v1, mlp_v2):
    first = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    await first.reconcile()
    console.is_down = True
    plane = await start_plane()
    acks_before = len(console.acks)

    assert await plane.reconcile() is None  # still down: nothing delivered, nothing lost
    console.is_down = False
    await plane.reconcile()
    await plane.reconcile()

    new_acks = console.acks[acks_before:]
    assert [ack | {"load_ms": 0} for ack in new_acks] == [
        {"worker": plane.identity.id, "generation": 3, "digest": console.state["digest"], "epoch": "epoch-x", "ok": True, "load_ms": 0,
         "contract": CONTRACT_VERSION}]
    assert console.reports[-1]["worker"]["id"] == plane.identity.id  # it reported before that ack


@pytest.mark.parametrize("status", [503, 429])
async def test_an_ack_the_console_could_not_take_is_sent_again_once_it_can(start_plane, console, mlp_v1, mlp_v2, status):
    plane = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    console.ack_status = status  # its database is down: the ack is not stored
    await plane.reconcile()

    console.ack_status = 204
    await plane.reconcile()
    await plane.reconcile()

    assert [(ack["generation"], ack["digest"], ack["ok"]) for ack in console.acks] == [(3, console.state["digest"], True)]


async def test_an_ack_lost_on_the_way_is_sent_again_at_the_next_reconcile(start_plane, console, mlp_v1, mlp_v2, monkeypatch):
    plane = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    handle = console.handle

    def acks_lost(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/serving/acks":
            raise httpx.ReadTimeout("no answer", request=request)
        return handle(request)

    monkeypatch.setattr(console, "handle", acks_lost)
    await plane.reconcile()
    monkeypatch.setattr(console, "handle", handle)
    await plane.reconcile()

    assert [ack["generation"] for ack in console.acks] == [3]


async def test_an_ack_the_console_refused_is_not_sent_again(start_plane, console, mlp_v1, mlp_v2):
    plane = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    console.ack_status = 400  # the console's answer to this ack: sending it again changes nothing
    await plane.reconcile()

    console.ack_status = 204
    await plane.reconcile()

    assert (console.ack_posts, console.acks) == (1, [])


async def test_a_worker_on_its_persisted_state_adopts_the_consoles_different_state_when_it_answers(start_plane, console, mlp_v1, mlp_v2):
    plane = await restarted_on_persisted_state(start_plane, console, mlp_v1, mlp_v2)

    console.is_down = False
    console.state = desired(4, [(1, 50), (2, 50)], mlp_v1, mlp_v2)
    result = await plane.reconcile()

    assert result["ok"] is True
    assert plane.applied == Applied(4, "epoch-x", console.state["digest"])
    assert [ack["generation"] for ack in console.acks[-1:]] == [4]
    assert plane.worker.state_store.load()["digest"] == console.state["digest"]


async def test_a_refused_persisted_state_leaves_the_worker_not_ready_with_nothing_applied(start_plane, console, mlp_v1, mlp_v2, caplog):
    first = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    await first.reconcile()
    path = first.worker.state_store.path
    document = json.loads(path.read_text())
    document["generation"] = 9
    path.write_text(json.dumps(document))
    console.is_down = True

    plane = await start_plane()

    assert not plane.worker.repository.is_ready
    assert plane.applied == Applied()
    assert any("persisted_state_refused" in record.getMessage() and "the digest does not match" in record.getMessage() for record in caplog.records)


async def test_an_unreachable_console_is_warned_about_once_per_outage(start_plane, console, mlp_v1, mlp_v2, caplog):
    plane = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    console.is_down = True

    with caplog.at_level(logging.INFO, logger="serving.control"):
        for _ in range(3):
            await plane.reconcile()
        console.is_down = False
        await plane.reconcile()
        console.is_down = True
        await plane.reconcile()

    events = [(record.levelname, json.loads(record.getMessage())["event"])
              for record in caplog.records if record.name == "serving.control"]
    assert events == [("WARNING", "reconcile_failed"), ("INFO", "console_answers_again"), ("WARNING", "reconcile_failed")]


async def test_reports_refused_through_an_outage_are_warned_about_once(start_plane, console, caplog):
    plane = await start_plane()
    console.report_status = 503

    with caplog.at_level(logging.DEBUG, logger="serving.control"):
        for _ in range(5):
            await plane.send_report()
        console.report_status = 204
        await plane.send_report()

    events = [(record.levelname, json.loads(record.getMessage())["event"])
              for record in caplog.records if record.name == "serving.control"]
    assert events == [("WARNING", "report_refused")] + [("DEBUG", "report_refused")] * 4 + [("INFO", "reports_accepted_again")]
    assert len(console.reports) == 1


async def test_a_replayed_push_asks_the_console_at_most_once_a_second_however_often_it_comes(start_plane, console, mlp_v1, mlp_v2):
    from serving.control import PUSH_RECONCILE_EVERY_S
    plane = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    await plane.reconcile()
    reads_before = console.state_reads
    replayed = signed_push({**desired(3, [(2, 100)], mlp_v1, mlp_v2), "epoch": "another-epoch"})

    for _ in range(50):  # signed, but of another epoch: each asks the console what is current
        await plane.receive_push(replayed)
    assert console.state_reads - reads_before == 1
    await asyncio.sleep(PUSH_RECONCILE_EVERY_S + 0.2)

    assert console.state_reads - reads_before == 2  # the fifty after the first are one later reconcile
    assert plane.applied.digest == console.state["digest"]


async def worker_started_on(state: dict, tmp_path) -> Worker:
    """A worker whose start-up fetch gets ``state`` from a console answering over HTTP,
    which goes down once the worker has started."""
    from test_api_keys_persisted import Console as HttpConsole

    answering = HttpConsole(state, [])
    try:
        worker = Worker(make_config(tmp_path, worker_token=TOKEN, console_url=answering.url))
        await worker.load_initial_state()
    finally:
        answering.go_down()
    return worker


@pytest.fixture
def torn_console(mlp_v1, mlp_v2):
    """A real HTTP console whose state names version 2's routes under version 1's digest."""
    from test_api_keys_persisted import Console as HttpConsole

    honest = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    console = HttpConsole({**desired(3, [(2, 100)], mlp_v1, mlp_v2), "digest": honest["digest"]}, [])
    yield console.url
    console.go_down()


async def test_a_worker_does_not_serve_a_start_up_state_whose_digest_does_not_match_its_content(torn_console, tmp_path, caplog):
    worker = Worker(make_config(tmp_path, worker_token=TOKEN, console_url=torn_console))
    try:
        await worker.load_initial_state()

        assert not worker.repository.is_ready  # nothing applied: not the torn routes, and no persisted state to fall back on
        assert any("the digest does not match the content" in record.getMessage() for record in caplog.records)
    finally:
        await worker.close()


async def test_a_worker_whose_console_answers_a_state_it_cannot_apply_at_start_serves_the_persisted_one(start_plane, console, mlp_v1,
                                                                                                        mlp_v2, tmp_path):
    first = await start_plane()
    console.state = desired(3, [(1, 100)], mlp_v1, mlp_v2)
    await first.reconcile()
    broken = state(4, {"digits": {"routes": [route(2, 100, mlp_v2[0], "0" * 64)]}}, epoch="epoch-x")  # its artifact fails its check
    worker = await worker_started_on({**broken, "digest": state_digest(broken)}, tmp_path)

    assert worker.repository.is_ready
    assert worker.repository.health()["models"]["digits"]["routes"] == [{"version": 1, "weight": 100}]
    assert worker.initial_persisted[0]["digest"] == console.state["digest"]
    await worker.close()


# ---- reports the console did not keep ---------------------------------------------------


async def interval_after_a_lost_report(plane, console, lose) -> tuple[float, float]:
    """The ``interval_s`` of the report after one lost by ``lose(console)``, 0.4 s after
    the last one the console kept: 0.4 s and more when the lost one's figures went with it;
    and the seconds from just before the lost one was sent to just after the next, which
    the interval cannot exceed if it counts from the lost one."""
    await plane.send_report()
    await asyncio.sleep(0.4)
    lose(console)
    lost_at = time.monotonic()
    await plane.send_report()
    console.is_down, console.report_status = False, 204
    await plane.send_report()
    return console.reports[-1]["interval_s"], time.monotonic() - lost_at


def counted_from_the_lost_report(interval_s: float, since_the_lost_s: float) -> bool:
    """Not sent again: the interval is that since the lost report (to the report's 1 ms),
    however long a loaded box took between the two; sent again it would be 0.4 s longer.
    "Under 0.2 s" failed when the box paused 0.25 s between them."""
    return interval_s <= since_the_lost_s + 0.001


def answered(status: int):
    def lose(console) -> None:
        console.report_status = status
    return lose


def unreachable(console) -> None:
    console.is_down = True


@pytest.mark.parametrize("lose", [answered(429), answered(503), unreachable], ids=["too soon", "database down", "console down"])
async def test_a_report_the_console_kept_nothing_of_is_sent_again_with_the_next(start_plane, console, lose):
    plane = await start_plane()

    interval_s, _ = await interval_after_a_lost_report(plane, console, lose)

    assert interval_s >= 0.4


@pytest.mark.parametrize("status", [400, 500])
async def test_a_report_refused_for_what_it_holds_is_not_sent_again(start_plane, console, status):
    # A 400 would be refused again with every report after it; a 500 may have kept part of it.
    plane = await start_plane()

    assert counted_from_the_lost_report(*await interval_after_a_lost_report(plane, console, answered(status)))


async def test_a_report_whose_commit_the_console_could_not_confirm_is_not_sent_again(start_plane, console):
    plane = await start_plane()
    console.report_refusal = {"error": "the database failed while this change was being committed", "in_doubt": "the report of worker 'w'"}

    assert counted_from_the_lost_report(*await interval_after_a_lost_report(plane, console, answered(503)))


async def test_reports_sent_at_once_go_one_after_the_other_and_a_lost_one_is_sent_again(start_plane, console):
    # An ack sends the first report itself, beside the report loop: two reports in flight at
    # once gave back the wrong figures after the first was lost (0.4 s of them never sent).
    plane = await start_plane()
    await plane.send_report()
    await asyncio.sleep(0.4)
    console.report_status = 503
    console.hold_reports = asyncio.Event()
    first = asyncio.create_task(plane.send_report())
    await asyncio.sleep(0.05)  # the first is in flight, held by the console
    second = asyncio.create_task(plane.send_report())
    await asyncio.sleep(0.05)
    console.report_status = 204  # the first is answered 503, the second 204
    console.hold_reports.set()
    await asyncio.gather(first, second)
    await plane.send_report()

    assert sum(report["interval_s"] for report in console.reports[1:]) >= 0.4


@pytest.mark.parametrize(("header", "seconds"), [("1", 1.0), ("0.5", 0.5), ("inf", 0.0), ("nan", 0.0), ("-5", 0.0), ("1e400", 0.0),
                                                ("Fri, 31 Dec 1999 23:59:59 GMT", 0.0), ("", 0.0)])
def test_a_retry_after_that_is_not_a_finite_positive_number_asks_for_no_wait(header, seconds):
    # A console, or a proxy before it, names the wait; the control plane caps it at
    # MAX_REPORT_WAIT_S (a worker silent past WORKER_GONE_AFTER_S is shown gone).
    from serving.control import _retry_after_s

    assert _retry_after_s(httpx.Response(429, headers={"Retry-After": header})) == seconds


# ---- one model's failing version holds no other model's change ---------------------------
# The worker applies the rest, keeps the failing model on what it served, reports that
# content's own digest (never the console's), acks the state as failed with the reason,
# persists what it serves, and tries the console's state again at each reconcile.


BROKEN = "0" * 64  # a sha256 no artifact has: the version fails its check


def signed(generation: int, digits_routes: list, other_routes: list) -> dict:
    content = state(generation, {"digits": {"routes": digits_routes}, "other": {"routes": other_routes}}, epoch="epoch-x")
    return {**content, "digest": state_digest(content)}


def report_of(plane):
    applied = {"generation": plane.applied.generation, "digest": plane.applied.digest, "epoch": plane.applied.epoch}
    return plane.reports.build(plane.identity, plane.worker.repository, applied)


async def partly_applied(start_plane, console, mlp_v1, mlp_v2):
    """A plane serving digits v1 and other v2, then told to canary a broken digits v2 and
    roll other back to v1."""
    plane = await start_plane()
    console.state = signed(1, [route(1, 100, *mlp_v1)], [route(2, 100, *mlp_v2)])
    await plane.reconcile()
    console.state = signed(2, [route(1, 90, *mlp_v1), route(2, 10, mlp_v2[0], BROKEN)], [route(1, 100, *mlp_v1)])
    result = await plane.reconcile()
    return plane, result


async def test_another_model_s_rollback_is_served_while_a_canary_fails(start_plane, console, mlp_v1, mlp_v2):
    plane, result = await partly_applied(start_plane, console, mlp_v1, mlp_v2)

    routes = plane.worker.repository.health()["models"]
    assert result["ok"] is False
    assert routes["other"]["routes"] == [{"version": 1, "weight": 100}]
    assert routes["digits"]["routes"] == [{"version": 1, "weight": 100}]


async def test_the_ack_of_a_partial_apply_says_the_state_failed_and_why(start_plane, console, mlp_v1, mlp_v2):
    await partly_applied(start_plane, console, mlp_v1, mlp_v2)

    ack = console.acks[-1]
    assert (ack["generation"], ack["digest"], ack["ok"]) == (2, console.state["digest"], False)
    assert ack["error"].startswith("applied but for digits (keeps the routes it served before): digits v2:")


async def test_reports_after_a_partial_apply_name_the_served_content_not_the_console_s(start_plane, console, mlp_v1, mlp_v2):
    plane, _ = await partly_applied(start_plane, console, mlp_v1, mlp_v2)

    report = report_of(plane)
    served = plane.worker.repository.applied_state
    assert report.digest == state_digest(served) != console.state["digest"]
    assert served["models"]["digits"]["routes"] == [route(1, 100, *mlp_v1)]
    assert served["models"]["other"] == console.state["models"]["other"]


async def test_reports_after_a_partial_apply_prove_each_model_served_as_issued_by_its_own_digest(start_plane, console, mlp_v1, mlp_v2):
    plane, _ = await partly_applied(start_plane, console, mlp_v1, mlp_v2)
    before = signed(1, [route(1, 100, *mlp_v1)], [route(2, 100, *mlp_v2)])

    await plane.send_report()

    models = console.reports[-1]["models"]
    assert models["other"] == model_digests(console.state)["other"]  # the rollback, as issued at generation 2
    assert models["digits"] == model_digests(before)["digits"] != model_digests(console.state)["digits"]


async def test_a_worker_serving_its_persisted_state_reports_each_models_digest(start_plane, console, mlp_v1, mlp_v2):
    plane = await restarted_on_persisted_state(start_plane, console, mlp_v1, mlp_v2)

    console.is_down = False
    await plane.send_report()

    assert console.reports[-1]["models"] == model_digests(console.state)


async def test_what_a_partial_apply_serves_is_persisted(start_plane, console, mlp_v1, mlp_v2):
    plane, _ = await partly_applied(start_plane, console, mlp_v1, mlp_v2)

    persisted = plane.worker.state_store.load()
    assert persisted["digest"] == plane.applied.digest == state_digest(plane.worker.repository.applied_state)


async def test_a_worker_restarted_while_the_console_is_down_keeps_the_rollback_a_partial_apply_served(start_plane, console, mlp_v1, mlp_v2):
    await partly_applied(start_plane, console, mlp_v1, mlp_v2)
    console.is_down = True

    restarted = await start_plane()

    routes = restarted.worker.repository.health()["models"]
    assert routes["other"]["routes"] == [{"version": 1, "weight": 100}]
    assert routes["digits"]["routes"] == [{"version": 1, "weight": 100}]


async def test_the_console_s_state_is_tried_again_and_acked_once_it_applies(start_plane, console, mlp_v1, mlp_v2):
    plane, _ = await partly_applied(start_plane, console, mlp_v1, mlp_v2)
    console.state = signed(2, [route(1, 90, *mlp_v1), route(2, 10, *mlp_v2)], [route(1, 100, *mlp_v1)])  # the artifact mended

    result = await plane.reconcile()

    assert result["ok"] is True
    assert plane.applied.digest == console.state["digest"] == report_of(plane).digest
    assert plane.worker.repository.health()["models"]["digits"]["routes"] == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]


async def test_a_worker_started_on_a_state_with_a_failing_model_takes_that_model_from_its_persisted_state(
        start_plane, console, mlp_v1, mlp_v2, tmp_path):
    first = await start_plane()
    console.state = signed(1, [route(1, 100, *mlp_v1)], [route(2, 100, *mlp_v2)])
    await first.reconcile()
    newer = signed(2, [route(1, 90, *mlp_v1), route(2, 10, mlp_v2[0], BROKEN)], [route(1, 100, *mlp_v1)])
    worker = await worker_started_on(newer, tmp_path)

    routes = worker.repository.health()["models"]
    assert routes["other"]["routes"] == [{"version": 1, "weight": 100}]  # the console's rollback, not the persisted v2
    assert routes["digits"]["routes"] == [{"version": 1, "weight": 100}]  # what was served, not nothing
    await worker.close()


async def test_each_retry_of_a_partly_applied_state_says_what_serves(start_plane, console, mlp_v1, mlp_v2):
    """The first ack said "applied but for digits"; each retry's said only digits' error,
    and the console showed that beside the other model's rollback it was serving."""
    plane, _ = await partly_applied(start_plane, console, mlp_v1, mlp_v2)

    await plane.reconcile()

    assert len(console.acks) >= 3
    assert console.acks[-1]["error"].startswith("applied but for digits (keeps the routes it served before): digits v2:")


async def test_a_worker_started_on_a_state_with_a_failing_model_persists_what_it_serves(start_plane, console, mlp_v1, mlp_v2, tmp_path):
    """Started with the console up, it served the rollback but never wrote it down: killed
    and restarted during an outage, it served the state before the rollback."""
    first = await start_plane()
    console.state = signed(1, [route(1, 100, *mlp_v1)], [route(2, 100, *mlp_v2)])
    await first.reconcile()
    console.state = signed(2, [route(1, 90, *mlp_v1), route(2, 10, mlp_v2[0], BROKEN)], [route(1, 100, *mlp_v1)])
    worker = await worker_started_on(console.state, tmp_path)
    plane = ControlPlane(worker, redis_url="", public_url="http://127.0.0.1:1", transport=console.transport)
    await plane.start(run_loops=False)
    await plane.reconcile()
    await plane.stop()
    await worker.close()
    console.is_down = True

    restarted = await start_plane()

    assert restarted.worker.repository.health()["models"]["other"]["routes"] == [{"version": 1, "weight": 100}]


async def test_a_worker_started_on_another_epoch_s_state_takes_no_model_from_its_persisted_state(start_plane, console, mlp_v1, mlp_v2, tmp_path):
    """The persisted entry is another database's: served, it was reported as this one's."""
    first = await start_plane()
    console.state = signed(1, [route(2, 100, *mlp_v2)], [route(1, 100, *mlp_v1)])
    await first.reconcile()
    content = state(1, {"digits": {"routes": [route(1, 100, mlp_v1[0], BROKEN)]}, "other": {"routes": [route(1, 100, *mlp_v1)]}},
                    epoch="epoch-restored")
    worker = await worker_started_on({**content, "digest": state_digest(content)}, tmp_path)

    assert "digits" not in worker.repository.applied_state["models"]
    assert worker.repository.health()["models"]["digits"]["routes"] == []
    await worker.close()


async def test_a_signed_push_of_a_partly_applied_state_asks_the_console_and_changes_nothing_it_cannot_apply(start_plane, console, mlp_v1,
                                                                                                           mlp_v2):
    """A push of the generation the worker applied in part carries content it does not
    serve: never taken as applied, it makes the worker ask the console, which retries."""

    plane, _ = await partly_applied(start_plane, console, mlp_v1, mlp_v2)
    served, reads_before = plane.applied.digest, console.state_reads

    await plane.receive_push(signed_push(console.state))

    assert console.state_reads == reads_before + 1
    assert plane.applied.digest == served != console.state["digest"]
    assert console.acks[-1]["ok"] is False
    assert plane.worker.repository.health()["models"]["digits"]["routes"] == [{"version": 1, "weight": 100}]


def released(signed_state: dict, model: str, release_generation: int) -> dict:
    """``signed_state`` with ``model``'s entry from the release of ``release_generation``."""
    content = {key: value for key, value in signed_state.items() if key != "digest"}
    content["models"] = {**content["models"], model: {**content["models"][model], "generation": release_generation}}
    return {**content, "digest": state_digest(content)}


async def test_a_model_released_again_with_the_same_routes_is_served_as_the_new_generation_while_another_fails(start_plane, console,
                                                                                                               mlp_v1, mlp_v2):
    """A drill's roll forward is a new release with the routes before: the worker kept
    serving (and reporting) the generation before, and was never counted converged for it."""
    plane, _ = await partly_applied(start_plane, console, mlp_v1, mlp_v2)
    console.state = released(signed(3, [route(1, 90, *mlp_v1), route(2, 10, mlp_v2[0], BROKEN)], [route(1, 100, *mlp_v1)]), "other", 3)

    await plane.reconcile()
    await plane.send_report()

    report = console.reports[-1]
    assert report["generation"] == 3
    assert report["models"]["other"] == model_digests(console.state)["other"]
    assert plane.worker.state_store.load()["generation"] == 3


async def test_a_push_older_than_the_state_last_tried_is_not_applied_though_an_older_generation_serves(start_plane, console, mlp_v1,
                                                                                                       mlp_v2):
    """Applied but for digits, generation 4 changed nothing else, so generation 2 still
    serves; a push of generation 3 (queued while the worker was frozen) served its routes
    for other after the console had moved on to 4."""

    plane, _ = await partly_applied(start_plane, console, mlp_v1, mlp_v2)
    broken_canary = [route(1, 90, *mlp_v1), route(2, 10, mlp_v2[0], BROKEN)]
    console.state = signed(4, broken_canary, [route(1, 100, *mlp_v1)])
    await plane.reconcile()
    assert plane.applied.generation == 2

    await plane.receive_push(signed_push(signed(3, broken_canary, [route(2, 100, *mlp_v2)])))

    assert plane.worker.repository.health()["models"]["other"]["routes"] == [{"version": 1, "weight": 100}]


async def test_a_push_between_the_generation_served_and_the_newest_tried_asks_the_console(start_plane, console, mlp_v1, mlp_v2):
    """A restored console database issues generation 3 again, with other content: dropped as
    stale, its rollback of other waited for the next periodic reconcile."""

    plane, _ = await partly_applied(start_plane, console, mlp_v1, mlp_v2)
    broken_canary = [route(1, 90, *mlp_v1), route(2, 10, mlp_v2[0], BROKEN)]
    console.state = signed(4, broken_canary, [route(1, 100, *mlp_v1)])
    await plane.reconcile()
    restored = signed(3, [route(1, 100, *mlp_v1)], [route(2, 100, *mlp_v2)])
    console.state, reads_before = restored, console.state_reads

    await plane.receive_push(signed_push(restored))

    assert console.state_reads == reads_before + 1
    assert plane.worker.repository.health()["models"]["other"]["routes"] == [{"version": 2, "weight": 100}]


def test_a_state_of_more_models_than_a_report_may_name_is_proved_by_its_whole_digest_alone():
    # Past the contract's bound the console refuses every report naming them: the worker
    # names none then, and the state's digest still proves what it serves.
    models = {f"m{index}": {} for index in range(MAX_MODEL_DIGESTS + 1)}

    assert Applied.of({"generation": 7, "epoch": "e", "models": models}, "d").models is None
    models.pop("m0")
    assert len(Applied.of({"generation": 7, "epoch": "e", "models": models}, "d").models) == MAX_MODEL_DIGESTS


async def test_a_rejoin_refused_every_second_is_said_once_not_every_second(monkeypatch, caplog):
    """A Redis at maxmemory under noeviction refuses the join's ZADD ('OOM command not
    allowed') while the receive's BZPOPMIN goes on: the receive never fails, and the join
    that now runs every second (REJOIN_EVERY_S) logged an ERROR with its traceback each
    time, 86,400 a day per worker. It is said once, and again when the join holds."""
    monkeypatch.setattr(control, "REJOIN_EVERY_S", 0.01)
    outcomes = [ResponseError("OOM command not allowed when used memory > 'maxmemory'.")] * 20 + [None] * 5

    class Layer:
        async def group_add(self, group, channel):
            outcome = outcomes.pop(0) if outcomes else None
            if outcome is not None:
                raise outcome

    plane = type("Plane", (), {"group_expiry_s": 86400.0})()
    with caplog.at_level(logging.INFO, logger="serving.control"):
        staying = asyncio.create_task(ControlPlane._stay_in_group(plane, Layer(), "serving-worker.x"))
        for _ in range(500):
            if not outcomes:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        staying.cancel()

    assert not outcomes, "every join was tried"
    failed = [record for record in caplog.records if "rejoin" in record.getMessage() and record.levelno >= logging.WARNING]
    assert len(failed) == 1, [record.getMessage() for record in failed]
    assert "OOM" in failed[0].getMessage()
    assert sum("group_rejoined" in record.getMessage() for record in caplog.records) == 1
