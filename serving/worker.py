"""A serving worker process: repository + ASGI app under uvicorn (uvloop, httptools).

The initial state is applied before uvicorn accepts any connection, so every routed
version is warm first: the console's in the ASGI lifespan startup, a state file's just
before uvicorn starts (one that cannot be applied is the operator's to fix: exit 2). When the
console cannot answer, the worker serves the last state it applied, persisted beside
its artifact cache (serving/state_store.py) and re-checked before use.
The control plane (serving/control.py) plugs in through `Worker.on_startup` /
`Worker.on_shutdown` hooks and `Worker.apply(state)`. SIGTERM stops it gracefully
(serving/drain.py): not ready, then no new connection, then every accepted request
answered, and only then the lifespan shutdown.

    python -m serving.worker --host 127.0.0.1 --port 8001 [--state-file state.json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import logging
import shutil
import sys
from pathlib import Path

import httpx
import uvicorn

from serving.api_key_store import ApiKeyStore, api_keys_signing_key
from serving.api_keys import KEYS_PATH, ApiKeyRefresher
from serving.artifact_cache import remove_stale_downloads
from serving.config import ServingConfig
from serving.console_client import ConsoleClient, StateError, console_only, console_timeout, read_state_file
from serving.dataplane import DataPlane
from serving.drain import Drain, DrainingServer
from serving.endpoints import ServingApp
from serving.engine import resolve_device
from serving.env import SettingError, port_number
from serving.http_protocol import HttpLimits, listen_backlog, protocol_class
from serving.listen_check import TAKEN_HINT, listen_problem, listen_refusal
from serving.listen_queue import Keepers
from serving.logs import configure_logging, event
from serving.model_safety import enter_private_working_directory
from serving.repository import Repository, with_entries_from
from serving.state_signing import content_of, signing_key
from serving.state_store import PersistedStateRefused, StateStore

logger = logging.getLogger("serving.worker")


class Worker:
    """Everything one process serves with; build it, add hooks, then `serve()`."""

    def __init__(self, config: ServingConfig, state_file: str | Path | None = None):
        if state_file is not None:  # the operator's own file names local models; no state comes from the network
            config = dataclasses.replace(config, allow_local_artifacts=True)
        self.config = config
        self.state_file = state_file
        remove_stale_downloads(config.cache_dir)  # before this worker's first download; another worker's live ones stay
        self.device = resolve_device(config)
        self.console = ConsoleClient(config.console_url, config.worker_token, config.console_timeout_s,
                                     allow_local=config.allow_local_artifacts)
        self.repository = Repository(config, self.device, self.console.fetch_artifact)
        self.dataplane = DataPlane(self.repository, config.request_timeout_s, config.max_body_buffer_bytes,
                                   trust_routing_key=config.trust_routing_key)
        self.drain = Drain(config.drain_delay_s, config.drain_timeout_s)  # the graceful stop on SIGTERM
        # The listen queue's keepers, started by serve() once uvicorn listens.
        self.keepers = Keepers(config.accept_wait_s, config.log_level, self.dataplane.refuses_every_request, config.keeper_nice)
        self.app = ServingApp(self.dataplane, config, self.drain)
        self.state_store = StateStore(config.cache_dir, signing_key(config.worker_token) if config.worker_token else None)
        self.initial_persisted: tuple[dict, dict] | None = None  # (state, apply result) when served from disk at start
        self.state_file_applied = False  # serve() applies it before uvicorn starts; an in-process worker, in the lifespan
        self.on_startup = self.app.on_startup  # async callables, run in order before serving
        self.on_shutdown = self.app.on_shutdown
        self.api_key_refresher = self._api_key_refresher()
        self.on_startup.append(self.load_initial_state)
        self.on_shutdown.append(self.close)

    async def _tune_garbage_collector(self) -> None:
        tune_garbage_collector()

    def _api_key_refresher(self) -> ApiKeyRefresher | None:
        """With SERVING_API_KEYS on, the console's active keys, fetched before serving and
        every SERVING_API_KEYS_REFRESH_S (a state-file worker has no console: no key is valid)."""
        config = self.config
        if config.api_keys == "off":
            return None
        if self.state_file is not None:
            logger.warning(event("api_keys_unavailable", reason=f"SERVING_API_KEYS={config.api_keys} with a state file: no console to fetch keys from"))
            return None
        http = httpx.Client(headers={"Authorization": f"Bearer {config.worker_token}"}, follow_redirects=False,
                            event_hooks={"request": [console_only(config.console_url)]},  # the token stays home
                            timeout=console_timeout(config.console_timeout_s))
        store = ApiKeyStore(config.cache_dir, api_keys_signing_key(config.worker_token)) if config.worker_token else None
        refresher = ApiKeyRefresher(self.app.api_keys, http, config.console_url + KEYS_PATH, config.api_keys_refresh_s, store)
        self.on_startup.append(refresher.start)
        self.on_shutdown.append(refresher.stop)
        return refresher

    def http_protocol(self) -> type:
        """The uvicorn protocol class, with this worker's connection limits."""
        config = self.config
        limits = HttpLimits(config.header_timeout_s, config.body_timeout_s, config.max_header_bytes, config.max_connections,
                            config.send_timeout_s, config.max_unsent_bytes)
        protocol = protocol_class(limits, config.coalesce_writes, self.drain, self.keepers)
        self.keepers.max_connections = protocol.limits.max_connections  # the cap as fitted to the open-file limit
        return protocol

    def follow_console(self, url: str) -> None:
        """Take states, artifacts and API keys from the console at ``url`` from now on: the
        control plane of a worker following runstack's record found that console moved."""
        self.config = dataclasses.replace(self.config, console_url=url)
        self.repository.config = self.config  # an artifact URL is judged against the console's origin
        self.console.follow(url)
        if self.api_key_refresher is not None:
            self.api_key_refresher.http.event_hooks = {"request": [console_only(url)]}
            self.api_key_refresher.url = url + KEYS_PATH

    async def apply(self, state: dict) -> dict:
        """Converge on a desired state; returns the ack body {generation, ok, error?, load_ms}."""
        return await self.repository.apply(state)

    async def load_initial_state(self) -> None:
        """The state file if given (its failure is fatal), else the console, else (the console
        cannot answer, or its state cannot be applied now) the state persisted at the last
        apply; the control plane reconciles, and acks what it could not apply. With neither,
        the worker stays not-ready until the console's state applies."""
        if self.state_file is not None:
            if not self.state_file_applied:
                await self.apply_state_file()
            return
        try:
            state = await asyncio.get_running_loop().run_in_executor(None, self.console.fetch_state)
        except StateError as exc:
            logger.warning(event("console_unavailable", reason=str(exc)))
            await self.load_persisted_state("the console's state could not be fetched")
            return
        result = await self.apply(state)
        if result["ok"]:
            return
        # An artifact the console cannot serve now: what was served last beats nothing.
        logger.warning(event("console_state_not_applied", generation=result["generation"], reason=result.get("error", "")[:300]))
        if result.get("kept"):
            await self.keep_persisted_models(state, result["kept"])
        else:
            await self.load_persisted_state("the console's state could not be applied")

    async def keep_persisted_models(self, state: dict, kept: list[str]) -> None:
        """The console's state serves but for ``kept`` models, whose versions failed: each
        serves what the persisted state had for it, when it had it and it loads; the
        reconcile then keeps them so (``Repository``: a failing model keeps what it served)."""
        try:
            persisted = await asyncio.to_thread(self.state_store.load)
        except PersistedStateRefused as refusal:
            logger.error(event("persisted_state_refused", path=str(self.state_store.path), reason=str(refusal)))
            return
        taken = with_entries_from(content_of(state), persisted, kept)
        earlier = sorted(name for name in kept if name in taken["models"])
        if earlier:
            result = await self.apply(taken)
            logger.warning(event("serving_persisted_models", models=earlier, ok=result["ok"], reason=result.get("error", "")[:300]))

    async def apply_state_file(self) -> None:
        """Serve the state file; StateError naming it and why when it cannot be read or applied."""
        result = await self.apply(read_state_file(self.state_file))
        if not result["ok"]:
            raise StateError(f"cannot apply state file {self.state_file}: {result['error']}")
        self.state_file_applied = True

    async def load_persisted_state(self, console_failure: str = "the console's state could not be fetched") -> None:
        """Serve the persisted state if it passes its checks; anything wrong is logged, never fatal,
        and said (with ``console_failure``) in every 503 until a state applies."""
        try:
            state = await asyncio.to_thread(self.state_store.load)
        except PersistedStateRefused as refusal:
            logger.error(event("persisted_state_refused", path=str(self.state_store.path), reason=str(refusal),
                               consequence="serving nothing until the console answers"))
            self.repository.serve_nothing_because(console_failure, "the persisted state was refused")
            return
        if state is None:
            logger.error(event("no_state", reason="no persisted state; serving nothing until the console answers"))
            self.repository.serve_nothing_because(console_failure, "there is no persisted state")
            return
        result = await self.apply(state)
        if not result["ok"]:
            logger.error(event("persisted_state_refused", path=str(self.state_store.path), reason=result["error"],
                               consequence="serving nothing until the console answers"))
            self.repository.serve_nothing_because(console_failure, "the persisted state could not be applied")
            return
        self.initial_persisted = (state, result)
        logger.warning(event("serving_persisted_state", generation=state["generation"], epoch=state.get("epoch"), digest=state["digest"]))

    async def close(self) -> None:
        await self.repository.close()

    def serve(self, host: str, port: int) -> None:
        # Last, once everything is loaded; only here, where this process is the server
        # (an in-process test worker leaves its host's collector alone).
        self.on_startup.append(self._tune_garbage_collector)
        server = DrainingServer(uvicorn.Config(
            self.app, host=host, port=port, loop="uvloop", lifespan="on",
            http=self.http_protocol(),
            ws="none",  # HTTP only: an upgrade is answered as a plain request (serving/http_protocol.py)
            # Nothing here reads the client address or scheme, so uvicorn's X-Forwarded-*
            # middleware would only cost a header scan and a coroutine per request (1.2 µs).
            proxy_headers=False,
            backlog=listen_backlog(self.config.max_connections),
            access_log=False, log_level=self.config.log_level, workers=1,
            log_config=None,  # uvicorn's lines go through our JSON handler (serving/logs.py) like every other
        ), self.drain, self.keepers)
        if self.state_file is None:
            server.run()
        else:
            self._serve_state_file(server)
        if server.exit_status:  # the drain's bound cut requests (serving/drain.py)
            sys.exit(server.exit_status)

    def _serve_state_file(self, server: DrainingServer) -> None:
        """``server.run()``, with the state file applied first, on the loop that then serves it
        (each loaded version's batcher runs there). Applied in the lifespan, a file that cannot
        be served was a logged traceback and uvicorn's exit 3; it is the operator's bad input,
        refused like a file that cannot be read: one line, exit 2."""
        with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
            try:
                # uvicorn's own handlers, as in its lifespan: a SIGTERM or Ctrl-C during the load
                # begins the drain, served out once the load ends (unhandled, it killed the worker
                # on the spot, or printed a KeyboardInterrupt traceback, its private directory left).
                with server.capture_signals():
                    runner.run(self.apply_state_file())
            except StateError as refusal:
                logger.error(event("bad_state_file", reason=str(refusal)))
                raise SystemExit(2) from None
            runner.run(server.serve())


GC_THRESHOLDS = (20_000, 50, 100)  # CPython's defaults: (700, 10, 10)


def tune_garbage_collector() -> None:
    """Freeze what start-up allocated (modules, sessions, the loaded state) out of every
    later collection, and collect the young generation every 20,000 allocations instead
    of every 700. Under thousands of connections each in-flight request keeps objects
    alive long enough to be promoted, and the default thresholds then spent a quarter of
    the event loop's time in the collector: at 2,048 connections the small model kept
    61-79 % of its 64-connection throughput with the defaults and 74-95 % with these,
    about what it keeps with the collector off (the worker of bench/overload_bench.py,
    alternating runs, docs/benchmarks.md). Cycles are still collected, in larger steps."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def configure_process(config: ServingConfig) -> None:
    """What a process that is a worker sets for itself: both entry points call it
    (``python -m serving.worker`` and ``manage.py serve``)."""
    configure_logging(config.log_level)
    # How soon a thread back from ONNX Runtime gets the GIL from the busy event loop.
    sys.setswitchinterval(config.switch_interval_s)


def leave_the_code_tree(config: ServingConfig, state_file: str | None) -> tuple[ServingConfig, str | None, Path]:
    """Make our own paths absolute, then move into an empty private directory before
    any model loads: ONNX Runtime resolves a file reference in a model against the
    working directory, which must hold nothing to read (serving.model_safety)."""
    config = dataclasses.replace(config, cache_dir=str(Path(config.cache_dir).resolve()))
    state_file = str(Path(state_file).resolve()) if state_file else None
    return config, state_file, enter_private_working_directory()


def private_directory_remover(directory: Path):
    """A shutdown hook removing the private directory. A forced stop (a second SIGTERM,
    serving/drain.py) re-raises the signal, so atexit may never run."""

    async def remove() -> None:
        shutil.rmtree(directory, ignore_errors=True)

    return remove


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serving.worker", description="Run a model serving worker.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8001)
    parser.add_argument("--state-file", help="desired-state JSON to serve instead of asking the console")
    args = parser.parse_args(argv)
    try:
        config = ServingConfig.from_env()
    except SettingError as error:  # one log line naming the variable, not a traceback
        configure_logging("info")
        logger.error(event("bad_setting", reason=str(error)))
        raise SystemExit(2) from None
    if args.state_file is not None:  # read again at start-up; a typo in its path is said here, not in a logged traceback
        try:
            read_state_file(args.state_file)
        except StateError as error:
            configure_logging("info")
            logger.error(event("bad_state_file", reason=str(error)))
            raise SystemExit(2) from None
    problem = listen_problem(args.host, args.port)  # before the models load
    if problem is not None:
        configure_logging("info")
        logger.error(event("cannot_listen", reason=listen_refusal(args.host, args.port, problem, TAKEN_HINT)))
        raise SystemExit(2)
    configure_process(config)
    config, state_file, private_directory = leave_the_code_tree(config, args.state_file)  # as `manage.py serve` does
    try:
        worker = Worker(config, state_file)
    except SettingError as error:  # a device this machine lacks (SERVING_DEVICE=cuda), found when the engine starts
        configure_logging("info")
        logger.error(event("bad_setting", reason=str(error)))
        raise SystemExit(2) from None
    worker.on_shutdown.append(private_directory_remover(private_directory))
    worker.serve(args.host, args.port)


if __name__ == "__main__":
    main()
