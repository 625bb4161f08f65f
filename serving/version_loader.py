"""Loading one version: fetch and verify its artifact, re-check the bytes, create the
ONNX Runtime session, check it against the console's signature, warm every batch size.

Each step that can fail for a reason about this version (a download, a hostile file, a
model ONNX Runtime refuses, a signature that names other tensors, a warm-up that raises
anything at all) raises `LoadError` naming the version, so the repository can keep the
previous routes serving and apply every other model's change.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from serving.config import ServingConfig
from serving.console_client import ArtifactError
from serving.dispatch import lower_priority
from serving.engine import Engine, WarmTimedOut
from serving.errors import LoadError
from serving.loaded_version import LoadedVersion
from serving.model_safety import UnsafeModel

if TYPE_CHECKING:  # a type only: the repository imports this module
    from serving.serving_plan import VersionSpec

ORT_ERRORS = (ort_errors.Fail, ort_errors.InvalidArgument, ort_errors.InvalidProtobuf, ort_errors.InvalidGraph,
              ort_errors.NoSuchFile, ort_errors.NotImplemented, ort_errors.RuntimeException, RuntimeError)
FetchFn = Callable[[str, str, Path], Path]  # (artifact_url, sha256, cache path) -> verified file


async def load_version(spec: VersionSpec, config: ServingConfig, device: str, fetch: FetchFn) -> LoadedVersion:
    """A loaded, warm version whose latency model has learned from the warm-up runs."""
    loop = asyncio.get_running_loop()
    _refuse_not_retried(spec)
    try:
        model_bytes = await loop.run_in_executor(None, _fetch_verified, spec, config, fetch)
        engine = await loop.run_in_executor(None, build_engine, model_bytes, config, device)
        _check_signature(spec, engine)
        version = LoadedVersion(spec, engine, config)
        try:
            samples = await warm_in_time(version, version.policy.max_batch_size, 1, config.warm_timeout_s)
        except BaseException:
            version.close()
            raise
    except (ArtifactError, OSError) as exc:
        raise LoadError(f"{spec.model_name} v{spec.version}: {exc}") from None
    except UnsafeModel as exc:  # the worker's own check, before any session exists
        raise LoadError(f"{spec.model_name} v{spec.version}: refused to load the model: {exc.reason}") from None
    except ORT_ERRORS as exc:
        raise LoadError(f"{spec.model_name} v{spec.version}: ONNX Runtime refused the model: {exc}") from None
    except LoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a model makes the runtime or NumPy raise
        # Any kind that escaped here failed the whole apply, every other model's change
        # with it (an output of 65 dimensions raised ValueError in session.run while warming):
        # a failure to load one version is that version's, whatever raised it.
        raise LoadError(f"{spec.model_name} v{spec.version}: loading it failed: {type(exc).__name__}: {str(exc)[:200]}") from None
    for rows, seconds in samples:
        version.latency.observe(rows, seconds)
    return version


# Past SERVING_WARM_TIMEOUT_S the run under way is told to stop (RunOptions.terminate), which
# ONNX Runtime checks between nodes; one op that runs for ever never returns. The apply does
# not wait for it past this grace: the thread is left to run, its model not tried again.
WARM_STOP_GRACE_S = 5.0
# A model whose warm-up timed out is not warmed again for this long: every reconcile (3 s)
# tried, a core busy for SERVING_WARM_TIMEOUT_S each time and every later state, another
# model's rollback included, waiting that long to be refused with it.
WARM_RETRY_AFTER_S = 300.0
_NOT_RETRIED: dict[str, tuple[float, float, str]] = {}  # sha256 -> (when, how long not tried again, why)


async def warm_in_time(version: LoadedVersion, max_batch_size: int, start: int, timeout_s: float) -> list:
    """``version``'s warm-up from batch size ``start`` to ``max_batch_size``, within ``timeout_s``
    (plus the grace); LoadError naming it otherwise, and its model not warmed again for a
    while (a run stopped) or until a restart (a run that would not stop)."""
    spec, loop = version.spec, asyncio.get_running_loop()
    warm = loop.run_in_executor(None, version.engine.warm, max_batch_size, start, timeout_s)
    try:
        return await asyncio.wait_for(asyncio.shield(warm), timeout_s + WARM_STOP_GRACE_S)
    except WarmTimedOut as exc:
        _NOT_RETRIED[spec.sha256] = (time.monotonic(), WARM_RETRY_AFTER_S, str(exc))
        raise LoadError(f"{spec.model_name} v{spec.version}: {exc}") from None
    except TimeoutError:
        why = (f"the warm-up ran past SERVING_WARM_TIMEOUT_S ({timeout_s:g} s) and ONNX Runtime did not stop it within "
               f"{WARM_STOP_GRACE_S:g} s more")
        _NOT_RETRIED[spec.sha256] = (time.monotonic(), math.inf, "its warm-up ran past SERVING_WARM_TIMEOUT_S earlier and could "
                                                                 "not be stopped; its thread still runs")
        raise LoadError(f"{spec.model_name} v{spec.version}: {why}; its thread is left running and the model is not tried again "
                        "until this worker restarts") from None


def _refuse_not_retried(spec: VersionSpec) -> None:
    when, for_s, why = _NOT_RETRIED.get(spec.sha256, (0.0, 0.0, ""))
    ago_s = time.monotonic() - when
    if not why or ago_s >= for_s:
        _NOT_RETRIED.pop(spec.sha256, None)
        return
    if math.isinf(for_s):
        raise LoadError(f"{spec.model_name} v{spec.version}: {why}, so it is not tried again until this worker restarts")
    raise LoadError(f"{spec.model_name} v{spec.version}: {why} ({ago_s:.0f} s ago; tried again {for_s - ago_s:.0f} s "
                    "from now, or at once when this worker restarts)")


def _fetch_verified(spec: VersionSpec, config: ServingConfig, fetch: FetchFn) -> bytes:
    path = fetch(spec.artifact_url, spec.sha256, Path(config.cache_dir) / f"{spec.sha256}.onnx")
    model_bytes = path.read_bytes()
    # Hash what we load, not just what we fetched: the file could change in between.
    if hashlib.sha256(model_bytes).hexdigest() != spec.sha256:
        raise ArtifactError(f"sha256 of {path} changed after verification")
    return model_bytes


def build_engine(model_bytes: bytes, config: ServingConfig, device: str) -> Engine:
    """The session, created in a thread at the compute priority when SERVING_COMPUTE_NICE
    is set: ONNX Runtime's intra-op threads start with (inherit) the creator's priority."""
    if config.compute_nice <= 0:
        return Engine(model_bytes, config, device)
    outcome: dict = {}

    def build() -> None:
        lower_priority(config.compute_nice)
        try:
            outcome["engine"] = Engine(model_bytes, config, device)
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=build, name="onnx-load")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["engine"]


def _check_signature(spec: VersionSpec, engine: Engine) -> None:
    """The console's signature, when given, must name the model's own inputs and outputs."""
    signature = orjson.loads(spec.signature)
    for side, actual in (("inputs", engine.inputs), ("outputs", engine.outputs)):
        declared = signature.get(side) if isinstance(signature, dict) else None
        if not declared:
            continue
        declared_names = [item.get("name") for item in declared if isinstance(item, dict)]
        actual_names = [tensor.name for tensor in actual]
        if declared_names != actual_names:
            raise LoadError(f"{spec.model_name} v{spec.version}: signature {side} {declared_names} "
                            f"do not match the model's {actual_names}")
    # Uploads refuse these; a version registered before that refusal existed is named, not warmed.
    undecodable = [f"'{tensor.name}' ({tensor.datatype})" for tensor in engine.inputs if tensor.dtype is None]
    if undecodable:
        raise LoadError(f"{spec.model_name} v{spec.version}: input {', '.join(undecodable)} has a datatype no request "
                        "can be decoded as; the version cannot be served")
