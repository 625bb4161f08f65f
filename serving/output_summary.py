"""What a loaded version answered, summarised per report interval, for the canary analysis.

Per output, in the signature's order:

- ``classes``: a float output declared ``[rows, C]`` with 2 <= C <= 256 (class scores)
  counts each row's top class (``counts[c]``); an integer output declared ``[rows]`` or
  ``[rows, 1]`` (labels) counts each value in [0, 256) and, in ``other``, the rest.
  Label counts are cut after the highest class seen; a class past the end counted zero.
- ``values``: any other numeric output: ``count`` and ``sum`` of its finite elements,
  ``non_finite`` (NaN, ±inf), and ``sample``, a uniform random sample, without
  replacement, of at most SAMPLE_SIZE finite elements of the interval.
- bool, string and bfloat16 outputs are not summarised.

The kind is decided once, from the declared signature, so it never changes between
batches. Fed on the dispatch thread with a batch's outputs, right after a model call that
is answered whole (``serving.batch_run``), less the rows of requests that named the
version (pinned: they are answered, not summarised, so a client cannot steer what the
canary analysis compares): NumPy over the batch, no Python work per row or request,
inputs never read. Memory is fixed: C or 256 counts, or SAMPLE_SIZE
values, per output.

The sample is a reservoir merged batch by batch: each batch offers a uniform subset of
at most SAMPLE_SIZE of its finite elements, in random order (``Generator.choice``,
O(SAMPLE_SIZE)), and the merge takes a hypergeometric share of the interval's sample
and the batch's (the heads of both), which keeps the result a uniform sample of
everything the interval saw. No random number per element. Measured on one core:
~2 µs a [32, 10] class-score batch, ~4 µs a [32] label batch, ~15 µs a [32, 10] values
batch, ~30 µs a [32, 1000] one.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
from collections.abc import Sequence

import numpy as np

from serving.contract import MAX_CLASSES, MAX_NAME_CHARS, MAX_REPORTED_OUTPUTS
from serving.engine import TensorSpec

logger = logging.getLogger("serving.output_summary")

SAMPLE_SIZE = 64
HYPERGEOMETRIC_LIMIT = 10**9  # numpy's hypergeometric takes fewer than 10**9 of each kind

_local = threading.local()  # one Generator per dispatch thread: a Generator is not thread-safe


def _rng() -> np.random.Generator:
    rng = getattr(_local, "rng", None)
    if rng is None:
        rng = _local.rng = np.random.default_rng()
    return rng


# ---- one output's tally for one interval --------------------------------------------------


class ClassTally:
    """Top-class counts of class scores ([rows, width] floats), or label counts."""

    kind = "classes"

    def __init__(self, name: str, width: int, labels: bool):
        self.name, self.width, self.labels = name, width, labels
        self.counts = np.zeros(width, np.int64)
        self.other = 0

    def fresh(self) -> ClassTally:
        return ClassTally(self.name, self.width, self.labels)

    def of_batch(self, array: np.ndarray):
        """This batch's (counts, other), or None when the array is not of the declared shape."""
        if self.labels:
            if array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[1] != 1):
                return None
            flat = array.reshape(-1)
            inside = flat[(flat >= 0) & (flat < self.width)]
            return np.bincount(inside.astype(np.intp, copy=False), minlength=self.width), flat.size - inside.size
        if array.ndim != 2 or array.shape[1] != self.width:
            return None
        return np.bincount(array.argmax(axis=1), minlength=self.width), 0

    def merge(self, part, rng: np.random.Generator) -> None:
        counts, other = part
        self.counts += counts
        self.other += int(other)

    def figures(self) -> dict:
        counts = self.counts
        if self.labels:  # cut after the highest label seen: most label sets are far below 256
            seen = np.flatnonzero(counts)
            counts = counts[: seen[-1] + 1] if seen.size else counts[:0]
        return {"name": self.name, "kind": self.kind, "counts": counts.tolist(), "other": self.other}


class ValueTally:
    """Count, sum and non-finite count of the elements, and a uniform sample of them."""

    kind = "values"

    def __init__(self, name: str):
        self.name = name
        self.count = 0  # finite elements
        self.sum = 0.0
        self.non_finite = 0
        self.sample = np.empty(0, np.float64)  # a uniform subset of the `count` finite elements, in random order

    def fresh(self) -> ValueTally:
        return ValueTally(self.name)

    def of_batch(self, array: np.ndarray):
        flat = array.reshape(-1)
        if np.issubdtype(flat.dtype, np.floating):
            finite_mask = np.isfinite(flat)
            finite = flat if finite_mask.all() else flat[finite_mask]
        else:
            finite = flat
        count = finite.size
        # A uniform subset, in random order (both `choice` and `permutation` shuffle).
        offered = _rng().choice(finite, SAMPLE_SIZE, replace=False) if count > SAMPLE_SIZE else _rng().permutation(finite)
        with np.errstate(over="ignore"):  # an overflowing sum saturates when taken (`_finite`)
            total = float(finite.sum(dtype=np.float64))
        return count, total, flat.size - count, offered.astype(np.float64)

    def merge(self, part, rng: np.random.Generator) -> None:
        count, total, non_finite, offered = part
        seen = self.count
        self.count, self.sum, self.non_finite = seen + count, self.sum + total, self.non_finite + non_finite
        if count == 0:
            return
        if seen == 0:
            self.sample = offered
            return
        size = min(SAMPLE_SIZE, seen + count)
        from_batch = _share(rng, count, seen, size, len(offered), len(self.sample))
        # Both are in random order, so their heads are uniform subsets; the shuffle keeps
        # the merged sample in random order for the next merge.
        self.sample = np.concatenate((self.sample[: size - from_batch], offered[:from_batch]))
        rng.shuffle(self.sample)

    def figures(self) -> dict:
        return {"name": self.name, "kind": self.kind, "count": self.count, "sum": _finite(self.sum),
                "non_finite": self.non_finite, "sample": self.sample.tolist()}


def _share(rng: np.random.Generator, new: int, old: int, size: int, new_offered: int, old_kept: int) -> int:
    """How many of a uniform `size`-sample of old+new elements are new ones: hypergeometric.
    Past numpy's limit, the binomial it tends to, kept within what each side holds."""
    if new < HYPERGEOMETRIC_LIMIT and old < HYPERGEOMETRIC_LIMIT:
        return int(rng.hypergeometric(new, old, size))
    return min(new_offered, max(size - old_kept, int(rng.binomial(size, new / (new + old)))))


def _finite(total: float) -> float:
    """A sum of finite elements can still overflow a float: it saturates (the contract
    takes finite numbers only), and +inf meeting -inf reads as 0."""
    if math.isfinite(total):
        return total
    return 0.0 if math.isnan(total) else math.copysign(sys.float_info.max, total)


def tally_for(spec: TensorSpec) -> ClassTally | ValueTally | None:
    """The tally an output gets from its declared type and shape; None: not summarised."""
    dtype = spec.dtype
    if dtype is None or dtype == np.bool_:  # strings, bfloat16, bool
        return None
    name = spec.name[:MAX_NAME_CHARS]
    shape = spec.shape
    if np.issubdtype(dtype, np.floating) and len(shape) == 2 and isinstance(shape[1], int) and 2 <= shape[1] <= MAX_CLASSES:
        return ClassTally(name, shape[1], labels=False)
    if np.issubdtype(dtype, np.integer) and (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
        return ClassTally(name, MAX_CLASSES, labels=True)
    return ValueTally(name)


# ---- a version's summary -----------------------------------------------------------------


class OutputSummary:
    """A loaded version's outputs since the last `take()`; fed from any dispatch thread."""

    def __init__(self, outputs: Sequence[TensorSpec]):
        tallies = [(index, tally_for(spec)) for index, spec in enumerate(outputs)]
        # (output index, its tally's first instance): what each batch's figures are read with
        self._summarised = [(index, tally) for index, tally in tallies if tally is not None][:MAX_REPORTED_OUTPUTS]
        self._output_count = len(outputs)
        self._lock = threading.Lock()
        self._batches = 0
        self._tallies = [tally for _, tally in self._summarised]
        self._rng = np.random.default_rng()  # used under the lock only
        self._failed = False

    def add(self, outputs: Sequence[np.ndarray], rows: int | None = None, keep: np.ndarray | None = None) -> None:
        """One batch's outputs. ``rows``: the batch's input rows when its outputs are to be
        sliced back per row; a batch whose outputs do not have that many is not answered as
        run (it is split and run again), so it is not counted. ``keep``: a boolean mask of
        those rows to summarise (None: all); a batch with none kept is not counted. Never
        raises: a summary must not fail a batch that ran."""
        try:
            if len(outputs) != self._output_count:
                return
            if rows is not None and any(output.shape[:1] != (rows,) for output in outputs):
                return
            if keep is not None:
                if rows is None or keep.shape != (rows,) or not keep.any():
                    return
                outputs = [output[keep] for output in outputs]
            parts = [(position, tally.of_batch(outputs[index])) for position, (index, tally) in enumerate(self._summarised)]
            with self._lock:
                self._batches += 1
                for position, part in parts:
                    if part is not None:
                        self._tallies[position].merge(part, self._rng)
        except Exception:  # the answers matter more than their summary
            if not self._failed:  # once per version: this runs per batch
                self._failed = True
                logger.exception("summarising a batch's outputs failed (logged once per version)")

    def take(self) -> list[dict]:
        """The figures since the previous take (empty when no batch ran), and start afresh."""
        with self._lock:
            tallies, batches = self._tallies, self._batches
            self._tallies, self._batches = [tally.fresh() for tally in tallies], 0
        return [tally.figures() for tally in tallies] if batches else []
