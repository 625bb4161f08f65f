"""A worker's report reaches the pages' live feed with the figures they read, not the
whole report: output summaries, latency histograms and shadow counts stay in the console."""

from __future__ import annotations

import json

import pytest

from registry.fleet import live
from serving.contract import CONTRACT_VERSION, MAX_REPORTED_OUTPUTS, MAX_REPORTED_VERSIONS, MAX_SAMPLE

pytestmark = pytest.mark.django_db


def largest_report(worker_id: str) -> dict:
    """Every version entry the contract takes, each with every output summary it takes."""
    outputs = [{"name": f"o{index}", "kind": "values", "count": MAX_SAMPLE, "sum": 1.0, "sample": [0.5] * MAX_SAMPLE}
               for index in range(MAX_REPORTED_OUTPUTS)]
    versions = [{"model": "digits", "version": number, "requests": 10, "errors": 1, "client_errors": 2, "ok": 7, "requests_per_s": 10.0,
                 "p50_ms": 1.5, "p99_ms": 9.0, "queue_depth": 3, "latency_sum_s": 0.5, "latency_buckets": {"0.01": 10, "+Inf": 10},
                 "batch_size_buckets": {"1": 10, "+Inf": 10}, "outputs": outputs}
                for number in range(1, MAX_REPORTED_VERSIONS + 1)]
    return {"worker": {"id": worker_id}, "versions": versions, "contract": CONTRACT_VERSION}


def test_a_report_is_relayed_with_the_figures_pages_read_and_not_its_output_summaries(worker_client, monkeypatch):
    relayed = []
    monkeypatch.setattr(live, "send_to_group", lambda group, message: relayed.append((group, message)))
    report = largest_report("w-1")
    assert len(json.dumps(report)) > 1_000_000  # within what the contract and the body limit take

    answer = worker_client.post("/api/serving/reports", report, format="json")

    assert answer.status_code == 204, answer.content
    [(group, message)] = relayed
    assert group == live.LIVE_GROUP
    assert message["versions"][0] == {"model": "digits", "version": 1, "requests": 10, "errors": 1, "client_errors": 2, "requests_per_s": 10.0,
                                      "p50_ms": 1.5, "p99_ms": 9.0, "queue_depth": 3, "batch_size_buckets": {"1": 10, "+Inf": 10}}
    assert len(message["versions"]) == MAX_REPORTED_VERSIONS
    assert len(json.dumps(message)) < 20_000
