"""One batch run and answered (serving/batch_run.py): what it hands the version's output
summary (`summarise`: the outputs of a run answered whole, its rows, and a mask of the rows
of requests to be summarised), and how a split batch's failures are logged.

The model is a function of the inputs; the summary hook records what it is given."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from serving.batch_policy import PendingRequest
from serving.batch_run import answer, request_error, run_batch
from serving.errors import BadRequest

POISON = -1.0  # a row holding this value makes the model fail


def doubled(feeds):
    if (feeds[0] == POISON).any():
        raise RuntimeError("poisoned row")
    return [feeds[0] * 2, feeds[0].sum(axis=1)]


class Recorded:
    """A summary hook that keeps what each call was given (copies: the outputs are views)."""

    def __init__(self):
        self.calls: list[tuple[list, int | None, list | None]] = []

    def __call__(self, outputs, rows, keep):
        self.calls.append(([np.array(output).tolist() for output in outputs], rows, None if keep is None else keep.tolist()))


def request(rows: int, value: float = 1.0, summarised: bool = True) -> PendingRequest:
    return PendingRequest((np.full((rows, 2), value, np.float32),), rows, 0.0, 1.0, None, summarised=summarised)


def test_a_batch_answered_whole_is_summarised_once_with_all_its_outputs_its_rows_and_no_mask():
    summarise = Recorded()

    results, compute_s = run_batch(doubled, [request(1, 1.0), request(2, 3.0)], True, summarise)

    assert compute_s is not None
    assert [result[0].tolist() for result in results] == [[[2.0, 2.0]], [[6.0, 6.0], [6.0, 6.0]]]
    assert summarise.calls == [([[[2.0, 2.0], [6.0, 6.0], [6.0, 6.0]], [2.0, 6.0, 6.0]], 3, None)]


def test_in_a_mixed_batch_the_mask_keeps_exactly_the_rows_of_the_requests_to_be_summarised():
    summarise = Recorded()
    requests = [request(2, 1.0), request(3, 2.0, summarised=False), request(1, 3.0), request(2, 4.0, summarised=False)]

    run_batch(doubled, requests, True, summarise)

    ((outputs, rows, keep),) = summarise.calls
    assert (len(outputs[0]), rows) == (8, 8)
    assert keep == [True, True, False, False, False, True, False, False]


def test_the_mask_of_a_mixed_batch_is_boolean_so_it_selects_rows_rather_than_indexing_them():
    given = []
    requests = [request(1, summarised=False), request(2)]

    run_batch(doubled, requests, True, lambda outputs, rows, keep: given.append(keep))

    (keep,) = given
    assert (keep.dtype, keep.shape) == (np.dtype(np.bool_), (3,))


def test_a_batch_of_requests_none_of_which_is_to_be_summarised_is_offered_with_nothing_kept():
    summarise = Recorded()

    results, _ = run_batch(doubled, [request(1, summarised=False), request(2, summarised=False)], True, summarise)

    assert len(results) == 2
    assert summarise.calls == [([[[2.0, 2.0]] * 3, [2.0] * 3], 3, [False, False, False])]


def test_a_run_alone_request_is_summarised_with_its_outputs_unsliced_and_no_rows():
    """A version not proven batchable: its outputs need not have one row per input row."""
    summarise = Recorded()

    results, compute_s = run_batch(lambda feeds: [feeds[0].sum()], [request(2, 1.5)], False, summarise)

    assert compute_s is not None
    assert [result[0].tolist() for result in results] == [6.0]
    assert summarise.calls == [([6.0], None, None)]


def test_a_run_alone_request_not_to_be_summarised_is_answered_and_not_summarised():
    summarise = Recorded()

    results, compute_s = run_batch(lambda feeds: [feeds[0].sum()], [request(2, 1.5, summarised=False)], False, summarise)

    assert compute_s is not None
    assert [result[0].tolist() for result in results] == [6.0]
    assert summarise.calls == []


def test_each_request_of_a_version_not_proven_batchable_is_summarised_from_its_own_run():
    summarise = Recorded()

    run_batch(lambda feeds: [feeds[0].sum()], [request(1, 1.0), request(2, 2.0, summarised=False), request(1, 5.0)], False, summarise)

    assert summarise.calls == [([2.0], None, None), ([10.0], None, None)]


def test_after_a_failed_batch_is_split_the_parts_that_ran_are_summarised_and_the_failed_request_is_not():
    summarise = Recorded()

    results, compute_s = run_batch(doubled, [request(1, 1.0), request(1, POISON), request(2, 3.0)], True, summarise)

    assert compute_s is None
    assert isinstance(results[1], RuntimeError)
    assert [(outputs[1], rows, keep) for outputs, rows, keep in summarise.calls] == [([2.0], 1, None), ([6.0, 6.0], 2, None)]


def test_a_batch_whose_outputs_are_not_one_row_per_input_row_is_summarised_only_in_the_parts_answered():
    summarise = Recorded()

    def first_row_only(feeds):
        return [feeds[0][:1]]

    results, compute_s = run_batch(first_row_only, [request(1, 1.0), request(1, 2.0), request(2, 3.0)], True, summarise)

    assert compute_s is None
    assert [result[0].tolist() for result in results[:2]] == [[[1.0, 1.0]], [[2.0, 2.0]]]
    assert str(results[2]) == "output 0 has shape [1, 2] for 2 input rows"
    assert summarise.calls == [([[[1.0, 1.0]]], 1, None), ([[[2.0, 2.0]]], 1, None)]


@pytest.mark.parametrize(("refusal", "level"),
                         [(BadRequest("input refused"), logging.DEBUG), (RuntimeError("model broke"), logging.WARNING)],
                         ids=["client-input-4xx", "model-failure-5xx"])
async def test_a_request_that_failed_alone_is_logged_at_debug_when_its_input_was_refused_else_at_warning(refusal, level, caplog):
    """The model's own failure is the operator's to see; an input it refused is the client's."""
    future = asyncio.get_running_loop().create_future()
    lone = PendingRequest((np.ones((1, 2), np.float32),), 1, 0.0, 1.0, future, "lone")

    def classify(error):
        return error if isinstance(error, BadRequest) else request_error(error, ["output"])

    with caplog.at_level(logging.DEBUG, logger="serving.batcher"):
        assert answer([lone], None, ([refusal], None), classify) is None

    assert future.exception().status == (400 if level == logging.DEBUG else 500)
    assert [(record.levelno, record.getMessage()) for record in caplog.records] == [(level, f"request lone failed: {refusal}")]
