"""What each batch reports: counts, the version's batch metrics, and a debug log line.

Called once per batch that ran whole, on the event loop, after its answers are set. The
version's Triton statistics (`metrics.InferenceStats`) are folded here too, once a batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from serving.batch_policy import PendingRequest
from serving.metrics import observe_many

# The batching path logs as one subsystem, under the name it always had.
logger = logging.getLogger("serving.batcher")


@dataclass(eq=False)
class BatchObserver:
    """Hooks for metrics and logs; the default does nothing (tests, benchmarks)."""

    model_name: str = ""
    version: int = 0
    metrics: object | None = None
    counts: dict = field(default_factory=lambda: {"batches": 0, "rows": 0, "max_rows": 0})

    def on_batch(self, requests: Sequence[PendingRequest], started_s: float, compute_s: float, depth: int) -> None:
        rows = sum(request.rows for request in requests)
        self.counts["batches"] += 1
        self.counts["rows"] += rows
        self.counts["max_rows"] = max(self.counts["max_rows"], rows)
        if self.metrics is not None:
            self._record(requests, started_s, compute_s, rows, depth)
        if logger.isEnabledFor(logging.DEBUG):  # per batch: at 10k req/s, INFO would be ~20 GB a day
            logger.debug(orjson.dumps({
                "event": "batch", "model": self.model_name, "version": self.version, "rows": rows,
                "compute_ms": round(compute_s * 1000, 3), "request_ids": [r.request_id for r in requests],
            }).decode())

    def _record(self, requests, started_s, compute_s, rows, depth) -> None:
        self.metrics.batch_size.observe(rows)
        self.metrics.compute_time.observe(compute_s)
        self.metrics.queue_depth.set(depth)
        queue_s = observe_many(self.metrics.queue_time, [started_s - request.enqueued_s for request in requests])
        self.metrics.stats.batch_ran(len(requests), rows, queue_s, compute_s, started_s)
