"""Per-request figures are folded into prometheus-client in bulk, and every reader sees them."""

from __future__ import annotations

from prometheus_client import Histogram

from serving import metrics
from serving.reports import failed_total


def bucket_counts(child) -> list[float]:
    return [bucket.get() for bucket in child._buckets]


def test_observe_many_equals_observing_one_by_one():
    histogram = Histogram("test_observe_many_seconds", "test", ["k"], buckets=metrics.LATENCY_BUCKETS_S)
    values = [0.0001, 0.0005, 0.0007, 0.003, 0.003, 0.5, 20.0]
    one_by_one, bulk = histogram.labels("one"), histogram.labels("bulk")

    for value in values:
        one_by_one.observe(value)
    metrics.observe_many(bulk, values)

    assert bucket_counts(bulk) == bucket_counts(one_by_one)
    assert bulk._sum.get() == one_by_one._sum.get()


def test_recorded_requests_reach_the_counters_when_a_reader_flushes():
    version = metrics.VersionMetrics("test-flush", 1)
    counter = metrics.REQUESTS.labels("test-flush", "1", "500")

    version.record(500, 0.002)
    version.record(500, 0.004)
    before = counter._value.get()
    failed = failed_total()  # a reader: flushes first

    assert before == 0 and counter._value.get() == 2
    assert version.request_latency._sum.get() == 0.006
    assert failed >= 2
    version.remove()


def test_a_connection_refused_with_a_503_before_its_request_was_read_is_a_failed_request():
    before = failed_total()

    metrics.count_connection_refused_at_cap()

    assert failed_total() == before + 1


def test_a_full_pending_list_flushes_itself():
    version = metrics.VersionMetrics("test-limit", 1)

    for _ in range(metrics.PENDING_LIMIT):
        version.record(200, 0.001)

    assert metrics.REQUESTS.labels("test-limit", "1", "200")._value.get() == metrics.PENDING_LIMIT
    version.remove()


def test_a_flush_splits_answers_into_successes_and_failures_with_their_latencies():
    version = metrics.VersionMetrics("test-stats", 1)
    for code, latency_s in ((200, 0.5), (503, 0.25), (200, 1.0), (400, 0.125), (503, 0.0625)):
        version.record(code, latency_s)

    version.flush()

    stats = version.stats
    assert (stats.success_count, stats.success_s) == (2, 1.5)
    assert (stats.fail_count, stats.fail_s) == (3, 0.4375)
    version.remove()
