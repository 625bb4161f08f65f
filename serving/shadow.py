"""Shadow traffic: mirror a fraction of a model's routed requests to a shadow version
after the client has its answer, and count how often the two agree.

Never on the client's time: the mirror is scheduled after the response is built, and it
is dropped first under load (when either version's queue is busy). The agreement counts
are what the canary analysis reads.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import numpy as np
from prometheus_client import Counter

logger = logging.getLogger("serving.shadow")

COMPARISONS = Counter(
    "modelops_shadow_comparisons", "Shadow runs compared with the served answer, by result.", ["model", "version", "result"]
)
ABS_TOLERANCE = 1e-3
SHADOW_TIMEOUT_S = 2.0


def outputs_agree(served: list[np.ndarray], shadow: list[np.ndarray], tolerance: float = ABS_TOLERANCE) -> bool:
    """Same top class for class-score outputs ([rows, classes]); else every value within tolerance."""
    if len(served) != len(shadow):
        return False
    return all(_tensor_agrees(a, b, tolerance) for a, b in zip(served, shadow))


def _tensor_agrees(served: np.ndarray, shadow: np.ndarray, tolerance: float) -> bool:
    if served.shape != shadow.shape:
        return False
    if served.ndim == 2 and served.shape[1] > 1 and np.issubdtype(served.dtype, np.floating):
        return bool(np.array_equal(served.argmax(axis=1), shadow.argmax(axis=1)))
    if np.issubdtype(served.dtype, np.number):
        return bool(np.max(np.abs(served.astype(np.float64) - shadow.astype(np.float64)), initial=0.0) <= tolerance)
    return bool(np.array_equal(served, shadow))


class ShadowMirror:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()  # held so running mirrors are not collected

    def after_response(self, routes, served, decoded, outputs) -> None:
        for version, fraction in routes.shadows:
            target = routes.targets.get(version)
            if target is None or target is served or random.random() >= fraction:
                continue
            if _busy(served) or _busy(target):
                COMPARISONS.labels(target.model_name, str(version), "dropped").inc()
                continue
            task = asyncio.get_running_loop().create_task(self._mirror(target, decoded, outputs))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait for the mirrors already scheduled; False if some were still running at
        the timeout. Lets a caller (a test, a shutdown) know every comparison is counted."""
        pending = set(self._tasks)
        if not pending:
            return True
        _, still_running = await asyncio.wait(pending, timeout=timeout_s)
        return not still_running

    async def _mirror(self, target, decoded, served_outputs) -> None:
        labels = (target.model_name, str(target.version))
        target.hold()
        try:
            shadow_outputs = await target.submit(decoded, time.monotonic() + SHADOW_TIMEOUT_S, "shadow")
        except Exception as error:  # noqa: BLE001 - a failing shadow must never reach clients
            logger.debug("shadow run of %s v%s failed: %s", *labels, error)
            COMPARISONS.labels(*labels, "error").inc()
            return
        finally:
            target.release()
        result = "agree" if outputs_agree(list(served_outputs), list(shadow_outputs)) else "disagree"
        COMPARISONS.labels(*labels, result).inc()


def _busy(version) -> bool:
    return version.queue_depth >= version.policy.max_batch_size
