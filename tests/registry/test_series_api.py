"""GET /api/models/{name}/series/: the charts' past, from reports the console stored
(report samples at 5 s for 15 minutes, per-minute roll-ups beyond), with a marker per
traffic change. Reports go in through the worker's report API or the ingest function
it calls (with a chosen moment, to place reports in the past)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from registry.actions import releases
from registry.fleet import live, series
from registry.fleet import workers as fleet
from registry.models import RegisteredModel
from serving.contract import CONTRACT_VERSION

pytestmark = pytest.mark.django_db

URL = "/api/models/digits/series/"


def entry(version: int, requests: int, *, errors: int = 0, client_errors: int = 0, latency_s: float = 0.002, queue_depth: int = 0) -> dict:
    answered = requests - errors - client_errors
    return {"model": "digits", "version": version, "requests": requests, "errors": errors, "client_errors": client_errors, "ok": answered,
            "requests_per_s": float(requests), "latency_sum_s": latency_s * requests, "queue_depth": queue_depth,
            "latency_buckets": {"0.001": 0, str(latency_s): requests, "+Inf": requests}, "batch_size_buckets": {"1": requests, "+Inf": requests}}


def report(*entries: dict, worker_id: str = "w-1") -> dict:
    return {"worker": {"id": worker_id, "host": "box", "pid": 7, "url": "http://127.0.0.1:9", "device": "cpu"},
            "generation": None, "digest": None, "epoch": None, "loaded": [], "versions": list(entries), "contract": CONTRACT_VERSION}


def ingest_at(at, *entries: dict, worker_id: str = "w-1") -> None:
    """One report, as the report API ingests it, received at ``at``."""
    message = report(*entries, worker_id=worker_id)
    live.store_figures(fleet.record_report(message), message, received_at=at)


def column(body: dict, version: int, figure: str) -> list:
    return next(row[figure] for row in body["versions"] if row["version"] == version)


def points(body: dict, version: int, figure: str) -> list[tuple[float, object]]:
    return [(t, value) for t, value in zip(body["t"], column(body, version, figure), strict=True) if value is not None]


# ---------------------------------------------------------------- the API


def test_a_viewer_reads_the_series_of_reports_posted_through_the_report_api(worker_client, viewer_client, three_versions):
    worker_client.post("/api/serving/reports", report(entry(1, 40, errors=4, client_errors=10)), format="json")

    response = viewer_client.get(URL)

    assert response.status_code == 200
    body = response.json()
    assert (body["range"], body["step_s"]) == ("15m", 5)
    assert [(value) for _, value in points(body, 1, "error_rate")] == [0.1]
    assert [(value) for _, value in points(body, 1, "client_error_rate")] == [0.25]


def test_a_report_with_a_latency_bound_past_the_contracts_limit_is_refused_and_the_charts_keep_answering(
        worker_client, viewer_client, three_versions):
    """An attacker's 9e307 s bound read as Infinity in milliseconds: the series answered 500."""
    hostile = {**entry(2, 10), "latency_buckets": {"9e307": 10, "+Inf": 10}}

    refused = worker_client.post("/api/serving/reports", report(hostile, worker_id="evil-1"), format="json")

    assert refused.status_code == 400
    assert "a bound must be within ±1000000" in refused.json()["error"]
    assert viewer_client.get(URL).status_code == 200


@pytest.mark.parametrize("range_", ["15m", "1h"])
def test_figures_stored_before_the_bound_limit_read_as_no_value_not_a_500(viewer_client, three_versions, range_):
    stored_before = report({**entry(1, 10), "latency_buckets": {"9e307": 10, "+Inf": 10}})  # the contract refuses it now
    live.store_figures(fleet.record_report(report()), stored_before, received_at=timezone.now() - timedelta(seconds=70))

    response = viewer_client.get(URL, {"range": range_})

    assert response.status_code == 200
    assert points(response.json(), 1, "p99_ms") == []
    assert [value for _, value in points(response.json(), 1, "requests_per_s")] != []


def test_an_unknown_range_is_a_400_naming_the_allowed_ones(viewer_client, three_versions):
    response = viewer_client.get(URL, {"range": "2d"})

    assert (response.status_code, response.json()["error"]) == (400, "range must be one of 15m, 1h, 6h, 24h; got '2d'")


def test_an_unknown_model_is_a_404(viewer_client, three_versions):
    assert viewer_client.get("/api/models/no-such-model/series/").status_code == 404


def test_a_version_that_is_not_a_number_is_a_400_and_an_unknown_one_a_404(viewer_client, three_versions):
    assert [viewer_client.get(URL, {"version": raw}).status_code for raw in ("two", "0", "-1", str(2**40), "²", "9" * 5000)] == [400] * 6
    assert viewer_client.get(URL, {"version": "9"}).status_code == 404


def test_a_stranger_is_refused(stranger_client, three_versions):
    assert stranger_client.get(URL).status_code in (401, 403)


def test_the_version_parameter_keeps_only_that_versions_figures(viewer_client, three_versions, operator):
    releases.set_routes(three_versions, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], operator)
    ingest_at(timezone.now(), entry(1, 10), entry(2, 10))

    body = viewer_client.get(URL, {"version": "2"}).json()

    assert [row["version"] for row in body["versions"]] == [2]


# ---------------------------------------------------------------- resolution and range


def test_fifteen_minutes_are_180_buckets_of_5_seconds_ending_now(three_versions):
    now = timezone.now()

    body = series.model_series(three_versions, series.RANGES["15m"], now=now)

    steps = {later - earlier for earlier, later in zip(body["t"], body["t"][1:])}
    assert (len(body["t"]), steps) == (180, {5})
    assert body["t"][0] > now.timestamp() - 900 and body["t"][-1] <= now.timestamp() < body["t"][-1] + 5


@pytest.mark.parametrize(("name", "buckets"), [("1h", 60), ("6h", 360), ("24h", 1440)])
def test_longer_ranges_are_per_minute(three_versions, name, buckets):
    body = series.model_series(three_versions, series.RANGES[name], now=timezone.now())

    assert (len(body["t"]), {b - a for a, b in zip(body["t"], body["t"][1:])}, body["step_s"]) == (buckets, {60}, 60)


def test_reports_in_one_5_second_bucket_are_summed_into_a_rate(three_versions):
    now = timezone.now().replace(microsecond=0)
    bucket = now - timedelta(seconds=60 + now.second % 5)  # a whole bucket, a minute ago
    for second in range(5):
        ingest_at(bucket + timedelta(seconds=second), entry(1, 20, client_errors=2, latency_s=0.005, queue_depth=3))

    body = series.model_series(three_versions, series.RANGES["15m"], now=now)

    assert points(body, 1, "requests_per_s") == [(bucket.timestamp(), 20.0)]
    assert points(body, 1, "client_errors_per_s") == [(bucket.timestamp(), 2.0)]
    assert points(body, 1, "p99_ms") == [(bucket.timestamp(), 4.96)]  # inside its bucket, 1 to 5 ms, as Prometheus reads it
    assert points(body, 1, "queue_depth") == [(bucket.timestamp(), 3)]


def test_two_workers_reporting_in_one_bucket_add_up(three_versions):
    now = timezone.now().replace(microsecond=0)
    bucket = now - timedelta(seconds=30 + now.second % 5)
    ingest_at(bucket, entry(1, 50, queue_depth=2), worker_id="w-1")
    ingest_at(bucket, entry(1, 50, queue_depth=4), worker_id="w-2")

    body = series.model_series(three_versions, series.RANGES["15m"], now=now)

    assert points(body, 1, "requests_per_s") == [(bucket.timestamp(), 20.0)]
    assert points(body, 1, "queue_depth") == [(bucket.timestamp(), 6)]


def test_an_hour_reads_the_per_minute_roll_ups_and_leaves_older_minutes_out(three_versions):
    now = timezone.now().replace(second=30, microsecond=0)
    recent, old = now - timedelta(minutes=10, seconds=30), now - timedelta(minutes=70)
    ingest_at(recent, entry(1, 600, errors=6))
    ingest_at(old, entry(1, 600))

    body = series.model_series(three_versions, series.RANGES["1h"], now=now)

    assert points(body, 1, "requests_per_s") == [(recent.timestamp(), 10.0)]
    assert points(body, 1, "error_rate") == [(recent.timestamp(), 0.01)]


def test_a_day_still_holds_the_hour_old_minute(three_versions):
    now = timezone.now().replace(second=30, microsecond=0)
    old = now - timedelta(minutes=70, seconds=30)
    ingest_at(old, entry(1, 120))

    body = series.model_series(three_versions, series.RANGES["24h"], now=now)

    assert points(body, 1, "requests_per_s") == [(old.timestamp(), 2.0)]


def test_a_routed_version_without_figures_still_has_a_series_of_gaps(three_versions):
    body = series.model_series(three_versions, series.RANGES["15m"], now=timezone.now())

    assert [(row["version"], set(row["requests_per_s"])) for row in body["versions"]] == [(1, {None})]


# ---------------------------------------------------------------- release markers


def test_every_traffic_change_in_the_range_is_a_labelled_marker(viewer_client, three_versions, operator):
    model = RegisteredModel.objects.get(name="digits")
    releases.set_routes(model, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], operator)
    releases.rollback(model, operator)
    releases.set_routes(model, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], operator)
    releases.promote(model, operator)

    markers = viewer_client.get(URL).json()["markers"]

    assert [marker["label"] for marker in markers] == ["v1 first routed", "v2 50%", "rollback to v1", "v2 10%", "promote v2"]
    assert [marker["generation"] for marker in markers] == sorted(marker["generation"] for marker in markers)


def test_a_change_before_the_range_is_no_marker(three_versions, operator):
    releases.set_routes(three_versions, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], operator)

    body = series.model_series(three_versions, series.RANGES["15m"], now=timezone.now() + timedelta(minutes=20))

    assert body["markers"] == []


def test_a_marker_carries_its_time_and_routes(viewer_client, three_versions, operator):
    release = releases.set_routes(three_versions, [{"version": 1, "weight": 75}, {"version": 3, "weight": 25}], operator)

    marker = viewer_client.get(URL).json()["markers"][-1]

    assert marker == {"t": release.created_at.timestamp(), "generation": release.generation, "action": "set_routes", "label": "v3 25%",
                      "routes": [{"version": 1, "weight": 75}, {"version": 3, "weight": 25}]}


def test_the_batch_sizes_of_the_last_minute_come_with_each_version(three_versions):
    now = timezone.now()
    ingest_at(now - timedelta(seconds=10), entry(1, 8))
    ingest_at(now - timedelta(minutes=5), entry(1, 100))

    body = series.model_series(three_versions, series.RANGES["15m"], now=now)

    assert column(body, 1, "batch_size_buckets") == {"1": 8, "+Inf": 8}
