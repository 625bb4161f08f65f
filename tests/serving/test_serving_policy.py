"""The batching policy is a pure function: these tests drive it with a fake clock."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.batch_policy import Decision, LatencyModel, PendingRequest, admission_delay_s, next_batch
from serving.contract import BatchPolicy

POLICY = BatchPolicy(max_batch_size=8, max_queue_delay_s=0.010, max_queue_size=100)


def pending(enqueued_s: float, rows: int = 1, timeout_s: float = 1.0) -> PendingRequest:
    return PendingRequest(inputs=(), rows=rows, enqueued_s=enqueued_s, deadline_s=enqueued_s + timeout_s, future=None)


def learned(per_row_s: float, fixed_s: float) -> LatencyModel:
    model = LatencyModel()
    for rows in (1, 8, 1, 8):
        model.observe(rows, per_row_s * rows + fixed_s)
    return model


UNKNOWN = LatencyModel()


def test_full_batch_is_sent_at_once():
    queue = [pending(0.0) for _ in range(10)]

    decision = next_batch(queue, now_s=0.0, is_engine_idle=True, policy=POLICY, latency=UNKNOWN, expected_gap_s=0.0001)

    assert (decision.send_count, decision.dropped, decision.wait_s) == (8, (), None)


def test_lone_request_on_idle_engine_is_sent_without_waiting_when_nothing_is_coming():
    decision = next_batch([pending(0.0)], now_s=0.0, is_engine_idle=True, policy=POLICY, latency=UNKNOWN)

    assert decision.send_count == 1


def test_idle_engine_waits_out_the_window_when_more_requests_are_expected():
    decision = next_batch([pending(0.0)], now_s=0.004, is_engine_idle=True, policy=POLICY, latency=UNKNOWN,
                          expected_gap_s=0.001)

    assert decision.send_count == 0
    assert decision.wait_s == pytest.approx(0.006)


def test_partial_batch_is_sent_when_the_queue_delay_is_over():
    queue = [pending(0.0), pending(0.001)]

    decision = next_batch(queue, now_s=0.010, is_engine_idle=True, policy=POLICY, latency=UNKNOWN,
                          expected_gap_s=0.0001)

    assert decision.send_count == 2


def test_next_arrival_later_than_the_window_sends_now():
    decision = next_batch([pending(0.0)], now_s=0.002, is_engine_idle=True, policy=POLICY, latency=UNKNOWN,
                          expected_gap_s=0.009)

    assert decision.send_count == 1


def test_busy_engine_holds_the_batch_and_wakes_before_the_first_deadline():
    queue = [pending(0.0, timeout_s=0.5), pending(0.1, timeout_s=0.2)]

    decision = next_batch(queue, now_s=0.2, is_engine_idle=False, policy=POLICY, latency=UNKNOWN)

    assert decision.send_count == 0
    assert decision.wait_s == pytest.approx(0.1)


def test_request_past_its_deadline_is_dropped_and_not_sent():
    queue = [pending(0.0, timeout_s=0.05), pending(0.04)]

    decision = next_batch(queue, now_s=0.06, is_engine_idle=True, policy=POLICY, latency=UNKNOWN)

    assert decision.dropped == (0,)
    assert decision.send_count == 1


def test_request_that_cannot_finish_before_its_deadline_is_dropped():
    latency = learned(per_row_s=0.001, fixed_s=0.010)  # one row takes 11 ms
    queue = [pending(0.0, timeout_s=0.015)]

    decision = next_batch(queue, now_s=0.005, is_engine_idle=True, policy=POLICY, latency=latency)

    assert decision.dropped == (0,)
    assert decision.send_count == 0


def test_batch_stops_before_a_request_that_would_overflow_it():
    queue = [pending(0.0, rows=5), pending(0.0, rows=4), pending(0.0, rows=1)]

    decision = next_batch(queue, now_s=0.0, is_engine_idle=True, policy=POLICY, latency=UNKNOWN,
                          expected_gap_s=0.0001)

    assert decision.send_count == 1


def test_latency_target_stops_waiting_when_one_more_row_would_miss_it():
    policy = BatchPolicy(max_batch_size=8, max_queue_delay_s=0.010, max_queue_size=100, latency_target_s=0.006)
    latency = learned(per_row_s=0.0005, fixed_s=0.002)  # 2 rows: 3 ms
    queue = [pending(0.0)]

    decision = next_batch(queue, now_s=0.003, is_engine_idle=True, policy=policy, latency=latency,
                          expected_gap_s=0.0001)

    assert decision.send_count == 1


def test_latency_target_shortens_the_wait():
    policy = BatchPolicy(max_batch_size=8, max_queue_delay_s=0.010, max_queue_size=100, latency_target_s=0.006)
    latency = learned(per_row_s=0.0005, fixed_s=0.002)
    queue = [pending(0.0)]

    decision = next_batch(queue, now_s=0.001, is_engine_idle=True, policy=policy, latency=latency,
                          expected_gap_s=0.0001)

    assert decision.wait_s == pytest.approx(0.006 - 0.001 - 0.003)


def test_empty_queue_waits_for_an_arrival():
    assert next_batch([], now_s=5.0, is_engine_idle=True, policy=POLICY, latency=UNKNOWN).wait_s is None


def test_policy_is_pure():
    queue = [pending(0.0), pending(0.001)]
    args = dict(now_s=0.003, is_engine_idle=True, policy=POLICY, latency=UNKNOWN, expected_gap_s=0.001)

    before = [dataclasses.astuple(item) for item in queue]

    assert next_batch(queue, **args) == next_batch(queue, **args)
    assert [dataclasses.astuple(item) for item in queue] == before


def test_latency_model_recovers_per_row_and_fixed_cost():
    model = learned(per_row_s=0.0002, fixed_s=0.001)

    assert model.per_row_s == pytest.approx(0.0002)
    assert model.fixed_s == pytest.approx(0.001)
    assert model.predict_s(32) == pytest.approx(0.0074)


def test_latency_model_forgets_batches_outside_its_window():
    model = LatencyModel(window=4)
    for _ in range(4):
        model.observe(4, 1.0)
    for rows in (1, 2, 1, 2):
        model.observe(rows, 0.001 * rows)

    assert model.predict_s(4) == pytest.approx(0.004)


def test_admission_predicts_queued_batches_ahead():
    latency = learned(per_row_s=0.001, fixed_s=0.002)  # 8 rows: 10 ms

    delay_s = admission_delay_s(queued_rows=15, rows=1, busy_remaining_s=0.004, policy=POLICY, latency=latency)

    assert delay_s == pytest.approx(0.004 + 2 * 0.010)


def test_unknown_latency_model_predicts_nothing_and_never_drops_early():
    queue = [pending(0.0, timeout_s=0.001)]

    decision = next_batch(queue, now_s=0.0009, is_engine_idle=True, policy=POLICY, latency=UNKNOWN)

    assert UNKNOWN.predict_s(64) == 0.0
    assert (decision.dropped, decision.send_count) == ((), 1)


def test_waiting_for_more_rows_stops_at_the_earliest_deadline_in_the_batch_not_the_oldest():
    queue = [pending(0.0, timeout_s=10.0), pending(0.001, timeout_s=0.002)]  # the second must finish by 0.003

    decision = next_batch(queue, now_s=0.001, is_engine_idle=True, policy=POLICY, latency=UNKNOWN,
                          expected_gap_s=0.0001)

    assert decision.send_count == 0
    assert decision.wait_s == pytest.approx(0.002)  # not the window's 0.009: the short deadline bounds the wait


def test_request_whose_deadline_is_now_is_dropped():
    queue = [pending(0.0, timeout_s=0.5), pending(0.0, timeout_s=1.0)]

    decision = next_batch(queue, now_s=0.5, is_engine_idle=True, policy=POLICY, latency=UNKNOWN)

    assert (decision.dropped, decision.send_count, decision.wait_s) == ((0,), 1, None)


def test_every_request_dropped_sends_nothing_and_waits_for_an_arrival():
    queue = [pending(0.0, timeout_s=0.1), pending(0.0, timeout_s=0.2)]

    decision = next_batch(queue, now_s=0.3, is_engine_idle=True, policy=POLICY, latency=UNKNOWN)

    assert decision == Decision(dropped=(0, 1), send_count=0, wait_s=None)


def test_batch_that_fills_max_batch_size_exactly_is_sent_whole():
    queue = [pending(0.0, rows=3), pending(0.0, rows=5), pending(0.0, rows=1)]

    decision = next_batch(queue, now_s=0.0, is_engine_idle=True, policy=POLICY, latency=UNKNOWN,
                          expected_gap_s=0.0001)

    assert (decision.send_count, decision.wait_s) == (2, None)


def test_next_arrival_exactly_at_the_end_of_the_window_sends_now():
    policy = BatchPolicy(max_batch_size=8, max_queue_delay_s=0.5, max_queue_size=100)

    decision = next_batch([pending(0.0)], now_s=0.25, is_engine_idle=True, policy=policy, latency=UNKNOWN,
                          expected_gap_s=0.25)

    assert (decision.send_count, decision.wait_s) == (1, None)


def test_busy_engine_with_every_request_dropped_waits_for_an_arrival():
    decision = next_batch([pending(0.0, timeout_s=0.1)], now_s=0.2, is_engine_idle=False, policy=POLICY,
                          latency=UNKNOWN)

    assert decision == Decision(dropped=(0,), send_count=0, wait_s=None)


def test_busy_engine_wakes_in_time_for_the_predicted_run_before_the_deadline():
    latency = learned(per_row_s=0.001, fixed_s=0.010)  # 2 rows: 12 ms
    queue = [pending(0.0, rows=2, timeout_s=0.5)]

    decision = next_batch(queue, now_s=0.1, is_engine_idle=False, policy=POLICY, latency=latency)

    assert decision.wait_s == pytest.approx(0.5 - 0.012 - 0.1)


def test_waiting_budget_leaves_room_for_the_batch_with_one_more_row():
    latency = learned(per_row_s=0.001, fixed_s=0.002)  # 2 rows: 4 ms
    queue = [pending(0.0, timeout_s=0.008)]

    decision = next_batch(queue, now_s=0.001, is_engine_idle=True, policy=POLICY, latency=latency,
                          expected_gap_s=0.0001)

    assert decision.wait_s == pytest.approx(0.008 - 0.001 - 0.004)


def test_latency_model_with_one_batch_size_is_proportional():
    model = LatencyModel()
    model.observe(4, 0.008)
    model.observe(4, 0.012)

    assert (model.per_row_s, model.fixed_s, model.is_known) == (pytest.approx(0.0025), 0.0, True)
    assert model.predict_s(2) == pytest.approx(0.005)


def test_latency_model_never_learns_a_negative_cost():
    model = LatencyModel()
    model.observe(1, 0.010)
    model.observe(8, 0.001)  # bigger batches faster: noise, not a negative per-row cost

    assert model.per_row_s == 0.0
    assert model.fixed_s == pytest.approx(0.0055)


def test_latency_model_fixed_cost_is_never_negative():
    model = LatencyModel()
    model.observe(1, 0.001)
    model.observe(2, 0.010)

    assert model.per_row_s == pytest.approx(0.009)
    assert model.fixed_s == 0.0


def test_admission_of_a_request_into_an_empty_queue_costs_one_batch_of_its_rows():
    latency = learned(per_row_s=0.001, fixed_s=0.002)

    assert admission_delay_s(0, 3, 0.0, POLICY, latency) == pytest.approx(0.005)
    assert admission_delay_s(5, 3, 0.0, POLICY, latency) == pytest.approx(0.010)
    assert admission_delay_s(5, 4, 0.0, POLICY, latency) == pytest.approx(0.020)



@settings(max_examples=300, deadline=None)
@given(
    requests=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 4), st.floats(0.0001, 2.0)), min_size=1, max_size=12),
    now_s=st.floats(0.0, 2.0),
    is_engine_idle=st.booleans(),
    expected_gap_s=st.floats(0.0, 0.1) | st.just(math.inf),
    per_row_s=st.floats(0.0, 0.01),
    fixed_s=st.floats(0.0, 0.01),
)
def test_no_decision_waits_past_any_deadline_in_the_batch(requests, now_s, is_engine_idle, expected_gap_s,
                                                         per_row_s, fixed_s):
    queue = [pending(enqueued_s, rows, timeout_s) for enqueued_s, rows, timeout_s in requests]
    latency = learned(per_row_s, fixed_s) if per_row_s or fixed_s else UNKNOWN

    decision = next_batch(queue, now_s, is_engine_idle, POLICY, latency, expected_gap_s)

    kept = [request for index, request in enumerate(queue) if index not in decision.dropped]
    assert all(queue[index].deadline_s <= now_s + latency.predict_s(queue[index].rows) for index in decision.dropped)
    batch, rows = [], 0
    for request in kept:
        if rows + request.rows > POLICY.max_batch_size:
            break
        batch.append(request)
        rows += request.rows
    assert decision.send_count in (0, len(batch))
    if decision.wait_s is not None:
        assert decision.send_count == 0
        assert decision.wait_s > 0.0
        assert now_s + decision.wait_s <= min(request.deadline_s for request in batch) + 1e-9
    elif batch and is_engine_idle:
        assert decision.send_count == len(batch)
