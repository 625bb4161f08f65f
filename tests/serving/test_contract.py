"""The console–worker contract (serving/contract.py): one shape for both sides, refusals
that name the offending field, and a version that both sides check before anything else."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

import httpx
import numpy as np
import orjson
import pytest
from serving_testkit import make_config, route, state

from serving.contract import (
    CONTRACT_VERSION,
    Ack,
    BatchPolicy,
    ContractError,
    DesiredState,
    LoadedEntry,
    ModelState,
    Route,
    WarmVersion,
    WorkerIdentity,
    WorkerReport,
)
from serving.control import ControlPlane
from serving.protocol import Decoded
from serving.serving_plan import parse_state
from serving.state_signing import (
    SignatureRefused,
    signing_key,
    state_digest,
    verify_push,
)
from serving.state_store import PersistedStateRefused, StateStore
from serving.worker import Worker
from tests.fixtures.push_key import CONSOLE_PUSH_KEY, PUSH_KEY_HEADERS, signed_push

V = CONTRACT_VERSION
TOKEN = "worker-token-for-tests"
CONSOLE = "http://console.test:8000"
SHA = "ab" * 32


def iris() -> dict:
    """A state as the console sends it: a canary, a shadow, a warm rollback target."""
    return DesiredState(generation=4, epoch="e", models={"iris": ModelState(
        generation=4,
        routes=(Route(1, 90, SHA, "/api/models/iris/versions/1/artifact"), Route(2, 10, "cd" * 32, "/api/models/iris/versions/2/artifact"),
                Route(3, 0, "ef" * 32, "/api/models/iris/versions/3/artifact", shadow=0.5)),
        warm=(WarmVersion(4, "01" * 32, "/api/models/iris/versions/4/artifact"),),
        batching=BatchPolicy(max_batch_size=8, max_queue_delay_s=0.001, max_queue_size=64, latency_target_s=0.05),
    )}).to_dict()


def changed(path: str, value: object) -> dict:
    """``iris()`` with the field at ``path`` (dots and [index]) set to ``value``, or removed if ``...``."""
    document = iris()
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    target = document
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    key = int(last) if isinstance(target, list) else last
    if value is ...:
        del target[key]
    else:
        target[key] = value
    return document


# ---- parsing: each refusal names its field ---------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("contract", ..., f"contract: missing: this side speaks contract {V}, the message names none"),
        ("contract", V + 1, f"contract: the message speaks contract {V + 1}, this side speaks contract {V}"),
        ("contract", True, f"contract: the message speaks contract True, this side speaks contract {V}"),
        ("generation", "4", "generation: must be an integer"),
        ("generation", -1, "generation: must be an integer >= 0"),
        ("epoch", 7, "epoch: must be a string"),
        ("digest", "zz", "digest: must be 64 lowercase hex characters"),
        ("models", [], "models: must be an object"),
        ("models.iris", "all", "models.iris: must be an object"),
        ("models.iris.routes", ..., "models.iris.routes: missing"),
        ("models.iris.routes[1].sha256", "CD" * 32, "models.iris.routes[1].sha256: must be 64 lowercase hex characters"),
        ("models.iris.routes[1].sha256", "cd" * 31, "models.iris.routes[1].sha256: must be 64 lowercase hex characters"),
        ("models.iris.routes[0].version", True, "models.iris.routes[0].version: must be an integer"),
        ("models.iris.routes[0].weight", 101, "models.iris.routes[0].weight: must be an integer 0..100"),
        ("models.iris.routes[0].weight", ..., "models.iris.routes[0].weight: missing"),
        ("models.iris.routes[0].artifact_url", "", "models.iris.routes[0].artifact_url: must not be empty"),
        ("models.iris.routes[0].signature", [1], "models.iris.routes[0].signature: must be an object"),
        ("models.iris.routes[2].shadow", 1.5, "models.iris.routes[2].shadow: must be a fraction in (0, 1]"),
        ("models.iris.routes[2].shadow", True, "models.iris.routes[2].shadow: must be a fraction in (0, 1]"),
        ("models.iris.routes[1].version", 1, "models.iris.routes[1].version: version 1 is routed twice"),
        ("models.iris.warm[0]", "v4", "models.iris.warm[0]: must be a version number or a version object"),
        ("models.iris.warm[0].sha256", ..., "models.iris.warm[0].sha256: missing"),
        ("models.iris.batching", 8, "models.iris.batching: must be an object"),
        ("models.iris.batching.max_batch_size", 0, "models.iris.batching.max_batch_size: must be at least 1"),
        ("models.iris.batching.max_batch_size", 8.5, "models.iris.batching.max_batch_size: must be an integer"),
        ("models.iris.batching.max_queue_size", 0, "models.iris.batching.max_queue_size: must be at least 1"),
        ("models.iris.batching.max_queue_delay_s", -0.1, "models.iris.batching.max_queue_delay_s: must not be negative"),
        ("models.iris.batching.max_queue_delay_s", "fast", "models.iris.batching.max_queue_delay_s: must be a finite number"),
        ("models.iris.batching.latency_target_s", 0, "models.iris.batching.latency_target_s: must be positive (or null: no target)"),
    ],
)
def test_a_state_breaking_the_contract_is_refused_naming_the_field(path, value, message):
    with pytest.raises(ContractError) as refusal:
        DesiredState.parse(changed(path, value))

    assert str(refusal.value) == message


def test_something_that_is_not_an_object_is_not_a_state():
    with pytest.raises(ContractError, match=r"^state: must be an object$"):
        DesiredState.parse([iris()])


def test_the_worker_refuses_an_artifact_off_the_consoles_origin_naming_the_field(tmp_path):
    document = changed("models.iris.routes[1].artifact_url", "http://elsewhere.test/model.onnx")

    with pytest.raises(ContractError, match=r"^models\.iris\.routes\[1\]\.artifact_url: .*not on the console's origin"):
        parse_state(document, make_config(tmp_path, console_url=CONSOLE, allow_local_artifacts=False))


def test_batching_left_out_takes_the_workers_own_settings(tmp_path):
    document = changed("models.iris.batching", ...)
    config = make_config(tmp_path, console_url=CONSOLE, max_batch_size=7, max_queue_delay_s=0.004, max_queue_size=99)

    _, desired = parse_state(document, config)

    assert {spec.policy for spec in desired.versions} == {BatchPolicy(7, 0.004, 99, None)}


@pytest.mark.parametrize(
    ("parse", "message", "expected"),
    [
        (Ack.parse, {"worker": "w", "generation": 1, "digest": SHA, "ok": True}, "contract: missing"),
        (Ack.parse, {"worker": "w", "generation": 1, "digest": SHA, "ok": "yes", "contract": V}, "ok: must be true or false"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "contract": V + 2}, f"contract: the message speaks contract {V + 2}, this side speaks contract {V}"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "loaded": [{"model": "iris", "version": 0}], "contract": V},
         "loaded[0].version: must be an integer >= 1"),
        (WorkerReport.parse, {"worker": {"id": ""}, "contract": V}, "worker.id: must not be empty"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "models": [SHA], "contract": V}, "models: must be an object"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "models": {"iris": "AB" * 32}, "contract": V},
         "models.iris: must be 64 lowercase hex characters"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "models": {"": SHA}, "contract": V}, "models['']: must be a model name"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "models": {"m" * 101: SHA}, "contract": V}, "models['mmmm"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "models": {"<b>x</b>": SHA}, "contract": V}, "models['<b>x</b>']: must be a model name"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "models": {"\ud800x": SHA}, "contract": V}, "models['\\ud800x']: must be a model name"),
        (WorkerReport.parse, {"worker": {"id": "w", "host": "\udfff"}, "contract": V}, "worker.host: must be text (no lone surrogates)"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "loaded": [{"model": "a\ud800", "version": 1}], "contract": V},
         "loaded[0].model: must be a model name (1 to 100 letters, digits, - or _)"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "loaded": [{"model": "m" * 101, "version": 1}], "contract": V},
         "loaded[0].model: must be a model name"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "loaded": [{"model": "m", "version": 1}] * 4097, "contract": V},
         "loaded: must have at most 4096 items"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "shadow": [{}] * 65, "contract": V}, "shadow: must have at most 64 items"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "shadow": [{"model": "m", "version": 1, "compared": 1, "agreed": 2, "errors": 0,
                                                                 "dropped": 0}], "contract": V}, "shadow[0].agreed: must not exceed compared"),
        (WorkerReport.parse, {"worker": {"id": "w"}, "models": {f"m{index}": SHA for index in range(1025)}, "contract": V},
         "models: at most 1024 models"),
        # Shown on the Workers and Drills pages as sent: ESC sequences, a directional override.
        (WorkerReport.parse, {"worker": {"id": "w\x1b[2J"}, "contract": V},
         "worker.id: must be one line of text without control characters or directional overrides"),
        (WorkerReport.parse, {"worker": {"id": "w", "host": "gpu-\u202e7-host"}, "contract": V}, "worker.host: must be one line"),
        (WorkerReport.parse, {"worker": {"id": "w", "device": "cpu\x07"}, "contract": V}, "worker.device: must be one line"),
        (WorkerReport.parse, {"worker": {"id": "w", "url": "http://a\nb"}, "contract": V}, "worker.url: must be one line"),
        (Ack.parse, {"worker": "w\u2066", "generation": 1, "digest": SHA, "ok": True, "contract": V}, "worker: must be one line"),
    ],
)
def test_acks_and_reports_breaking_the_contract_are_refused_naming_the_field(parse, message, expected):
    with pytest.raises(ContractError) as refusal:
        parse(message)

    assert str(refusal.value).startswith(expected)


def test_an_acks_error_keeps_its_lines_and_shows_what_a_page_would_hide_as_replacement_characters():
    ack = Ack.parse({"worker": "w", "generation": 1, "digest": SHA, "ok": False, "contract": V,
                     "error": "iris v1: refused\n\tat node 3 \x1b[31mred\x1b[0m \u202etxt.exe"})

    assert ack.error == "iris v1: refused\n\tat node 3 \ufffd[31mred\ufffd[0m \ufffdtxt.exe"


FIGURES = {"model": "iris", "version": 1, "requests": 5, "errors": 1, "client_errors": 1, "ok": 3, "requests_per_s": 5.0,
           "latency_sum_s": 0.01, "latency_buckets": {"0.001": 4, "+Inf": 5}, "batch_size_buckets": {"1.0": 5, "+Inf": 5},
           "p50_ms": 1.0, "p99_ms": None, "queue_depth": 0,
           "outputs": [{"name": "probabilities", "kind": "classes", "counts": [2, 1, 0], "other": 0},
                       {"name": "score", "kind": "values", "count": 3, "sum": 1.5, "non_finite": 0, "sample": [0.5, 0.25, 0.75]}],
           "shadow": {"compared": 3, "agreed": 2, "errors": 0, "dropped": 1}}


def test_what_a_worker_sends_parses_back_whole():
    ack = Ack(worker="w-1", generation=3, digest=SHA, ok=False, epoch="e", error="sha256 mismatch", load_ms=1.5)
    report = WorkerReport(worker=WorkerIdentity("w-1", "box", 7, "http://w:8001", "cpu"), generation=3, digest=SHA, epoch="e",
                          loaded=(LoadedEntry("iris", 1, routed=True),), interval_s=1.0, versions=(FIGURES,),
                          requests_failed_total=0, device_memory_bytes=1024, models={"iris": SHA})

    assert Ack.parse(json.loads(json.dumps(ack.to_dict()))) == ack
    assert WorkerReport.parse(json.loads(json.dumps(report.to_dict()))) == report


# ---- the console's state, as the worker reads it ---------------------------------------


@pytest.fixture
def console_model(db, settings):
    """``iris`` as the console holds it: v2 at 100 % with v3 a shadow, after v1 alone (the
    rollback target, so v1 is kept warm)."""
    from registry.actions import releases
    from registry.domain.choices import VersionStatus
    from registry.models import ModelVersion, RegisteredModel
    from tests.fixtures.store import stand_in_file

    model = RegisteredModel.objects.create(name="iris", max_batch_size=8, max_queue_delay_s=0.003, latency_target_s=0.05)
    versions = [ModelVersion.objects.create(model=model, number=number, sha256=f"{number:064x}", size_bytes=1, status=VersionStatus.READY,
                                            signature={"inputs": [{"name": "x", "datatype": "FP32", "shape": [None, 4]}], "batchable": True})
                for number in (1, 2, 3)]
    for version in versions:
        stand_in_file(version.sha256, version.size_bytes)
    releases.route_first_version(versions[0], None)
    releases.set_routes(model, [{"version": 2, "weight": 100}, {"version": 3, "weight": 0, "shadow": 0.25}], None)
    return model


def test_the_state_the_console_builds_is_the_state_the_worker_parses(console_model, tmp_path, settings):
    from registry.fleet.state import current_state

    built = current_state()
    wire = orjson.loads(orjson.dumps(signed_push(built)))  # as pushed

    parsed = DesiredState.parse(wire)
    generation, desired = parse_state(wire, make_config(tmp_path, console_url=CONSOLE))

    assert parsed == built
    assert state_digest(parsed) == built.digest == wire["digest"]
    assert generation == built.generation == 2
    assert [entry.version for entry in parsed.models["iris"].warm] == [1]
    assert dict(desired.weights) == {"iris": ((2, 100), (3, 0))}
    assert dict(desired.shadows) == {"iris": ((3, 0.25),)}
    assert [(spec.version, spec.sha256, spec.artifact_url) for spec in desired.versions] == [
        (number, f"{number:064x}", f"{CONSOLE}/api/models/iris/versions/{number}/artifact") for number in (2, 3, 1)]  # v1 warm
    assert {spec.policy for spec in desired.versions} == {BatchPolicy(8, 0.003, settings.SERVING_DEFAULT_MAX_QUEUE_SIZE, 0.05)}


def test_the_digest_and_the_signature_cover_the_contract_version(console_model):
    from registry.fleet.state import current_state

    built = current_state()
    signed = signed_push(built)

    assert signed["contract"] == CONTRACT_VERSION
    assert state_digest(replace(built, contract=CONTRACT_VERSION + 1)) != built.digest
    with pytest.raises(SignatureRefused):
        verify_push({**signed, "contract": CONTRACT_VERSION + 1}, CONSOLE_PUSH_KEY.public_key())


# ---- a worker offered a state of another contract version ------------------------------


class FakeConsole:
    def __init__(self):
        self.state: dict = {}
        self.acks: list[dict] = []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/serving/state":
            return httpx.Response(200, json=self.state, headers=PUSH_KEY_HEADERS)
        if request.url.path == "/api/serving/acks":
            self.acks.append(json.loads(request.content))
        return httpx.Response(204)


@pytest.fixture
def console() -> FakeConsole:
    return FakeConsole()


@pytest.fixture
async def plane(tmp_path, console):
    """A real worker (repository, no HTTP server) with its control plane on the fake console."""
    worker = Worker(make_config(tmp_path, worker_token=TOKEN, console_url=CONSOLE))
    control = ControlPlane(worker, redis_url="", public_url="http://127.0.0.1:1", transport=console.transport)
    await control.start(run_loops=False)
    yield control
    await control.stop()
    await worker.close()


def digits(generation: int, mlp) -> dict:
    return state(generation, {"digits": {"routes": [route(1, 100, *mlp)]}}, epoch="e")


async def infer(control: ControlPlane) -> int:
    target = control.worker.repository.router.table.resolve("digits", None)
    await target.submit(Decoded((np.zeros((1, 64), np.float32),), 1), time.monotonic() + 5, "test")
    return target.version


@pytest.mark.parametrize("arrives_by", ["reconcile", "signed push"])
async def test_a_state_of_another_contract_version_is_refused_loudly_acked_and_the_worker_keeps_serving(plane, console, mlp_v1, mlp_v2, caplog,
                                                                                                        arrives_by):
    console.state = digits(1, mlp_v1)
    await plane.reconcile()
    newer = {**state(2, {"digits": {"routes": [route(2, 100, *mlp_v2)]}}, epoch="e"), "contract": CONTRACT_VERSION + 1}
    console.state = newer

    with caplog.at_level(logging.ERROR, logger="serving.repository"):
        result = await (plane.reconcile() if arrives_by == "reconcile" else plane.receive_push(signed_push(newer)))

    reason = f"contract: the message speaks contract {V + 1}, this side speaks contract {V}"
    assert (result["ok"], result["error"]) == (False, reason)
    assert [record.levelname for record in caplog.records if reason in record.getMessage()] == ["ERROR"]
    assert console.acks[-1] | {"load_ms": 0} == {"worker": plane.identity.id, "generation": 2, "digest": state_digest(newer),
                                                       "epoch": "e", "ok": False, "error": reason, "load_ms": 0, "contract": CONTRACT_VERSION}
    assert plane.worker.repository.generation == 1
    assert await infer(plane) == 1


def test_a_persisted_state_of_another_contract_version_is_not_served(tmp_path, mlp_v1):
    store = StateStore(tmp_path, signing_key(TOKEN))
    store.save({**digits(1, mlp_v1), "contract": CONTRACT_VERSION + 1})  # written by another release of the worker

    with pytest.raises(PersistedStateRefused, match=f"contract: the message speaks contract {V + 1}, this side speaks contract {V}"):
        store.load()


def test_the_models_a_partly_applied_state_left_out_are_read_from_its_ack():
    from serving.contract import models_not_applied

    error = "applied but for big-digits (keeps the routes it served before), x_1 (not served here: it was not before): big-digits v2: bad"

    assert models_not_applied(error) == ["big-digits", "x_1"]
    assert models_not_applied("digits v2: sha256 mismatch (got a (b))") is None
    assert models_not_applied("") is None


def test_a_reports_shadow_entries_keep_their_counts_and_nothing_else():
    # Kept as sent, 64 entries of 38 kB of junk each made one worker's row 2.4 MB.
    entry = {"model": "m", "version": 2, "compared": 3, "agreed": 2, "errors": 0, "dropped": 1, "junk": "A" * 38_000}

    parsed = WorkerReport.parse({"worker": {"id": "w"}, "shadow": [entry], "contract": V})

    assert parsed.shadow == ({"model": "m", "version": 2, "compared": 3, "agreed": 2, "errors": 0, "dropped": 1},)
