"""The worker's artifact cache under faults: a download cut by a kill leaves no partial
file after the next start (while another worker's live download is never cut); artifacts
nothing serves any more are evicted, never one a warm version, the persisted state or a
recent use needs; a corrupt cached copy is said before it is downloaded again; and a
worker with nothing to serve says why in its 503s."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from serving_testkit import REPO_ROOT, ThreadedWorker, free_port, make_config, route, state, v2_body, wait_until, write_model

from registry.building.onnx_build import random_mlp
from serving.artifact_cache import KEEP_RECENT_ARTIFACTS, evict_unused_artifacts, remove_stale_downloads
from serving.console_client import ConsoleClient
from serving.repository import Repository
from serving.state_signing import signing_key, state_digest
from serving.state_store import FILE_NAME, StateStore
from serving.worker import Worker

TOKEN = "worker-token-for-tests"
MIB = 1024 * 1024
LONG_AGO_S = 3600.0  # older than eviction's MIN_IDLE_S


def signed(content: dict) -> dict:
    return {**content, "digest": state_digest(content)}


def sha_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def age(path: Path, seconds: float) -> Path:
    used_at = time.time() - seconds
    os.utime(path, (used_at, used_at))
    return path


def cached(cache: Path, name: str, size: int = 1000, *, idle_s: float = LONG_AGO_S) -> Path:
    """A cached artifact (named by the sha256 of `name`) last used `idle_s` ago."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{sha_of(name)}.onnx"
    path.write_bytes(b"x" * size)
    return age(path, idle_s)


class ArtifactConsole:
    """A real HTTP console serving one state and its artifacts (``/artifacts/<name>``); with
    ``stall_after_bytes`` set, an artifact answer stops after that many bytes until
    ``release`` is set, like a console that hangs mid-download."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.desired = files, None
        self.stall_after_bytes: int | None = None
        self.stalled, self.release = threading.Event(), threading.Event()
        console = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/api/serving/state":
                    return self.answer(json.dumps(console.desired).encode())
                body = console.files.get(self.path.removeprefix("/artifacts/"))
                if body is None:
                    self.send_error(404)
                    return None
                return self.answer(body, console.stall_after_bytes)

            def answer(self, body: bytes, stall_after_bytes: int | None = None) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if stall_after_bytes is None:
                        self.wfile.write(body)
                        return
                    self.wfile.write(body[:stall_after_bytes])
                    self.wfile.flush()
                    console.stalled.set()
                    if console.release.wait(30):
                        self.wfile.write(body[stall_after_bytes:])
                except OSError:  # the worker was killed mid-answer
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def big_model(tmp_path) -> tuple[bytes, str]:
    """A model of about 2 MiB: a download of it writes a first 1 MiB chunk before it ends."""
    path, sha256 = write_model(tmp_path, "big", random_mlp([64, 8192, 10], seed=3))
    return path.read_bytes(), sha256


@pytest.fixture
def artifact_console(big_model):
    data, sha256 = big_model
    console = ArtifactConsole({"big.onnx": data})
    console.desired = signed(state(1, {"digits": {"routes": [route(1, 100, Path("/artifacts/big.onnx"), sha256)]}},
                                   epoch="epoch-x", max_batch_size=1))
    yield console
    console.close()


class WorkerProcess:
    """`python -m serving.worker` following `console_url`, its log in `log_path`."""

    def __init__(self, console_url: str, cache: Path, log_path: Path):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        environment = {**os.environ, "SERVING_DEVICE": "cpu", "SERVING_INTRA_OP_THREADS": "1", "SERVING_LOG_LEVEL": "info",
                       "SERVING_CACHE_DIR": str(cache), "CONSOLE_URL": console_url, "PYTHONPATH": str(REPO_ROOT)}
        with log_path.open("wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "serving.worker", "--port", str(port)],
                                            cwd=REPO_ROOT, env=environment, stdout=subprocess.DEVNULL, stderr=log)

    def is_ready(self) -> bool:
        assert self.process.poll() is None, self.log_path.read_text()
        try:
            return httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def events(self, name: str) -> list[dict]:
        lines = [json.loads(line) for line in self.log_path.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("event") == name]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)


def partial_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.part")) if cache.is_dir() else []


# ---- F6: partial downloads ------------------------------------------------------------


def test_a_worker_killed_mid_download_removes_its_partial_file_when_it_starts_again(tmp_path, artifact_console, big_model):
    cache = tmp_path / "cache"
    artifact_console.stall_after_bytes = 3 * MIB // 2
    first = WorkerProcess(artifact_console.url, cache, tmp_path / "first.log")
    try:
        assert wait_until(lambda: any(path.stat().st_size >= MIB for path in partial_files(cache)), timeout_s=30)
    finally:
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(timeout=10)
    [leaked] = partial_files(cache)
    leaked_bytes = leaked.stat().st_size
    artifact_console.stall_after_bytes = None
    artifact_console.release.set()

    second = WorkerProcess(artifact_console.url, cache, tmp_path / "second.log")
    try:
        assert wait_until(second.is_ready, timeout_s=30)

        assert partial_files(cache) == []
        assert (cache / f"{big_model[1]}.onnx").read_bytes() == big_model[0]
        [removed] = second.events("stale_downloads_removed")
        assert (removed["files"], removed["bytes"], removed["kept_live"]) == (1, leaked_bytes, 0)
    finally:
        second.stop()


def test_the_start_up_sweep_never_cuts_a_live_download_of_another_worker_sharing_the_cache(tmp_path, artifact_console, big_model):
    data, sha256 = big_model
    cache = tmp_path / "cache"
    artifact_console.stall_after_bytes = 3 * MIB // 2
    client = ConsoleClient(artifact_console.url, "", 10.0)
    downloaded = {}
    download = threading.Thread(target=lambda: downloaded.update(
        path=client.fetch_artifact("/artifacts/big.onnx", sha256, cache / f"{sha256}.onnx")))
    download.start()
    try:
        assert artifact_console.stalled.wait(10) and wait_until(lambda: len(partial_files(cache)) == 1)
        [live] = partial_files(cache)

        sweep = remove_stale_downloads(cache)

        assert (sweep.removed_files, sweep.removed_bytes, sweep.kept_files) == (0, 0, 1)
        assert live.exists()
    finally:
        artifact_console.release.set()
        download.join(timeout=30)
        client.close()
    assert downloaded["path"].read_bytes() == data
    assert partial_files(cache) == []


def test_the_start_up_sweep_removes_dead_partial_files_only_and_logs_their_bytes(tmp_path, caplog):
    cache = tmp_path / "cache"
    artifact = cached(cache, "served")
    (cache / f"{artifact.name}.abc123.part").write_bytes(b"p" * 300)
    (cache / f"{artifact.name}.def456.part").write_bytes(b"p" * 200)
    (cache / FILE_NAME).write_bytes(b"{}")
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    (cache / "link.onnx.x.part").symlink_to(victim)  # not a download of ours: left, and never followed

    with caplog.at_level(logging.INFO, logger="serving.artifact_cache"):
        sweep = remove_stale_downloads(cache)

    assert (sweep.removed_files, sweep.removed_bytes) == (2, 500)
    assert sorted(path.name for path in cache.iterdir()) == sorted([artifact.name, FILE_NAME, "link.onnx.x.part"])
    assert victim.read_text() == "untouched"
    [line] = [json.loads(record.getMessage()) for record in caplog.records if record.name == "serving.artifact_cache"]
    assert (line["event"], line["files"], line["bytes"]) == ("stale_downloads_removed", 2, 500)


def test_the_start_up_sweep_of_a_cache_not_made_yet_removes_nothing_and_says_nothing(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="serving.artifact_cache"):
        sweep = remove_stale_downloads(tmp_path / "never-made")

    assert (sweep.removed_files, sweep.removed_bytes, sweep.kept_files) == (0, 0, 0)
    assert not (tmp_path / "never-made").exists()
    assert [record for record in caplog.records if record.name == "serving.artifact_cache"] == []


def test_a_worker_removes_the_dead_partial_files_of_its_cache_when_it_is_built(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    dead = cache / f"{sha_of('x')}.onnx.k1ll3d.part"
    dead.write_bytes(b"p" * 4096)

    worker = Worker(make_config(tmp_path))

    assert not dead.exists()
    asyncio.run(worker.close())


# ---- eviction -------------------------------------------------------------------------


def test_eviction_removes_idle_artifacts_nothing_serves_beyond_the_most_recently_used(tmp_path, caplog):
    cache = tmp_path / "cache"
    served = cached(cache, "served")
    recent = [cached(cache, f"recent-{index}", idle_s=LONG_AGO_S + index) for index in range(KEEP_RECENT_ARTIFACTS)]
    old = cached(cache, "old", size=4321, idle_s=LONG_AGO_S * 2)

    with caplog.at_level(logging.INFO, logger="serving.artifact_cache"):
        sweep = evict_unused_artifacts(cache, {served.name.removesuffix(".onnx")})

    assert (sweep.removed_files, sweep.removed_bytes) == (1, 4321)
    assert sorted(cache.iterdir()) == sorted([served, *recent])
    assert not old.exists()
    [line] = [json.loads(record.getMessage()) for record in caplog.records if record.name == "serving.artifact_cache"]
    assert (line["event"], line["files"], line["bytes"]) == ("artifacts_evicted", 1, 4321)


def test_eviction_keeps_every_artifact_the_persisted_state_names(tmp_path):
    cache = tmp_path / "cache"
    routed, warm = cached(cache, "persisted-routed"), cached(cache, "persisted-warm")
    content = state(3, {"digits": {"routes": [route(1, 100, Path("/artifacts/one"), sha_of("persisted-routed"))],
                                   "warm": [{"version": 2, "sha256": sha_of("persisted-warm"), "artifact_url": "/artifacts/two"}]}},
                    epoch="epoch-x")
    StateStore(cache, signing_key(TOKEN)).save(signed(content))

    sweep = evict_unused_artifacts(cache, set(), keep_recent=0)

    assert sweep.removed_files == 0
    assert routed.exists() and warm.exists()


def test_eviction_keeps_an_artifact_used_within_the_idle_bound(tmp_path):
    cache = tmp_path / "cache"
    just_used = cached(cache, "another-worker-is-loading-it", idle_s=1)
    idle = cached(cache, "idle")

    sweep = evict_unused_artifacts(cache, set(), keep_recent=0)

    assert (sweep.removed_files, sweep.kept_files) == (1, 1)
    assert just_used.exists() and not idle.exists()


def test_eviction_leaves_what_is_not_a_cached_artifact(tmp_path):
    cache = tmp_path / "cache"
    others = [cache / "worker-key-0123456789abcdef", cache / "api-keys.json", cache / "notes.onnx", cache / f"{sha_of('a')}.onnx.x.part"]
    cache.mkdir()
    for path in others:
        path.write_bytes(b"keep")
        age(path, LONG_AGO_S)

    sweep = evict_unused_artifacts(cache, set(), keep_recent=0)

    assert sweep.removed_files == 0
    assert all(path.exists() for path in others)


class CountingConsole:
    """The console's artifact endpoint in memory (httpx.MockTransport); counts downloads."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.downloads = files, []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.downloads.append(request.url.path)
        return httpx.Response(200, content=self.files[request.url.path])


@pytest.fixture
async def downloading_repository(tmp_path, mlp_v1, mlp_v2):
    """A repository whose artifacts are downloaded into its cache from a console."""
    console = CountingConsole({"/artifacts/v1": mlp_v1[0].read_bytes(), "/artifacts/v2": mlp_v2[0].read_bytes()})
    config = make_config(tmp_path, console_url="http://console.test", allow_local_artifacts=False, worker_token=TOKEN)
    client = ConsoleClient("http://console.test", TOKEN, 5.0, transport=console.transport)
    repository = Repository(config, "cpu", client.fetch_artifact)
    yield repository, console, Path(config.cache_dir)
    await repository.close()
    client.close()


def digits(generation: int, routes: list[dict], warm: list[dict] = ()) -> dict:
    return state(generation, {"digits": {"routes": routes, "warm": list(warm)}}, epoch="epoch-x")


def v1_route(mlp_v1, weight: int) -> dict:
    return route(1, weight, Path("/artifacts/v1"), mlp_v1[1])


def v2_route(mlp_v2, weight: int) -> dict:
    return route(2, weight, Path("/artifacts/v2"), mlp_v2[1])


def old_unserved_artifacts(cache: Path) -> list[Path]:
    """More unserved artifacts, used more recently than anything else idle, than eviction keeps."""
    return [cached(cache, f"filler-{index}", idle_s=LONG_AGO_S) for index in range(KEEP_RECENT_ARTIFACTS)]


async def test_an_apply_evicts_the_artifact_of_a_version_no_longer_routed_or_warm(downloading_repository, mlp_v1, mlp_v2):
    repository, console, cache = downloading_repository
    await repository.apply(digits(1, [v1_route(mlp_v1, 100)]))
    fillers = old_unserved_artifacts(cache)
    v1_file = age(cache / f"{mlp_v1[1]}.onnx", LONG_AGO_S * 2)

    result = await repository.apply(digits(2, [v2_route(mlp_v2, 100)]))

    assert result["ok"] is True
    assert not v1_file.exists()
    assert (cache / f"{mlp_v2[1]}.onnx").exists() and all(path.exists() for path in fillers)


async def test_a_rollback_target_kept_warm_keeps_its_artifact_and_rolls_back_without_a_download(downloading_repository, mlp_v1, mlp_v2):
    repository, console, cache = downloading_repository
    await repository.apply(digits(1, [v1_route(mlp_v1, 100)]))
    old_unserved_artifacts(cache)
    v1_file = age(cache / f"{mlp_v1[1]}.onnx", LONG_AGO_S * 2)

    v1_warm = {"version": 1, "sha256": mlp_v1[1], "artifact_url": "/artifacts/v1", "signature": {"batchable": True}}
    await repository.apply(digits(2, [v2_route(mlp_v2, 100)], warm=[v1_warm]))
    downloads = list(console.downloads)
    rollback = await repository.apply(digits(3, [v1_route(mlp_v1, 100)], warm=[v2_route(mlp_v2, 0)]))

    assert v1_file.exists()
    assert rollback["ok"] is True and console.downloads == downloads


async def test_an_apply_keeps_the_artifacts_of_the_persisted_state(downloading_repository, mlp_v1, mlp_v2):
    repository, console, cache = downloading_repository
    first = digits(1, [v1_route(mlp_v1, 100)])
    await repository.apply(first)
    StateStore(cache, signing_key(TOKEN)).save(signed(first))  # what the control plane does after an apply
    old_unserved_artifacts(cache)
    v1_file = age(cache / f"{mlp_v1[1]}.onnx", LONG_AGO_S * 2)

    await repository.apply(digits(2, [v2_route(mlp_v2, 100)]))

    assert v1_file.exists()  # a restart before the new state is persisted serves this one


# ---- F10a: a corrupt cached copy --------------------------------------------------------


def test_a_corrupt_cached_artifact_is_warned_about_naming_it_before_it_is_downloaded_again(tmp_path, caplog):
    payload = b"model bytes"
    sha256 = hashlib.sha256(payload).hexdigest()
    dest = tmp_path / f"{sha256}.onnx"
    dest.write_bytes(b"model bytEs")  # a flipped bit
    answers = httpx.MockTransport(lambda request: httpx.Response(200, content=payload))
    client = ConsoleClient("http://console.test", "s3cret", 2.0, transport=answers)

    with caplog.at_level(logging.INFO, logger="serving.console_client"):
        assert client.fetch_artifact("/a", sha256, dest) == dest

    assert dest.read_bytes() == payload
    [line] = [(record.levelname, json.loads(record.getMessage())) for record in caplog.records if record.name == "serving.console_client"]
    assert line == ("WARNING", {"event": "cached_artifact_corrupt", "path": str(dest), "reason": "its sha256 does not match its name",
                                "expected_sha256": sha256, "actual_sha256": hashlib.sha256(b"model bytEs").hexdigest(),
                                "action": "downloading it again"})


def test_a_cache_hit_is_served_silently_and_counts_as_a_use_for_eviction(tmp_path, caplog):
    payload = b"model bytes"
    sha256 = hashlib.sha256(payload).hexdigest()
    dest = tmp_path / f"{sha256}.onnx"
    dest.write_bytes(payload)
    age(dest, LONG_AGO_S)
    client = ConsoleClient("http://console.test", "s3cret", 2.0, transport=httpx.MockTransport(lambda request: httpx.Response(500)))

    with caplog.at_level(logging.INFO, logger="serving.console_client"):
        assert client.fetch_artifact("/a", sha256, dest) == dest

    assert [record for record in caplog.records if record.name == "serving.console_client"] == []
    assert time.time() - dest.stat().st_mtime < LONG_AGO_S / 2  # used now, for eviction


# ---- F10b: why a worker with nothing to serve answers 503 ---------------------------------


@pytest.fixture
def unreachable_worker(tmp_path):
    """start(persisted=bytes | None) -> a started in-process worker whose console is down."""
    started = []

    def start(persisted: bytes | None) -> ThreadedWorker:
        cache = tmp_path / "cache"
        cache.mkdir(mode=0o700, exist_ok=True)
        if persisted is not None:
            (cache / FILE_NAME).write_bytes(persisted)
            (cache / FILE_NAME).chmod(0o600)
        config = make_config(tmp_path, worker_token=TOKEN, console_url=f"http://127.0.0.1:{free_port()}", console_timeout_s=2.0)
        worker = ThreadedWorker(config, None).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def refusals(worker: ThreadedWorker) -> list[tuple[int, str, str]]:
    body = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))
    answers = [httpx.post(worker.url + "/v2/models/digits/infer", content=body, timeout=10),
               httpx.post(worker.url + "/predict", json={"model_name": "digits", "inputs": [[0.0] * 64]}, timeout=10)]
    return [(answer.status_code, answer.headers.get("retry-after"), answer.json()["error"]) for answer in answers]


def test_a_worker_that_refused_its_persisted_state_with_the_console_down_says_so_in_its_503(unreachable_worker):
    worker = unreachable_worker(b"not json")

    reason = ("no state applied: the console's state could not be fetched, and the persisted state was refused; "
              "the worker's log says why")
    assert refusals(worker) == [(503, "1", reason), (503, "1", reason)]


def test_a_worker_with_no_persisted_state_and_the_console_down_says_so_in_its_503(unreachable_worker):
    worker = unreachable_worker(None)

    reason = ("no state applied: the console's state could not be fetched, and there is no persisted state; "
              "the worker's log says why")
    assert refusals(worker) == [(503, "1", reason), (503, "1", reason)]


def test_a_worker_with_nothing_applied_names_the_latest_state_it_could_not_apply(unreachable_worker, mlp_v1):
    worker = unreachable_worker(None)

    result = worker.apply(state(4, {"digits": {"routes": [route(1, 100, mlp_v1[0], "0" * 64)]}}))

    assert result["ok"] is False
    reason = "no state applied: the state of generation 4 could not be applied; the worker's log says why"
    assert refusals(worker) == [(503, "1", reason), (503, "1", reason)]
