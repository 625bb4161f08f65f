"""One batch, run and answered: a single model call over the requests' rows, the outputs
sliced back to their requests, and each request's answer set on its future.

A batch whose run fails, or whose outputs do not have one row per input row, is split
in halves and run again (`run_batch`), so one bad request fails alone and the others get
their answers. A version not proven batchable never has requests concatenated.

A run that is answered whole is also handed to the version's output summary (`summarise`,
``serving.output_summary``), on the same dispatch thread, with only the rows of requests
the traffic split sent: a client that names the version (pinned) is answered from the
same run but cannot move what the canary analysis reads.
`run_batch` runs on a dispatch thread; `answer` runs on the event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from serving.batch_policy import PendingRequest
from serving.errors import ModelFailed, ServingError

# The batching path logs as one subsystem, under the name it always had.
logger = logging.getLogger("serving.batcher")

Outputs = tuple[np.ndarray, ...]
RunFn = Callable[[Outputs], Sequence[np.ndarray]]  # model inputs in order -> outputs in order
Outcome = tuple[list[Outputs | Exception], float | None]  # run_batch's (results, compute_s)
# (outputs, input rows or None when not sliced per row, rows to keep or None for all). It must
# not raise (OutputSummary.add never does): a raise here would read as the model's failure.
Summarise = Callable[[Sequence[np.ndarray], int | None, np.ndarray | None], None]


class OutputRowsMismatch(Exception):
    """A run's output does not have one row per input row, so it cannot be sliced back."""

    def __init__(self, output_index: int, rows: int, shape: tuple):
        super().__init__(f"output {output_index} has shape {list(shape)} for {rows} input rows")
        self.output_index, self.rows, self.shape = output_index, rows, shape


def run_batch(run: RunFn, requests: Sequence[PendingRequest], is_batchable: bool = True,
              summarise: Summarise | None = None) -> Outcome:
    """One run over the requests concatenated along the batch axis, outputs sliced back.

    Returns (results, compute_s). When the run fails, or its outputs do not have one row
    per input row, the batch is split in halves and each is run again, so one bad request
    fails alone and the others still get their answers: `results[i]` is then request i's
    outputs or the exception it failed with on its own, and `compute_s` is None (a split
    batch's time says nothing about the model's speed).
    """
    if len(requests) > 1 and not is_batchable:  # rows of different clients would mix: each runs alone
        return _run_halves(run, requests, is_batchable, summarise), None
    try:
        return _run_together(run, requests, is_batchable, summarise)
    except Exception as exc:  # ORT raises its own classes; the split tells whose input it was
        if len(requests) == 1:
            return [exc], None
        return _run_halves(run, requests, is_batchable, summarise), None


def _run_halves(run: RunFn, requests: Sequence[PendingRequest], is_batchable: bool,
                summarise: Summarise | None) -> list[Outputs | Exception]:
    """Bisect a failed batch: about 2·log2(n) runs find one bad request among n."""
    middle = len(requests) // 2
    results: list[Outputs | Exception] = []
    for half in (requests[:middle], requests[middle:]):
        results.extend(run_batch(run, half, is_batchable, summarise)[0])
    return results


def _run_together(run: RunFn, requests: Sequence[PendingRequest], is_batchable: bool,
                  summarise: Summarise | None) -> tuple[list[Outputs], float]:
    if len(requests) == 1:
        feeds = requests[0].inputs
    else:
        # A list, not a generator, behind the star: CPython builds a generator's argument
        # tuple at size 10 and resizes it to the batch's size, so every batch left one tuple
        # on the free list of that size. Those lists (2,000 tuples per size up to 20) took
        # ~12 minutes of load to fill: +4.6 MiB of RSS that read as a leak (bench/soak_bench.py).
        feeds = tuple(np.concatenate(parts) for parts in zip(*[request.inputs for request in requests]))
    started_s = time.perf_counter()
    outputs = run(feeds)
    compute_s = time.perf_counter() - started_s
    if not is_batchable:
        if summarise is not None and requests[0].summarised:
            summarise(outputs, None, None)
        return [tuple(outputs)], compute_s
    rows = sum(request.rows for request in requests)
    for index, output in enumerate(outputs):
        if output.shape[:1] != (rows,):  # reduced over the batch, or another axis first
            raise OutputRowsMismatch(index, rows, output.shape)
    if summarise is not None:
        summarise(outputs, rows, _summarised_rows(requests, rows))
    results, start = [], 0
    for request in requests:
        stop = start + request.rows
        results.append(tuple(output[start:stop] for output in outputs))  # views, no copies
        start = stop
    return results, compute_s


def _summarised_rows(requests: Sequence[PendingRequest], rows: int) -> np.ndarray | None:
    """A mask of the batch's rows whose requests are summarised; None when all of them are
    (the usual batch: no mask is built)."""
    if all(request.summarised for request in requests):
        return None
    keep, start = np.zeros(rows, np.bool_), 0
    for request in requests:
        if request.summarised:
            keep[start:start + request.rows] = True
        start += request.rows
    return keep


# ---- answers (on the event loop) -------------------------------------------------------


def answer(
    batch: Sequence[PendingRequest], error: BaseException | None, outcome: Outcome | None,
    request_error: Callable[[Exception], ServingError],
) -> float | None:
    """Set every request's answer from what came back; returns the batch's compute time
    when it ran whole, None when the hand-off failed or the batch was split."""
    if error is not None:  # the hand-off itself failed, not one request's run
        logger.error("batch of %d requests failed: %s", len(batch), error)
        fail_each(batch, ModelFailed("model execution failed"))
        return None
    results, compute_s = outcome
    if compute_s is None:
        _answer_split(batch, results, request_error)
        return None
    for request, outputs in zip(batch, results):
        if not request.future.done():
            request.future.set_result(outputs)
    return compute_s


def _answer_split(batch, results: list, request_error: Callable[[Exception], ServingError]) -> None:
    """Answer each request of a batch that failed and was split: its outputs, or its own error."""
    failed = 0
    for request, result in zip(batch, results):
        if isinstance(result, Exception):
            failed += 1
            error = request_error(result)
            # The model's own failure is the operator's to see; an input it refused (4xx) is
            # the client's, and a client picks its inputs: counted, logged at debug.
            log = logger.warning if error.status >= 500 else logger.debug
            log("request %s failed: %s", request.request_id, result)
            fail(request, error)
        elif not request.future.done():
            request.future.set_result(result)
    if len(batch) > 1:
        logger.warning("batch of %d requests failed; run again in parts, %d failed alone", len(batch), failed)


def model_failed(error: Exception) -> ServingError:
    """The default answer to a request whose run failed on its own: the model's failure."""
    return ModelFailed("model execution failed")


def request_error(error: Exception, output_names: Sequence[str],
                  classify_error: Callable[[Exception], ServingError] = model_failed) -> ServingError:
    """What a request that failed on its own is answered: an output that cannot be sliced
    back names itself; anything else is for `classify_error` (the repository's hook)."""
    if isinstance(error, OutputRowsMismatch):
        index = error.output_index
        name = output_names[index] if index < len(output_names) else str(index)
        return ModelFailed(f"output '{name}' has shape {list(error.shape)}, not one row per input row "
                           f"({error.rows}): this version cannot answer this request")
    return classify_error(error)


def fail(request: PendingRequest, error: Exception) -> None:
    if not request.future.done():
        request.future.set_exception(error)


def fail_each(requests, error: Exception) -> None:
    for request in requests:
        fail(request, error)
