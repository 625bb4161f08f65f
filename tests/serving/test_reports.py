"""A real worker's reports (serving/reports.py): per version, what it answered (its output
summaries) and, on a shadow version, the comparisons since the previous report."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest
from serving_testkit import route, state

from serving.contract import WorkerIdentity, WorkerReport
from serving.reports import ReportBuilder


def report(worker, builder: ReportBuilder) -> WorkerReport:
    """A report built on the worker's own loop, as its control plane builds one."""

    async def build() -> WorkerReport:
        return builder.build(WorkerIdentity("w-report"), worker.worker.repository)

    return asyncio.run_coroutine_threadsafe(build(), worker.loop).result(timeout=10)


def entry(built: WorkerReport, model: str, version: int) -> dict:
    return next(figures for figures in built.versions if (figures["model"], figures["version"]) == (model, version))


def infer(client, worker, model: str, rows: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}]}
    answer = client.post(f"{worker.url}/v2/models/{model}/infer", json=body)
    assert answer.status_code == 200, answer.text
    output = answer.json()["outputs"][0]
    return np.array(output["data"], np.float32).reshape(output["shape"])


def mirrors_finished(worker, timeout_s: float = 5.0) -> None:
    finished = asyncio.run_coroutine_threadsafe(worker.worker.dataplane.shadow.wait_idle(timeout_s), worker.loop)
    assert finished.result(timeout=timeout_s + 1)


@pytest.fixture
def rows():
    rng = np.random.default_rng(11)
    return [rng.standard_normal((int(rng.integers(1, 5)), 64)).astype(np.float32) for _ in range(30)]


def test_a_versions_class_counts_are_the_top_classes_of_what_it_answered(start_worker, client, mlp_v1, rows):
    worker = start_worker(state(1, {"report-classes": {"routes": [route(1, 100, *mlp_v1)]}}))
    builder = ReportBuilder()
    report(worker, builder)  # the warm-up and anything before are behind this one

    answered = [infer(client, worker, "report-classes", batch) for batch in rows]
    figures = entry(report(worker, builder), "report-classes", 1)

    expected = np.bincount(np.concatenate(answered).argmax(axis=1), minlength=10).tolist()
    assert figures["outputs"] == [{"name": "probabilities", "kind": "classes", "counts": expected, "other": 0}]
    assert (figures["requests"], figures["ok"], figures["errors"], figures["client_errors"]) == (30, 30, 0, 0)


def test_a_version_that_answered_nothing_since_the_previous_report_reports_no_outputs(start_worker, client, mlp_v1, rows):
    worker = start_worker(state(1, {"report-idle": {"routes": [route(1, 100, *mlp_v1)]}}))
    builder = ReportBuilder()
    infer(client, worker, "report-idle", rows[0])
    report(worker, builder)

    assert entry(report(worker, builder), "report-idle", 1)["outputs"] == []


def test_the_reports_a_worker_builds_follow_the_contract(start_worker, client, mlp_v1, mlp_v2, rows):
    shadow = {**route(2, 0, *mlp_v2), "shadow": 1.0}
    worker = start_worker(state(1, {"report-wire": {"routes": [route(1, 100, *mlp_v1), shadow]}}))
    builder = ReportBuilder()
    for batch in rows[:5]:
        infer(client, worker, "report-wire", batch)
    client.post(f"{worker.url}/v2/models/report-wire/infer", json={"inputs": []})  # a 400
    mirrors_finished(worker)

    built = report(worker, builder)

    assert WorkerReport.parse(orjson.loads(orjson.dumps(built.to_dict()))) == built
    assert entry(built, "report-wire", 1)["client_errors"] == 1


def test_a_shadow_versions_deltas_add_up_to_its_cumulative_comparisons(start_worker, client, mlp_v1, mlp_v2, rows):
    shadow = {**route(2, 0, *mlp_v2), "shadow": 1.0}
    worker = start_worker(state(1, {"report-shadow": {"routes": [route(1, 100, *mlp_v1), shadow]}}))
    builder = ReportBuilder()
    deltas, mirrored_rows = [], 0
    for part in (rows[:7], rows[7:8], [], rows[8:20]):
        for batch in part:
            infer(client, worker, "report-shadow", batch)
        mirrors_finished(worker)
        built = report(worker, builder)
        shadow_entry = entry(built, "report-shadow", 2)
        deltas.append(shadow_entry["shadow"])
        mirrored_rows += sum(sum(output["counts"]) for output in shadow_entry["outputs"])

    cumulative = next(row for row in built.shadow if (row["model"], row["version"]) == ("report-shadow", 2))
    assert {name: sum(delta[name] for delta in deltas) for name in ("compared", "agreed", "errors", "dropped")} == {
        name: cumulative[name] for name in ("compared", "agreed", "errors", "dropped")}
    assert [(delta["compared"], delta["dropped"]) for delta in deltas] == [(7, 0), (1, 0), (0, 0), (12, 0)]  # one client: never busy
    assert mirrored_rows == sum(len(batch) for batch in rows[:20])  # the shadow's own outputs: every mirrored row


def test_the_routed_version_carries_no_shadow_figures(start_worker, client, mlp_v1, mlp_v2, rows):
    shadow = {**route(2, 0, *mlp_v2), "shadow": 1.0}
    worker = start_worker(state(1, {"report-routed": {"routes": [route(1, 100, *mlp_v1), shadow]}}))
    infer(client, worker, "report-routed", rows[0])
    mirrors_finished(worker)

    assert "shadow" not in entry(report(worker, ReportBuilder()), "report-routed", 1)


def test_a_shadow_version_reports_zero_comparisons_before_its_first_one(start_worker, mlp_v1, mlp_v2):
    shadow = {**route(2, 0, *mlp_v2), "shadow": 1.0}
    worker = start_worker(state(1, {"report-unmirrored": {"routes": [route(1, 100, *mlp_v1), shadow]}}))

    assert entry(report(worker, ReportBuilder()), "report-unmirrored", 2)["shadow"] == {"compared": 0, "agreed": 0, "errors": 0, "dropped": 0}


def test_a_version_no_longer_a_shadow_stops_carrying_shadow_figures(start_worker, client, mlp_v1, mlp_v2, rows):
    shadow = {**route(2, 0, *mlp_v2), "shadow": 1.0}
    worker = start_worker(state(1, {"report-promoted": {"routes": [route(1, 100, *mlp_v1), shadow]}}))
    builder = ReportBuilder()
    infer(client, worker, "report-promoted", rows[0])
    mirrors_finished(worker)
    report(worker, builder)

    worker.apply(state(2, {"report-promoted": {"routes": [route(1, 0, *mlp_v1), route(2, 100, *mlp_v2)]}}))

    assert "shadow" not in entry(report(worker, builder), "report-promoted", 2)


def test_a_version_loaded_again_between_two_reports_reports_its_new_counts_not_negative_ones(start_worker, client, mlp_v1, mlp_v2, rows):
    """Unloading a version removes its metrics: loaded again, its counters restart from zero."""
    worker = start_worker(state(1, {"report-reload": {"routes": [route(1, 100, *mlp_v1)]}}))
    builder = ReportBuilder()
    for batch in rows[:5]:
        infer(client, worker, "report-reload", batch)
    report(worker, builder)
    worker.apply(state(2, {"report-reload": {"routes": [route(2, 100, *mlp_v2)]}}))
    worker.apply(state(3, {"report-reload": {"routes": [route(1, 100, *mlp_v1)]}}))
    for batch in rows[5:7]:
        infer(client, worker, "report-reload", batch)

    built = report(worker, builder)

    figures = entry(built, "report-reload", 1)
    assert (figures["requests"], figures["ok"]) == (2, 2)
    assert sum(figures["outputs"][0]["counts"]) == len(rows[5]) + len(rows[6])
    assert WorkerReport.parse(orjson.loads(orjson.dumps(built.to_dict()))) == built


def test_a_report_the_console_did_not_store_is_counted_again_in_the_next(start_worker, client, mlp_v1, rows):
    worker = start_worker(state(1, {"report-again": {"routes": [route(1, 100, *mlp_v1)]}}))
    builder = ReportBuilder()
    report(worker, builder)
    for batch in rows[:4]:
        infer(client, worker, "report-again", batch)
    refused = report(worker, builder)
    builder.not_stored()  # a 429: the console kept nothing of it
    for batch in rows[4:7]:
        infer(client, worker, "report-again", batch)

    after = entry(report(worker, builder), "report-again", 1)

    assert (entry(refused, "report-again", 1)["requests"], after["requests"], after["ok"]) == (4, 7, 7)
    assert entry(report(worker, builder), "report-again", 1)["requests"] == 0  # and only once


def test_a_reports_shadow_list_names_only_the_versions_mirrored_now(start_worker, client, mlp_v1, mlp_v2, rows):
    # Every version ever shadowed kept its counters there: the 65th would have had every
    # report refused by the console (the contract takes 64).
    shadow = {**route(2, 0, *mlp_v2), "shadow": 1.0}
    worker = start_worker(state(1, {"report-mirrored": {"routes": [route(1, 100, *mlp_v1), shadow]}}))
    infer(client, worker, "report-mirrored", rows[0])
    mirrors_finished(worker)
    mirrored = report(worker, ReportBuilder()).shadow

    worker.apply(state(2, {"report-mirrored": {"routes": [route(1, 0, *mlp_v1), route(2, 100, *mlp_v2)]}}))

    assert [(row["model"], row["version"]) for row in mirrored] == [("report-mirrored", 2)]
    assert report(worker, ReportBuilder()).shadow == ()


def test_a_worker_holding_more_versions_than_a_report_takes_reports_its_routed_ones_first(start_worker, mlp_v1, mlp_v2, monkeypatch):
    from serving import reports

    worker = start_worker(state(1, {"report-many": {"routes": [route(1, 0, *mlp_v1), route(2, 100, *mlp_v2)]}}))
    monkeypatch.setattr(reports, "MAX_LOADED", 1)

    assert [(entry.version, entry.routed) for entry in report(worker, ReportBuilder()).loaded] == [(2, True)]
