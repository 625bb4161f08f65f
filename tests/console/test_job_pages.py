"""The Jobs tab, its forms and the cancel button, and the measured metrics beside the
versions: pages render for each role from the rows jobs leave, a refusal answers its 4xx
with the reason, and a viewer is offered no control.

The forms' good paths and the comparisons go through the real ``registry.actions.batch_jobs``,
``registry.actions.datasets`` and ``registry.domain.version_metrics``: no stand-ins.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from console.body_limit import body_limit_for
from console.metric_summaries import change_words
from registry.domain.choices import DatasetTask, JobKind, JobStatus, VersionStatus
from registry.models import EvaluationDataset, Job
from tests.console.conftest import add_version

JOBS = "/models/digits/jobs/"
JSON = {"HTTP_ACCEPT": "application/json"}


def make_job(model, kind=JobKind.BATCH, *, number: int | None = 1, **fields) -> Job:
    version = model.versions.get(number=number) if number is not None else None
    return Job.objects.create(kind=kind, model=model, version=version, **fields)


def npy_file(name: str = "inputs.npy", rows: int = 5) -> SimpleUploadedFile:
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((rows, 4), np.float32))
    return SimpleUploadedFile(name, buffer.getvalue())


def npz_dataset(name: str = "holdout.npz") -> SimpleUploadedFile:
    buffer = io.BytesIO()
    np.savez(buffer, input=np.zeros((3, 4), np.float32), labels=np.array([0, 1, 2]))
    return SimpleUploadedFile(name, buffer.getvalue())


def sizes(*rows) -> list[dict]:
    return [{"batch_size": size, "runs": 100, "samples_per_s": rate, "p50_ms": p50, "p99_ms": p99} for size, rate, p50, p99 in rows]


def benchmark(*rows, device="cpu", peak=50 * 1024**2) -> dict:
    return {"device": device, "onnxruntime": "1.31.0", "sizes": sizes(*rows), "peak_rss_bytes": peak, "session": {}, "job": 1,
            "measured_at": "2026-12-01T19:00:00+00:00"}


CLASSIFIED = {"task": "classification", "samples": 10, "accuracy": 0.8, "classes": ["cat", "dog"],
              "per_class": {"cat": {"precision": 0.75, "recall": 1.0, "support": 6}, "dog": {"precision": 1.0, "recall": 0.5, "support": 4}},
              "confusion_matrix": [[6, 0], [2, 2]], "dataset_sha256": "ab" * 32, "job": 3, "measured_at": "2026-12-01T19:00:00+00:00"}


def rows_in_order(html: str) -> list[int]:
    return [int(part.split('"', 1)[0]) for part in html.split('data-job="')[1:]]


# ---------------------------------------------------------------- the tab


def test_jobs_tab_sends_strangers_to_sign_in(client, digits):
    response = client.get(JOBS)

    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


def test_jobs_tab_is_linked_from_the_model_page(viewer_page, digits):
    html = viewer_page.get("/models/digits/").content.decode()

    assert f'<a href="{JOBS}">Jobs</a>' in html
    assert '<a href="/models/digits/" aria-current="page">Overview</a>' in html


def test_jobs_tab_lists_every_job_newest_first_with_its_progress(viewer_page, digits):
    validation = make_job(digits, JobKind.VALIDATION, status=JobStatus.SUCCEEDED, result={"verdict": "ready"})
    running = make_job(digits, JobKind.BENCHMARK, number=2, status=JobStatus.RUNNING, done=250, total=1000, rate_per_s=50.0, attempts=1,
                       started_at=timezone.now())
    failed = make_job(digits, status=JobStatus.FAILED, input_name="rows.csv", error="rows.csv: line 3 is not CSV", attempts=2)

    response = viewer_page.get(JOBS)
    html = response.content.decode()

    assert response.status_code == 200
    assert rows_in_order(html) == [failed.pk, running.pk, validation.pk]
    assert f'<progress data-field="progress" aria-label="Job #{running.pk} progress" max="1000" value="250"></progress>' in html
    assert '<span class="hint" data-field="counts">250 / 1,000 (25%)</span>' in html
    assert '<td class="num" data-field="rate">50/s</td>' in html
    assert '<td class="num" data-field="eta">15 s</td>' in html  # 750 left at 50/s
    assert '<p class="error-text">rows.csv: line 3 is not CSV</p>' in html
    assert "<code>rows.csv</code>" in html
    assert "verdict: ready" in html


def test_a_running_job_without_a_total_shows_an_indeterminate_bar(viewer_page, digits):
    job = make_job(digits, status=JobStatus.RUNNING, done=40)

    html = viewer_page.get(JOBS).content.decode()

    assert f'<progress data-field="progress" aria-label="Job #{job.pk} progress"></progress>' in html
    assert '<span class="hint" data-field="counts">40</span>' in html


def test_jobs_tab_shows_timings_of_a_finished_job(viewer_page, digits):
    created = timezone.now() - timedelta(minutes=5)
    job = make_job(digits, status=JobStatus.SUCCEEDED, done=10, total=10)
    Job.objects.filter(pk=job.pk).update(created_at=created, started_at=created + timedelta(seconds=2), finished_at=created + timedelta(seconds=95))

    html = viewer_page.get(JOBS).content.decode()

    assert "waited 2.0 s · ran 1 min 33 s" in html


def test_a_succeeded_batch_job_links_its_output_download(operator_page, digits):
    job = make_job(digits, status=JobStatus.SUCCEEDED, output_format="npy", output_bytes=2048, result={"rows": 5, "errors": 0})

    html = operator_page.get(JOBS).content.decode()

    assert f'<a class="button small" href="/api/models/digits/jobs/{job.pk}/output" download>Download .npy</a>' in html
    assert "2 KiB" in html


def test_a_viewer_is_told_the_output_is_there_but_offered_no_download(viewer_page, digits):
    # The download is a 403 for a viewer (an operator's data): a link to it would only fail.
    job = make_job(digits, status=JobStatus.SUCCEEDED, output_format="npy", output_bytes=2048, result={"rows": 5, "errors": 0})

    html = viewer_page.get(JOBS).content.decode()

    assert f"/jobs/{job.pk}/output" not in html
    assert "output .npy, 2 KiB (operators download it)" in html


def test_an_output_removed_by_retention_is_not_offered(viewer_page, digits):
    job = make_job(digits, status=JobStatus.SUCCEEDED, output_format="npy", output_bytes=2048, output_removed_at=timezone.now())

    html = viewer_page.get(JOBS).content.decode()

    assert f"/jobs/{job.pk}/output" not in html
    assert "output removed by retention" in html


def test_viewer_sees_jobs_but_no_forms_and_no_cancel(viewer_page, digits):
    make_job(digits, status=JobStatus.RUNNING)

    html = viewer_page.get(JOBS).content.decode()

    assert 'data-job="' in html
    for control in ('id="batch-form"', 'id="dataset-form"', "/cancel"):
        assert control not in html


def test_operator_gets_both_forms_labelled_and_cancel_only_for_unfinished_jobs(operator_page, digits):
    queued = make_job(digits)
    running = make_job(digits, status=JobStatus.RUNNING)
    finished = make_job(digits, status=JobStatus.SUCCEEDED)

    html = operator_page.get(JOBS).content.decode()

    for field in ("id_batch_input", "id_batch_version", "id_batch_size", "id_dataset_file", "id_dataset_name", "id_dataset_task", "id_dataset_description"):
        assert f'<label for="{field}">' in html, field
    assert 'accept=".npy,.npz,.jsonl,.csv"' in html and 'accept=".npz,.jsonl"' in html
    assert '<option value="1" selected>v1 (stable)</option>' in html  # the stable version by default
    assert f"/jobs/{queued.pk}/cancel" in html and f"/jobs/{running.pk}/cancel" in html
    assert f"/jobs/{finished.pk}/cancel" not in html


def test_jobs_table_fragment_renders_alone(viewer_page, digits):
    job = make_job(digits)

    response = viewer_page.get(JOBS + "?fragment=jobs-table")

    assert response.status_code == 200
    assert f'data-job="{job.pk}"' in response.content.decode()
    assert b"<html" not in response.content


def test_jobs_tab_lists_the_data_sets(viewer_page, digits):
    EvaluationDataset.objects.create(model=digits, name="holdout", task=DatasetTask.CLASSIFICATION, file_format="npz", sha256="c" * 64,
                                     size_bytes=4096, rows=1797, description="held-out split")

    html = viewer_page.get(JOBS).content.decode()

    assert '<tr data-dataset="holdout"><th scope="row">holdout</th><td>Classification</td><td>.npz</td>' in html
    assert '<td class="num">1,797</td>' in html


def test_unknown_model_jobs_tab_is_404(viewer_page, digits):
    assert viewer_page.get("/models/nope/jobs/").status_code == 404


# ---------------------------------------------------------------- cancel


def test_operator_cancels_a_queued_job_at_once(operator_page, digits):
    job = make_job(digits)

    response = operator_page.post(f"/models/digits/jobs/{job.pk}/cancel", follow=True)

    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert response.redirect_chain == [(JOBS, 302)]
    assert f"Job #{job.pk} cancelled before it started." in response.content.decode()


def test_cancelling_a_running_job_asks_its_runner_to_stop(operator_page, digits):
    job = make_job(digits, status=JobStatus.RUNNING, attempts=1)

    response = operator_page.post(f"/models/digits/jobs/{job.pk}/cancel", **JSON)

    job.refresh_from_db()
    assert response.status_code == 200
    assert response.json() == {"level": "success", "message": f"Job #{job.pk}: cancel requested, it stops within a second.", "job": job.pk}
    assert job.status == JobStatus.RUNNING and job.cancel_requested


def test_cancelling_a_finished_job_is_refused_409_and_changes_nothing(operator_page, digits):
    job = make_job(digits, status=JobStatus.SUCCEEDED)

    response = operator_page.post(f"/models/digits/jobs/{job.pk}/cancel")

    job.refresh_from_db()
    assert response.status_code == 409
    assert f"Job #{job.pk} has already finished (succeeded): nothing to cancel." in response.content.decode()
    assert job.status == JobStatus.SUCCEEDED and not job.cancel_requested


def test_a_jobs_cancel_link_asks_first_and_the_question_changes_nothing(operator_page, viewer_page, digits):
    job = make_job(digits, status=JobStatus.RUNNING, attempts=1)

    page = operator_page.get(f"/models/digits/jobs/{job.pk}/cancel")

    html = page.content.decode()
    assert page.status_code == 200
    assert f"Cancel job #{job.pk}?" in html and "It stops within a second" in html
    assert f'action="/models/digits/jobs/{job.pk}/cancel"' in html
    assert viewer_page.get(f"/models/digits/jobs/{job.pk}/cancel").status_code == 403
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and not job.cancel_requested
    finished = make_job(digits, status=JobStatus.SUCCEEDED)
    assert "has already finished (succeeded): nothing to cancel." in operator_page.get(f"/models/digits/jobs/{finished.pk}/cancel").content.decode()


def test_viewer_cannot_cancel_a_job(viewer_page, digits):
    job = make_job(digits)

    response = viewer_page.post(f"/models/digits/jobs/{job.pk}/cancel")

    job.refresh_from_db()
    assert response.status_code == 403
    assert job.status == JobStatus.QUEUED and not job.cancel_requested


def test_cancelling_another_models_job_is_404(operator_page, digits):
    other = add_version(type(digits).objects.create(name="other"), 1).model
    job = make_job(other)

    response = operator_page.post(f"/models/digits/jobs/{job.pk}/cancel")

    job.refresh_from_db()
    assert response.status_code == 404 and job.status == JobStatus.QUEUED


# ---------------------------------------------------------------- batch form


def test_batch_form_without_a_file_is_refused_400_with_the_reason(operator_page, digits):
    response = operator_page.post("/models/digits/jobs/new", {"version": "1"})

    html = response.content.decode()
    assert response.status_code == 400
    assert "Batch job not started: Input file: This field is required." in html
    assert 'id="batch-form"' in html  # the form again, beside its error
    assert not Job.objects.exists()


def test_the_batch_size_field_allows_no_more_than_the_server_takes(operator_page, digits):
    # It allowed up to 1,000,000 and the server refused past 4,096 only after the upload.
    html = operator_page.get(JOBS).content.decode()

    assert 'name="batch_size" id="id_batch_size" min="1" max="4096"' in html


def test_batch_form_with_a_bad_batch_size_is_refused_400(operator_page, digits):
    response = operator_page.post("/models/digits/jobs/new", {"input": npy_file(), "batch_size": "0"}, **JSON)

    assert response.status_code == 400
    assert response.json() == {"level": "error", "message": "Batch job not started: Batch size: Ensure this value is greater than or equal to 1."}
    assert not Job.objects.exists()


def test_viewer_cannot_start_a_batch_job(viewer_page, digits):
    response = viewer_page.post("/models/digits/jobs/new", {"input": npy_file()})

    assert response.status_code == 403
    assert not Job.objects.exists()


def test_batch_form_without_its_csrf_token_is_refused(operator, digits):
    page = Client(enforce_csrf_checks=True)
    page.force_login(operator)

    response = page.post("/models/digits/jobs/new", {"input": npy_file()})

    assert response.status_code == 403
    assert not Job.objects.exists()


@pytest.mark.parametrize("path", ["/models/digits/jobs/new", "/api/models/digits/jobs/"])
def test_a_batch_input_may_be_as_large_as_its_own_limit_before_the_body_is_read(settings, path):
    settings.JOB_MAX_INPUT_BYTES = 3 * 2**30
    assert body_limit_for(path) > 3 * 2**30 > body_limit_for("/api/models/digits/")


@pytest.mark.parametrize("path", ["/models/digits/datasets/new", "/api/models/digits/datasets/"])
def test_a_data_set_may_be_as_large_as_its_own_limit_before_the_body_is_read(settings, path):
    settings.DATASET_MAX_BYTES = 3 * 2**30
    assert body_limit_for(path) > 3 * 2**30 > body_limit_for("/api/models/digits/")


def test_batch_job_is_queued_on_the_stable_version_and_redirects_with_a_message(operator_page, digits):
    response = operator_page.post("/models/digits/jobs/new", {"input": npy_file(), "version": "", "batch_size": "64"}, follow=True)

    job = Job.objects.get()
    assert response.redirect_chain == [(JOBS, 302)]
    assert (job.kind, job.version.number, job.status, job.input_name) == (JobKind.BATCH, 1, JobStatus.QUEUED, "inputs.npy")
    assert f"Batch job #{job.pk} queued: inputs.npy through v1." in response.content.decode()


def test_batch_job_on_a_chosen_version(operator_page, digits):
    operator_page.post("/models/digits/jobs/new", {"input": npy_file(), "version": "2"})

    assert Job.objects.get().version.number == 2


def test_batch_job_of_an_unsupported_file_is_refused_400_with_the_reason(operator_page, digits):
    response = operator_page.post("/models/digits/jobs/new", {"input": SimpleUploadedFile("rows.txt", b"1,2,3\n")})

    html = response.content.decode()
    assert response.status_code == 400
    assert "Batch job not started: " in html and "rows.txt" in html
    assert not Job.objects.exists()


def test_batch_job_on_a_version_not_ready_is_refused_409(operator_page, digits):
    add_version(digits, 3, status=VersionStatus.VALIDATING)

    response = operator_page.post("/models/digits/jobs/new", {"input": npy_file(), "version": "3"}, **JSON)

    assert response.status_code == 409
    assert response.json()["message"].startswith("Batch job not started: ")
    assert not Job.objects.exists()


def test_batch_job_on_an_unknown_version_is_refused_404(operator_page, digits):
    response = operator_page.post("/models/digits/jobs/new", {"input": npy_file(), "version": "9"})

    assert response.status_code == 404
    assert not Job.objects.exists()


# ---------------------------------------------------------------- data set form


def test_dataset_form_with_a_bad_name_is_refused_400_with_the_reason(operator_page, digits):
    response = operator_page.post("/models/digits/datasets/new", {"file": npz_dataset(), "name": "not a slug!", "task": "classification"})

    html = response.content.decode()
    assert response.status_code == 400
    assert "Data set not added: Name: Enter a valid “slug”" in html
    assert not EvaluationDataset.objects.exists()


def test_dataset_form_with_an_unknown_task_is_refused_400(operator_page, digits):
    response = operator_page.post("/models/digits/datasets/new", {"file": npz_dataset(), "name": "holdout", "task": "ranking"}, **JSON)

    assert response.status_code == 400
    assert response.json()["message"].startswith("Data set not added: Task: Select a valid choice.")


def test_viewer_cannot_add_a_dataset(viewer_page, digits):
    response = viewer_page.post("/models/digits/datasets/new", {"file": npz_dataset(), "name": "holdout", "task": "classification"})

    assert response.status_code == 403
    assert not EvaluationDataset.objects.exists()


def test_dataset_is_added_and_redirects_with_a_message(operator_page, digits):
    response = operator_page.post("/models/digits/datasets/new", {"file": npz_dataset(), "name": "holdout", "task": "classification",
                                                                 "description": "held-out split"}, follow=True)

    dataset = EvaluationDataset.objects.get()
    assert response.redirect_chain == [(JOBS, 302)]
    assert (dataset.name, dataset.task, dataset.description) == ("holdout", "classification", "held-out split")
    assert "Data set holdout added" in response.content.decode()


def test_dataset_of_an_unsupported_file_is_refused_with_the_reason(operator_page, digits):
    response = operator_page.post("/models/digits/datasets/new", {"file": SimpleUploadedFile("rows.csv", b"a,b\n"), "name": "holdout",
                                                                 "task": "classification"})

    assert 400 <= response.status_code < 500
    assert "Data set not added: " in response.content.decode()
    assert not EvaluationDataset.objects.exists()


# ---------------------------------------------------------------- metrics beside the versions


def test_versions_table_shows_each_versions_headline_numbers(viewer_page, digits):
    v2 = digits.versions.get(number=2)
    v2.metrics = {"benchmark": benchmark((1, 900.0, 0.8, 1.25), (8, 4000.0, 1.6, 2.5), (64, 9100.0, 6.0, 9.0)),
                  "evaluation": {"holdout": {**CLASSIFIED, "accuracy": 0.9731}, "prices": {"task": "regression", "samples": 5, "mae": 0.1234, "mse": 0.02}}}
    v2.save()

    html = viewer_page.get("/models/digits/").content.decode()
    row = html.split('data-version="2" data-status="ready"', 1)[1].split("</tr>", 1)[0]

    assert '<span class="metric-key">samples/s @64</span> 9100</span>' in row
    assert '<span class="metric-key">p99 @1</span> 1.2 ms</span>' in row
    assert '<span class="metric-key">holdout accuracy</span> 97.31%</span>' in row
    assert '<span class="metric-key">prices MAE</span> 0.1234</span>' in row
    assert "{" not in row.split('class="metrics"', 1)[1]  # no raw JSON


def test_versions_table_says_when_a_version_is_being_measured(viewer_page, digits):
    make_job(digits, JobKind.BENCHMARK, number=2, status=JobStatus.RUNNING)

    html = viewer_page.get("/models/digits/?fragment=versions-table").content.decode()
    row = html.split('data-version="2"', 1)[1].split("</tr>", 1)[0]

    assert "measuring: benchmark…" in row


def test_versions_table_shows_why_a_version_was_rejected(viewer_page, digits):
    add_version(digits, 3, status=VersionStatus.REJECTED, status_reason="validation could not run: the child was killed")

    html = viewer_page.get("/models/digits/").content.decode()

    assert '<div class="hint status-reason">validation could not run: the child was killed</div>' in html


def test_model_page_without_data_sets_invites_one(viewer_page, digits):
    html = viewer_page.get("/models/digits/").content.decode()

    assert 'id="evaluation-table"' in html
    assert "No evaluation data set yet" in html


def test_model_page_compares_versions_on_each_data_set(viewer_page, digits):
    EvaluationDataset.objects.create(model=digits, name="holdout", task=DatasetTask.CLASSIFICATION, file_format="npz", sha256=CLASSIFIED["dataset_sha256"], size_bytes=10, rows=10)
    for number, accuracy in ((1, 0.8), (2, 0.85)):
        version = digits.versions.get(number=number)
        version.metrics = {"evaluation": {"holdout": {**CLASSIFIED, "accuracy": accuracy}}}
        version.save()

    html = viewer_page.get("/models/digits/?fragment=evaluation-table").content.decode()

    assert "holdout" in html and "10 rows" in html
    assert '<td class="num" data-dataset="holdout">accuracy 80%' in html
    assert '<td class="num" data-dataset="holdout">accuracy 85%' in html


# ---------------------------------------------------------------- version page


@pytest.fixture
def measured(digits):
    """v1 (stable) and v2 benchmarked: v2 is 25% faster at batch 1 and 10% slower at 32."""
    v1, v2 = digits.versions.get(number=1), digits.versions.get(number=2)
    v1.metrics = {"benchmark": benchmark((1, 800.0, 1.0, 2.0), (32, 10000.0, 3.0, 5.0))}
    v1.save()
    v2.metrics = {"benchmark": benchmark((1, 1000.0, 0.8, 1.5), (32, 9000.0, 3.5, 6.0), device="cuda:0", peak=300 * 1024**2),
                  "evaluation": {"holdout": CLASSIFIED}}
    v2.save()
    return digits


def test_version_page_shows_its_benchmark_beside_the_stables(viewer_page, measured):
    html = viewer_page.get("/models/digits/versions/2/").content.decode()
    at_1 = html.split('<tr data-batch-size="1">', 1)[1].split("</tr>", 1)[0]
    at_32 = html.split('<tr data-batch-size="32">', 1)[1].split("</tr>", 1)[0]

    assert "Stable v1 samples/s" in html
    assert '<td class="change change-faster">▲ 25.0% faster</td>' in at_1
    assert '<td class="change change-slower">▼ 10.0% slower</td>' in at_32
    assert '<td class="num">800</td>' in at_1 and '<td class="num">2.0 ms</td>' in at_1  # the stable's samples/s and p99
    assert "device <strong>cuda:0</strong>" in html
    assert "peak memory <strong>300 MiB</strong>" in html


def test_the_stable_versions_page_shows_its_benchmark_alone(viewer_page, measured):
    html = viewer_page.get("/models/digits/versions/1/").content.decode()

    assert '<tr data-batch-size="32">' in html
    assert "Stable v1 samples/s" not in html
    assert "This is the stable version: other versions are compared with it." in html


def test_version_page_says_when_it_was_not_benchmarked(viewer_page, digits):
    html = viewer_page.get("/models/digits/versions/2/").content.decode()

    assert "Not benchmarked yet" in html
    assert "Not evaluated yet" in html


def test_version_page_names_the_data_sets_it_is_not_evaluated_on_yet(viewer_page, digits):
    EvaluationDataset.objects.create(model=digits, name="holdout", task=DatasetTask.CLASSIFICATION, file_format="npz", sha256="e" * 64, size_bytes=10, rows=10)

    html = viewer_page.get("/models/digits/versions/2/").content.decode()

    assert "Not evaluated yet on holdout" in html and "add a data set" not in html


def test_version_page_shows_the_evaluation_per_class_and_its_confusion_matrix(viewer_page, digits):
    digits.versions.filter(number=2).update(metrics={"evaluation": {"holdout": CLASSIFIED}})

    html = viewer_page.get("/models/digits/versions/2/?fragment=evaluation").content.decode()

    assert "Data set holdout" in html
    assert "accuracy <strong>80%</strong>" in html
    assert '<tr><th scope="row">dog</th><td class="num">100%</td><td class="num">50%</td><td class="num">4</td></tr>' in html
    assert ('<tr><th scope="row">dog</th><td class="num off-diagonal">2</td><td class="num diagonal">2</td></tr>') in html


def test_a_stored_evaluation_of_many_classes_shows_no_matrix_and_per_class_figures_for_256(viewer_page, digits):
    """A result kept before 7 Dec held a matrix of any size: 540 classes made this page 6.5 MB."""
    classes = [f"c{index}" for index in range(540)]
    result = {"task": "classification", "samples": 540, "accuracy": 1.0, "classes": classes,
              "per_class": {label: {"precision": 1.0, "recall": 1.0, "support": 1000 if label == "c539" else 1} for label in classes},
              "confusion_matrix": [[int(row == column) for column in range(540)] for row in range(540)]}
    digits.versions.filter(number=2).update(metrics={"evaluation": {"many": result}})

    html = viewer_page.get("/models/digits/versions/2/?fragment=evaluation").content.decode()

    assert 'class="table confusion"' not in html
    assert html.count('<tr><th scope="row">c') == 256
    assert '<tr><th scope="row">c539</th>' in html  # the most supported, last in class order
    assert "540 classes: precision and recall for the 256 with the most rows, and no confusion matrix (one is kept up to 64 classes)." in html
    assert len(html) < 100_000


def test_recorded_metrics_leave_out_what_the_jobs_measured(viewer_page, digits):
    digits.versions.filter(number=2).update(metrics={"benchmark": benchmark((1, 1000.0, 0.8, 1.5)), "evaluation": {"holdout": CLASSIFIED}, "f1": 0.5})

    html = viewer_page.get("/models/digits/versions/2/").content.decode()
    recorded = html.split('id="metrics-title"', 1)[1].split("</section>", 1)[0]

    assert '<th scope="row">f1</th><td>0.5</td>' in recorded
    assert "benchmark" not in recorded and "samples_per_s" not in recorded


def test_version_page_passes_its_live_config_to_the_script(viewer_page, digits):
    html = viewer_page.get("/models/digits/versions/2/").content.decode()
    config = json.loads(html.split('<script id="jobs-config" type="application/json">', 1)[1].split("</script>", 1)[0])

    assert config == {"model": "digits", "page": "version", "version": 2}


@pytest.mark.parametrize(("rate", "stable", "pct", "words"), [
    (1250.0, 1000.0, 25.0, ("25.0% faster", "faster")),
    (900.0, 1000.0, -10.0, ("10.0% slower", "slower")),
    (1002.0, 1000.0, 0.2, ("about the same", "same")),
    (900.0, 1000.0, None, ("10.0% slower", "slower")),
    (900.0, None, None, ("not comparable", "unknown")),
])
def test_change_words_name_the_direction_not_only_the_sign(rate, stable, pct, words):
    assert change_words(rate, stable, pct) == words


def test_free_form_metrics_under_the_jobs_keys_do_not_break_the_pages(viewer_page, digits):
    digits.versions.filter(number=2).update(metrics={"benchmark": "fast", "evaluation": ["holdout"]})

    assert viewer_page.get("/models/digits/").status_code == 200
    assert "Not benchmarked yet" in viewer_page.get("/models/digits/versions/2/").content.decode()


@pytest.mark.parametrize(("kind", "says"), [
    (JobKind.BATCH, "start a new batch job to do it again (its input file is deleted once it ends, so send the file again)"),
    (JobKind.EVALUATION, "this evaluation is not run again: v1 keeps no figures for this data set (to measure it, add the data set again under another name)"),
    (JobKind.BENCHMARK, "this benchmark is not run again: v1 keeps no benchmark figures"),
    (JobKind.VALIDATION, "the version is rejected (upload the file again with “Upload as a copy anyway” to have it validated anew)"),
])
def test_the_cancel_question_says_how_the_work_can_be_done_again_for_each_kind(operator_page, digits, kind, says):
    # Only a batch job can be started again; an evaluation or a benchmark is queued once
    # per version (and data set), so "start a new one" promised a control that is not there.
    dataset = EvaluationDataset.objects.create(model=digits, name="holdout", task=DatasetTask.CLASSIFICATION, file_format="npz",
                                               sha256="ab" * 32, size_bytes=10, rows=3) if kind == JobKind.EVALUATION else None
    job = make_job(digits, kind, status=JobStatus.QUEUED, dataset=dataset)

    html = operator_page.get(f"/models/digits/jobs/{job.pk}/cancel").content.decode()

    assert says in html
    assert "start a new one" not in html
