"""The console's ``GET /metrics``: closed unless a token is configured, then the fleet,
each model's release, jobs and versions as Prometheus gauges, computed on scrape."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from registry.domain.choices import JobKind, JobStatus
from registry.fleet.state import serving_counter
from registry.models import Job
from tests.console.conftest import report_from

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-for-tests-0123456789"


@pytest.fixture
def metrics_token(settings):
    settings.CONSOLE_METRICS_TOKEN = TOKEN
    return TOKEN


def scrape(token: str = TOKEN) -> dict[tuple[str, tuple], float]:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_without_a_configured_token_the_metrics_route_does_not_exist(settings):
    settings.CONSOLE_METRICS_TOKEN = ""

    assert Client().get("/metrics").status_code == 404
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 404


def test_without_a_configured_token_the_404_says_which_setting_turns_the_metrics_on(settings):
    # A newcomer curling /metrics got the HTML 404 page, with nothing naming the setting.
    settings.CONSOLE_METRICS_TOKEN = ""

    response = Client().get("/metrics")

    assert response["Content-Type"].startswith("text/plain")
    assert "set CONSOLE_METRICS_TOKEN" in response.content.decode()


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token", f"Basic {TOKEN}", TOKEN])
def test_a_request_without_the_right_bearer_token_gets_401_and_no_figures(metrics_token, authorization):
    headers = {} if authorization is None else {"HTTP_AUTHORIZATION": authorization}

    response = Client().get("/metrics", **headers)

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"modelops_console" not in response.content


def test_only_get_is_answered(metrics_token):
    assert Client().post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_a_canary_release_shows_its_generation_and_canary_weight(metrics_token, canary_digits):
    generation = canary_digits.current_release().generation

    samples = scrape()

    assert samples[("modelops_console_model_generation", (("model", "digits"),))] == generation
    assert samples[("modelops_console_canary_weight_percent", (("model", "digits"),))] == 10
    assert samples[("modelops_console_generation", ())] == generation


def test_workers_are_counted_by_state(metrics_token, settings, canary_digits):
    generation = canary_digits.current_release().generation
    report_from("current", generation=generation, versions=[])
    report_from("older", generation=generation - 1, versions=[])
    failing = report_from("failing", generation=generation, versions=[])
    failing.ok = False
    failing.save()
    report_from("silent", generation=generation, versions=[], seconds_ago=settings.WORKER_GONE_AFTER_S + 5)

    samples = scrape()

    assert worker_counts(samples) == {"converged": 1, "behind": 1, "failing": 1, "gone": 1, "stopped": 0}


def test_a_worker_at_the_current_generation_with_content_the_console_did_not_issue_is_not_counted_converged(metrics_token, canary_digits):
    generation = canary_digits.current_release().generation
    worker = report_from("impostor", generation=generation, versions=[])
    worker.last_report = {**worker.last_report, "digest": "0" * 64}
    worker.save()

    assert worker_counts(scrape())["converged"] == 0
    assert worker_counts(scrape())["behind"] == 1


def test_a_worker_whose_last_report_said_it_stopped_is_counted_stopped_not_converged(metrics_token, canary_digits):
    worker = report_from("stopped", generation=canary_digits.current_release().generation, versions=[])
    worker.last_report = {**worker.last_report, "state": "stopped"}
    worker.save()

    assert worker_counts(scrape()) == {"converged": 0, "behind": 0, "failing": 0, "gone": 0, "stopped": 1}


def scrape_queries() -> int:
    with CaptureQueriesContext(connection) as queries:
        scrape()
    return len(queries)


def test_a_scrape_reads_the_fleet_in_as_many_queries_for_thirty_workers_as_for_three(metrics_token, canary_digits):
    generation, epoch = canary_digits.current_release().generation, serving_counter()[1]

    def report_with_epoch(worker_id: str) -> None:
        worker = report_from(worker_id, generation=generation, versions=[])
        worker.last_report = {**worker.last_report, "epoch": epoch}
        worker.save()

    for index in range(3):
        report_with_epoch(f"w{index}")
    with_three = scrape_queries()
    for index in range(3, 30):
        report_with_epoch(f"w{index}")

    assert scrape_queries() == with_three
    assert worker_counts(scrape())["converged"] == 30


def worker_counts(samples: dict) -> dict[str, float]:
    return {state: samples[("modelops_console_workers", (("state", state),))] for state in ("converged", "behind", "failing", "gone", "stopped")}


def test_jobs_are_counted_by_kind_and_status_with_zeros_for_the_rest(metrics_token, digits):
    Job.objects.create(kind=JobKind.BATCH, model=digits, status=JobStatus.RUNNING)
    Job.objects.create(kind=JobKind.BATCH, model=digits, status=JobStatus.RUNNING)
    Job.objects.create(kind=JobKind.BENCHMARK, model=digits, status=JobStatus.FAILED)

    samples = scrape()

    def jobs(kind, status):
        return samples[("modelops_console_jobs", (("kind", kind), ("status", status)))]

    assert (jobs("batch", "running"), jobs("benchmark", "failed"), jobs("evaluation", "queued")) == (2, 1, 0)


def test_versions_are_counted_by_status(metrics_token, digits):
    samples = scrape()

    assert samples[("modelops_console_versions", (("status", "ready"),))] == 2
    assert samples[("modelops_console_versions", (("status", "rejected"),))] == 0
