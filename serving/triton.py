"""Triton's model-configuration and statistics documents, from what a worker has loaded.

Triton's own tools read these two documents (tritonclient's `get_model_config` and
`get_inference_statistics`, perf_analyzer, model_analyzer), so they follow the JSON that
Triton's HTTP server prints: the ModelConfig protobuf with its field names kept, every
primitive field printed, and 64-bit integers as JSON numbers (Triton turns protobuf's
strings back into numbers); the statistics with every count and duration a number and
the version a string. Pure functions: the data plane hands them the loaded version, the
worker's settings and the clock.

What is not measured is shown as zero, never guessed: `compute_input` and
`compute_output` (decoding and encoding run per request, on the event loop or, when large, in a thread; untimed), and
the response cache (there is none) are `{"count": 0, "ns": 0}`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the loaded version imports the engine and the batcher
    from serving.contract import BatchPolicy
    from serving.engine import TensorSpec
    from serving.loaded_version import LoadedVersion
    from serving.metrics import InferenceStats

PLATFORM, BACKEND = "onnxruntime_onnx", "onnxruntime"


def data_type(datatype: str) -> str:
    """The V2 datatype name as Triton's config spells it (BYTES is TYPE_STRING there)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


# ---- model configuration ---------------------------------------------------------------


def model_config(version: LoadedVersion, loaded_versions: Sequence[int], device: str, instance_count: int,
                 request_timeout_s: float) -> dict:
    """The config of one loaded version. `max_batch_size` is 0 for a version that runs each
    request alone; when it is above 0 the dims leave out the batch dimension, as Triton's do."""
    batchable = version.is_batchable
    document = {
        "name": version.model_name,
        "platform": PLATFORM,
        "backend": BACKEND,
        "runtime": "",
        # The console chooses which versions a worker loads: a specific list, not "latest".
        "version_policy": {"specific": {"versions": sorted(loaded_versions)}},
        "max_batch_size": version.policy.max_batch_size if batchable else 0,
        "input": [_input(spec, batchable) for spec in version.io.inputs],
        "output": [_output(spec, batchable) for spec in version.io.outputs],
        "batch_input": [],
        "batch_output": [],
        "instance_group": [_instance_group(version.model_name, device, instance_count)],
        "parameters": {"sha256": {"string_value": version.spec.sha256}},
        "model_warmup": [],
    }
    if batchable:
        document["dynamic_batching"] = _dynamic_batching(version.policy, request_timeout_s)
    return document


def _dims(spec: TensorSpec, batchable: bool) -> list[int]:
    shape = spec.metadata_shape
    return shape[1:] if batchable else shape


def _input(spec: TensorSpec, batchable: bool) -> dict:
    return {"name": spec.name, "data_type": data_type(spec.datatype), "format": "FORMAT_NONE",
            "dims": _dims(spec, batchable), "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False}


def _output(spec: TensorSpec, batchable: bool) -> dict:
    return {"name": spec.name, "data_type": data_type(spec.datatype), "dims": _dims(spec, batchable),
            "label_filename": "", "is_shape_tensor": False}


def _instance_group(model_name: str, device: str, count: int) -> dict:
    """One group: the version's dispatch threads (batches that run at once) on its device."""
    is_gpu = device.startswith("cuda:")
    return {"name": f"{model_name}_0", "kind": "KIND_GPU" if is_gpu else "KIND_CPU", "count": count,
            "gpus": [int(device.split(":", 1)[1])] if is_gpu else [], "secondary_devices": [], "profile": [],
            "passive": False, "host_policy": ""}


def _dynamic_batching(policy: BatchPolicy, request_timeout_s: float) -> dict:
    """The worker's real batching settings: a batch is sent at `max_batch_size` rows or when
    waiting no longer pays; a request past its deadline is refused (504), and a client may
    shorten the deadline (X-Request-Timeout-S or the request's `timeout` parameter)."""
    return {
        "preferred_batch_size": [policy.max_batch_size],
        "max_queue_delay_microseconds": round(policy.max_queue_delay_s * 1_000_000),
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": round(request_timeout_s * 1_000_000),
            "allow_timeout_override": True,
            "max_queue_size": policy.max_queue_size,
        },
        "priority_queue_policy": {},
    }


# ---- statistics ------------------------------------------------------------------------


def model_statistics(versions: Iterable[LoadedVersion], epoch_offset_s: float) -> dict:
    """`{"model_stats": [...]}` for `versions`; `epoch_offset_s` turns the batcher's monotonic
    clock into the wall clock (time.time() - time.monotonic())."""
    return {"model_stats": [model_stat(version, epoch_offset_s) for version in versions]}


def model_stat(version: LoadedVersion, epoch_offset_s: float) -> dict:
    stats: InferenceStats = version.metrics.stats
    last_ms = 0 if stats.last_batch_s is None else int((stats.last_batch_s + epoch_offset_s) * 1000)
    return {
        "name": version.model_name,
        "version": str(version.version),
        "last_inference": last_ms,
        "inference_count": stats.rows,
        "execution_count": stats.batches,
        "inference_stats": {
            "success": _duration(stats.success_count, stats.success_s),
            "fail": _duration(stats.fail_count, stats.fail_s),
            "queue": _duration(stats.queued_requests, stats.queue_s),
            "compute_input": _not_measured(),
            "compute_infer": _duration(stats.queued_requests, stats.compute_request_s),
            "compute_output": _not_measured(),
            "cache_hit": _not_measured(),
            "cache_miss": _not_measured(),
        },
        "batch_stats": [
            {"batch_size": rows, "compute_input": _not_measured(), "compute_infer": _duration(size.count, size.compute_s),
             "compute_output": _not_measured()}
            for rows, size in sorted(stats.by_batch_size.items())
        ],
    }


def _not_measured() -> dict:
    return {"count": 0, "ns": 0}


def _duration(count: int, seconds: float) -> dict:
    return {"count": count, "ns": round(seconds * 1_000_000_000)}
