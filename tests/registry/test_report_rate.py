"""How often one worker id may report (WORKER_REPORTS_PER_S, WORKER_REPORT_BURST): a
report past its allowance is a 429 with Retry-After that stores nothing."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, connection
from rest_framework.test import APIClient

from registry.fleet import samples
from registry.fleet.report_rate import Bucket, TooSoon
from registry.fleet.state import issued_digest
from registry.models import ReportSample, VersionMetricMinute, Worker
from serving.contract import CONTRACT_VERSION

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 5, tzinfo=UTC)


def report(worker_id: str = "w-1", requests: int = 5) -> dict:
    return {"worker": {"id": worker_id, "host": "box", "pid": 7, "url": "http://127.0.0.1:9", "device": "cpu"},
            "generation": 1, "loaded": [{"model": "digits", "version": 1}],
            "versions": [{"model": "digits", "version": 1, "requests": requests, "errors": 0, "latency_sum_s": 0.01,
                          "latency_buckets": {"0.001": requests, "+Inf": requests}}],
            "contract": CONTRACT_VERSION}


@pytest.fixture
def two_a_burst(settings):
    settings.WORKER_REPORTS_PER_S, settings.WORKER_REPORT_BURST = 0.5, 2


def test_a_report_past_the_burst_is_a_429_with_retry_after_naming_the_setting(worker_client, three_versions, two_a_burst):
    statuses = [worker_client.post("/api/serving/reports", report(), format="json").status_code for _ in range(2)]
    refused = worker_client.post("/api/serving/reports", report(), format="json")

    assert statuses == [204, 204]
    assert refused.status_code == 429
    assert refused["Retry-After"] == "2"  # 1 report at 0.5 a second, whole seconds
    assert "WORKER_REPORTS_PER_S (0.5 a second)" in refused.json()["error"]


def test_a_refused_report_stores_nothing(worker_client, three_versions, two_a_burst):
    for requests in (5, 6):
        worker_client.post("/api/serving/reports", report(requests=requests), format="json")
    samples, seen = ReportSample.objects.count(), Worker.objects.get().last_seen_at

    worker_client.post("/api/serving/reports", report(requests=7), format="json")

    worker = Worker.objects.get()
    assert ReportSample.objects.count() == samples
    assert (worker.last_seen_at, worker.last_report["versions"][0]["requests"]) == (seen, 6)


def test_each_worker_id_has_an_allowance_of_its_own(worker_client, three_versions, two_a_burst):
    for _ in range(3):
        worker_client.post("/api/serving/reports", report("w-1"), format="json")

    assert worker_client.post("/api/serving/reports", report("w-2"), format="json").status_code == 204


def test_a_worker_reporting_once_a_second_is_never_held_back_by_the_defaults(settings):
    bucket, saved = Bucket(settings.WORKER_REPORTS_PER_S, settings.WORKER_REPORT_BURST), settings.WORKER_REPORT_BURST
    for second in range(1, 600):
        saved = bucket.spend(saved, T0 + timedelta(seconds=second - 1), T0 + timedelta(seconds=second))

    assert saved == settings.WORKER_REPORT_BURST - 1


def test_the_allowance_is_earned_back_at_the_rate():
    bucket = Bucket(rate=2.0, burst=3.0)

    with pytest.raises(TooSoon) as refused:
        bucket.spend(0.0, T0, T0 + timedelta(seconds=0.2))
    assert refused.value.retry_after_s == pytest.approx(0.3)
    assert bucket.spend(0.0, T0, T0 + timedelta(seconds=0.5)) == pytest.approx(0.0)
    assert bucket.spend(0.0, T0, T0 + timedelta(seconds=60)) == pytest.approx(2.0)  # never more than the burst saved


def test_a_clock_stepped_back_earns_nothing():
    with pytest.raises(TooSoon):
        Bucket(rate=1.0, burst=5.0).spend(0.5, T0, T0 - timedelta(hours=1))


def test_an_ack_between_two_reports_does_not_hold_the_next_back(worker_client, three_versions, settings):
    # Acks move the worker's last_seen_at too; the bucket earned from that, not from its last report.
    settings.WORKER_REPORTS_PER_S, settings.WORKER_REPORT_BURST = 1, 1
    assert worker_client.post("/api/serving/reports", report(), format="json").status_code == 204
    time.sleep(0.6)
    ack = {"worker": "w-1", "generation": 1, "digest": issued_digest(1), "ok": True, "contract": CONTRACT_VERSION}
    assert worker_client.post("/api/serving/acks", ack, format="json").status_code == 204
    time.sleep(0.6)

    assert worker_client.post("/api/serving/reports", report(), format="json").status_code == 204


@pytest.mark.django_db(transaction=True)
def test_reports_of_one_id_sent_at_once_get_no_more_than_the_allowance(three_versions, settings):
    # Each report's time is read once it holds its worker's row: one stamped before it
    # waited for the row set the time back, and the next earned the same seconds again
    # (on PostgreSQL all 240 of these were accepted).
    settings.WORKER_REPORTS_PER_S, settings.WORKER_REPORT_BURST = 10, 20
    busy = report()
    busy["versions"] = [{**busy["versions"][0], "version": number} for number in (1, 2, 3)]  # a longer hold of the row
    started = time.monotonic()

    def send(_: int) -> int:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}")
        try:
            return client.post("/api/serving/reports", busy, format="json").status_code
        finally:
            connection.close()

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(send, range(240)))

    allowed = settings.WORKER_REPORT_BURST + settings.WORKER_REPORTS_PER_S * (time.monotonic() - started)
    assert set(statuses) == {204, 429}
    assert statuses.count(204) <= allowed, (statuses.count(204), allowed)


def test_a_report_whose_figures_the_database_failed_to_keep_is_a_503_that_kept_nothing(worker_client, three_versions, monkeypatch):
    # The worker sends a 503's figures again with its next report: none of them may have stayed.
    worker_client.post("/api/serving/reports", report(requests=5), format="json")

    def database_gone(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(samples, "store", database_gone)
    response = worker_client.post("/api/serving/reports", report(requests=7), format="json")

    assert response.status_code == 503
    assert Worker.objects.get().last_report["versions"][0]["requests"] == 5
    assert list(VersionMetricMinute.objects.values_list("requests", flat=True)) == [5]


@pytest.mark.django_db(transaction=True)  # the report must really commit
def test_a_report_whose_commit_lost_the_connection_is_answered_in_doubt(worker_client, three_versions, monkeypatch):
    # It may have been kept: a worker sending its figures again could count them twice.
    commit = connection._commit

    def commit_then_lose_the_connection():
        commit()
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(connection, "_commit", commit_then_lose_the_connection)
    response = worker_client.post("/api/serving/reports", report(), format="json")

    assert response.status_code == 503
    assert "Retry-After" not in response
    assert response.json()["in_doubt"] == "the report of worker 'w-1'"
