"""What a queue measures of its own traffic (`QueuePace`) and the wait admission predicts
from it (`predicted_delay_s`): pure functions of a fake clock."""

from __future__ import annotations

import math

import pytest

from serving.batch_policy import LatencyModel, QueuePace, predicted_delay_s
from serving.contract import BatchPolicy

POLICY = BatchPolicy(max_batch_size=8, max_queue_delay_s=0.010, max_queue_size=100)


def learned(per_row_s: float, fixed_s: float = 0.0) -> LatencyModel:
    model = LatencyModel()
    for rows in (1, 8, 1, 8):
        model.observe(rows, per_row_s * rows + fixed_s)
    return model


def test_a_fresh_queue_expects_no_company_and_knows_no_drain_rate():
    pace = QueuePace()
    assert (pace.expected_gap_s(), pace.backlog_rows_per_s, pace.busy_since_s) == (math.inf, 0.0, 0.0)


def test_arrivals_while_idle_never_make_the_batcher_wait_for_company():
    pace = QueuePace()
    for now_s in (0.0, 0.001, 0.002):
        pace.arrived(now_s, is_busy=False)
    pace.batch_sent(0.002)
    pace.batch_returned()
    assert pace.expected_gap_s() == math.inf


def test_arrivals_during_the_last_batch_make_the_smoothed_gap_the_expected_one():
    pace = QueuePace()
    pace.arrived(0.000, is_busy=False)
    pace.batch_sent(0.000)
    pace.arrived(0.010, is_busy=True)  # first gap taken as is: 10 ms
    pace.arrived(0.015, is_busy=True)  # then smoothed: 0.8·10 + 0.2·5 = 9 ms
    pace.batch_returned()
    assert pace.expected_gap_s() == pytest.approx(0.009)


def test_only_the_batch_that_just_finished_decides_whether_company_is_coming():
    pace = QueuePace()
    pace.batch_sent(0.0)
    pace.arrived(0.001, is_busy=True)
    pace.batch_returned()
    pace.batch_sent(0.002)  # nothing arrives while this one runs
    pace.batch_returned()
    assert pace.expected_gap_s() == math.inf


def test_sending_a_batch_records_when_the_engine_became_busy():
    pace = QueuePace()
    pace.batch_sent(3.5)
    assert pace.busy_since_s == 3.5


def test_the_drain_rate_is_measured_only_between_completions_that_left_requests_waiting():
    pace = QueuePace()
    pace.drained(rows=8, now_s=1.0, is_backlogged=False)  # nobody waiting: no clock started
    pace.drained(rows=8, now_s=2.0, is_backlogged=True)  # starts the clock, measures nothing
    assert pace.backlog_rows_per_s == 0.0
    pace.drained(rows=8, now_s=2.5, is_backlogged=True)  # 8 rows in 0.5 s
    assert pace.backlog_rows_per_s == pytest.approx(16.0)
    pace.drained(rows=8, now_s=3.5, is_backlogged=False)  # 8 rows in 1 s, smoothed: 0.8·16 + 0.2·8
    assert pace.backlog_rows_per_s == pytest.approx(14.4)
    pace.drained(rows=8, now_s=4.0, is_backlogged=True)  # the clock stopped at 3.5: no new sample
    assert pace.backlog_rows_per_s == pytest.approx(14.4)


def test_a_completion_at_the_same_instant_adds_no_drain_sample():
    pace = QueuePace()
    pace.drained(rows=8, now_s=1.0, is_backlogged=True)
    pace.drained(rows=8, now_s=1.0, is_backlogged=True)
    assert pace.backlog_rows_per_s == 0.0


def test_an_idle_queue_predicts_only_the_compute_of_its_own_rows():
    pace = QueuePace()
    assert predicted_delay_s(2, 0.0, 0, False, pace, POLICY, learned(0.001)) == pytest.approx(0.002)


def test_a_busy_engine_adds_what_is_left_of_the_batch_it_runs():
    pace = QueuePace()
    pace.batch_sent(10.0)  # a full batch of 8 takes 8 ms; 3 ms of it have passed
    assert predicted_delay_s(1, 10.003, 0, True, pace, POLICY, learned(0.001)) == pytest.approx(0.005 + 0.001)


def test_a_backlogged_queue_predicts_by_its_measured_drain_rate_when_that_is_slower():
    pace = QueuePace()
    pace.drained(rows=10, now_s=0.0, is_backlogged=True)
    pace.drained(rows=10, now_s=1.0, is_backlogged=True)  # drained 10 rows/s
    # Compute alone says 50 ms for 49 queued rows + 1; the measured pace says 5 s.
    assert predicted_delay_s(1, 2.0, 49, False, pace, POLICY, learned(0.001)) == pytest.approx(5.0)


def test_a_drain_rate_below_one_row_a_second_still_counts():
    pace = QueuePace()
    pace.drained(rows=1, now_s=0.0, is_backlogged=True)
    pace.drained(rows=1, now_s=2.0, is_backlogged=True)  # 0.5 rows/s
    assert predicted_delay_s(1, 3.0, 1, False, pace, POLICY, learned(0.001)) == pytest.approx(4.0)


def test_the_drain_rate_does_not_apply_to_an_empty_queue():
    pace = QueuePace()
    pace.drained(rows=1, now_s=0.0, is_backlogged=True)
    pace.drained(rows=1, now_s=1.0, is_backlogged=True)  # 1 row/s
    assert predicted_delay_s(1, 2.0, 0, False, pace, POLICY, learned(0.001)) == pytest.approx(0.001)
