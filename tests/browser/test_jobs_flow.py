"""Background jobs in a real browser, run by a real Celery worker: a batch inference
job's progress bar moves live on the Jobs tab and its output downloads; a queued job is
cancelled from its row (a running job's cancel, within a second, is
tests/integration/test_jobs_live.py's); an upload is validated in the background and its row on the
model page flips to ready, then shows its benchmark numbers, all without a reload. A
viewer sees the jobs and no control.

The stack's Celery worker (tests/browser/conftest.py) runs the jobs, one at a time.
Screenshots land in test-artifacts/ (26- to 35-).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from playwright.sync_api import expect

from registry.building.onnx_build import random_mlp, to_bytes
from tests.browser.conftest import ROOT, sign_in

pytestmark = pytest.mark.browser

LIVE_S = 20_000  # ms: a job message relayed, a fragment re-fetched
JOB_S = 120_000  # ms: a whole job on two busy cores
expect.set_options(timeout=10_000)

# Batch size 1 keeps the job running for seconds (ONNX Runtime's per-call overhead), so
# the bar is seen moving more than once; 150k rows of 64 floats is a 38 MB upload.
BATCH_ROWS = 150_000
BATCH_SIZE = "1"

# Installed in the page: every value the batch job's bar shows while it runs, and a flag
# that a reload would lose.
RECORD_PROGRESS = """
window.jobsFlow = { seen: [], loadedOnce: true };
setInterval(() => {
  const bar = document.querySelector('#jobs-table tr[data-kind="batch"][data-status="running"] progress');
  if (bar && bar.hasAttribute('value')) {
    const seen = window.jobsFlow.seen;
    if (seen[seen.length - 1] !== bar.value) seen.push(bar.value);
  }
}, 50);
"""


@pytest.fixture(scope="module")
def celery_worker(stack):
    """The stack's own Celery worker runs the jobs; named for what these tests rely on."""
    return stack


@pytest.fixture
def batch_input(tmp_path):
    path = tmp_path / "rows.npy"
    np.save(path, np.random.default_rng(0).integers(0, 17, size=(BATCH_ROWS, 64)).astype(np.float32))
    return path


# A batch job's life told by registry.jobs.records, the way a runner tells it, in a
# `manage.py shell` on the stack's database: every call relays the job to browsers.
RELAYED_JOB = """
import time
from registry.domain.choices import JobKind
from registry.jobs import records
from registry.models import Job, RegisteredModel
model = RegisteredModel.objects.get(name="digits")
job = Job.objects.create(kind=JobKind.BATCH, model=model, version=model.versions.get(number=1), input_format="npy", input_name="relayed.npy")
records.relay(job)
time.sleep(1.5)
job = records.claim(job.pk)
for done in range(0, 1001, 125):
    records.progress(job, done, 1000, force=True)
    time.sleep(0.6)
records.succeed(job, {{"rows": 1000, "errors": 0}})
print(job.pk)
"""


def test_a_jobs_progress_relayed_over_the_feed_moves_its_row_in_place(page, stack):
    """Needs none of the jobs' handlers: the relay alone, as records sends it."""
    sign_in(page, "olivia")
    page.goto("/models/digits/jobs/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "on", timeout=LIVE_S)
    page.evaluate(RECORD_PROGRESS)

    shell = subprocess.Popen([sys.executable, "manage.py", "shell", "-c", RELAYED_JOB.format()], cwd=ROOT, env=stack.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        row = page.locator('#jobs-table tr[data-kind="batch"]').filter(has_text="relayed.npy")
        expect(row).to_have_count(1, timeout=LIVE_S)  # a job the page had not shown: added at the top
        expect(row.locator('[data-field="status"]')).to_have_text("Running", timeout=LIVE_S)
        expect(row.locator('[data-field="counts"]')).to_have_text(re.compile(r"^(250|375|500) / 1,000"), timeout=LIVE_S)
        stack.screenshot(page, "29-jobs-relayed-progress")
        expect(row.locator('[data-field="status"]')).to_have_text("Succeeded", timeout=LIVE_S)
    finally:
        out, err = shell.communicate(timeout=60)
    assert shell.returncode == 0, err
    job_id = int(out.strip().splitlines()[-1])
    recorded = page.evaluate("window.jobsFlow")
    assert len({value for value in recorded["seen"] if 0 < value < 1000}) >= 3, recorded["seen"]
    assert recorded["loadedOnce"], "the page reloaded: the progress should move in place"
    expect(page.locator('#jobs-table tr[data-kind="batch"]').first).to_have_attribute("data-job", str(job_id))  # newest first
    expect(row.locator('[data-field="counts"]')).to_have_text("1,000 / 1,000 (100%)")


# A validation that ends "ready", then the version's benchmark, told by records as the
# handlers tell them: the version row must follow on the model page.
RELAYED_VERDICT = """
import time
from registry.domain.choices import JobKind, VersionStatus
from registry.jobs import records
from registry.models import ModelVersion, RegisteredModel
model = RegisteredModel.objects.get(name="digits")
v1 = model.versions.get(number=1)
number = model.versions.order_by("-number").first().number + 1
version = ModelVersion.objects.create(model=model, number=number, sha256="f" * 64, size_bytes=v1.size_bytes, status=VersionStatus.VALIDATING,
                                      signature=v1.signature, opset=v1.opset, producer="relayed")
job = records.create(JobKind.VALIDATION, model, version=version, send=False)
records.relay(job)
time.sleep(3)
job = records.claim(job.pk)
time.sleep(2)
ModelVersion.objects.filter(pk=version.pk).update(status=VersionStatus.READY)
records.succeed(job, {{"verdict": "ready", "reason": ""}})
time.sleep(2)
benchmark = records.claim(records.create(JobKind.BENCHMARK, model, version=version, send=False).pk)
sizes = [{{"batch_size": 1, "runs": 10, "samples_per_s": 812.0, "p50_ms": 1.1, "p99_ms": 2.5}},
         {{"batch_size": 32, "runs": 10, "samples_per_s": 15400.0, "p50_ms": 2.0, "p99_ms": 3.9}}]
result = {{"device": "cpu", "onnxruntime": "test", "sizes": sizes, "peak_rss_bytes": 1, "session": {{}}}}
ModelVersion.objects.filter(pk=version.pk).update(metrics={{"benchmark": {{**result, "job": benchmark.pk}}}})
records.succeed(benchmark, result)
print(number)
"""


def test_a_validation_verdict_and_a_benchmark_relayed_over_the_feed_update_the_version_row(page, stack):
    sign_in(page, "olivia")
    page.goto("/models/digits/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "on", timeout=LIVE_S)
    page.evaluate("window.jobsFlow = { loadedOnce: true }")

    shell = subprocess.Popen([sys.executable, "manage.py", "shell", "-c", RELAYED_VERDICT.format()], cwd=ROOT, env=stack.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        expect(page.locator('#versions-table tr[data-status="validating"]')).to_have_count(1, timeout=LIVE_S)  # the new row, as it was queued
        stack.screenshot(page, "26-model-version-validating")
    finally:
        out, err = shell.communicate(timeout=60)
    assert shell.returncode == 0, err
    number = int(out.strip().splitlines()[-1])
    row = page.locator(f'#versions-table tr[data-version="{number}"]')
    expect(row).to_have_attribute("data-status", "ready", timeout=LIVE_S)
    expect(row).to_contain_text("samples/s @32 15400", timeout=LIVE_S)
    expect(row).to_contain_text("p99 @1 2.5 ms")
    assert page.evaluate("window.jobsFlow.loadedOnce"), "the page reloaded: the verdict should arrive in place"
    stack.screenshot(page, "27-model-version-ready-and-benchmarked")

    stable_benchmarked(page)  # the demo's own benchmark job of v1, run by the stack's Celery worker
    page.goto(f"/models/digits/versions/{number}/")
    expect(page.locator("#benchmark")).to_contain_text(f"Benchmark of v{number} beside the stable v1")
    expect(page.locator("#benchmark table.benchmark tr[data-batch-size]")).to_have_count(2)  # the sizes v3 was measured at
    expect(page.locator('#benchmark table.benchmark tr[data-batch-size="1"]')).to_contain_text(re.compile(r"(faster|slower|about the same)"))
    stack.screenshot(page, "28-version-benchmark-beside-stable")


def stable_benchmarked(page, timeout_s: float = JOB_S / 1000) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if page.request.get("/api/models/digits/versions/1/").json()["metrics"].get("benchmark"):
            return
        time.sleep(0.2)
    raise AssertionError(f"v1 was not benchmarked within {timeout_s} s")


def test_batch_job_progress_updates_live_and_its_output_downloads(page, stack, celery_worker, batch_input):
    sign_in(page, "olivia")
    page.goto("/models/digits/")
    page.get_by_role("link", name="Jobs", exact=True).click()
    page.wait_for_url("**/models/digits/jobs/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "on", timeout=LIVE_S)
    page.evaluate(RECORD_PROGRESS)

    job_id = start_batch_job(page, batch_input)
    row = page.locator(f'#jobs-table tr[data-job="{job_id}"]')
    expect(row.locator('[data-field="status"]')).to_have_text("Running", timeout=JOB_S)
    expect(row.locator('[data-field="rate"]')).to_have_text(re.compile(r"/s$"), timeout=LIVE_S)
    stack.screenshot(page, "30-jobs-batch-running")
    expect(row.locator('[data-field="status"]')).to_have_text("Succeeded", timeout=JOB_S)
    expect(row.locator('[data-field="counts"]')).to_have_text(f"{BATCH_ROWS:,} / {BATCH_ROWS:,} (100%)")

    recorded = page.evaluate("window.jobsFlow")
    moving = {value for value in recorded["seen"] if 0 < value < BATCH_ROWS}
    assert len(moving) >= 2, recorded["seen"]  # the bar moved while it ran, more than once
    assert recorded["loadedOnce"], "the page reloaded: the progress should move in place"
    download_matches_the_input(page, row)
    stack.screenshot(page, "31-jobs-batch-done")

    cancel_a_queued_job(page, stack)


def start_batch_job(page, batch_input) -> int:
    page.get_by_label("Input file").set_input_files(str(batch_input))
    page.get_by_label("Batch size").fill(BATCH_SIZE)
    expect(page.get_by_label("Version")).to_have_value("1")  # the stable version by default
    page.get_by_role("button", name="Start batch job").click()
    message = page.locator("#messages .message-success").first
    expect(message).to_contain_text("queued", timeout=LIVE_S)
    return int(re.search(r"Batch job #(\d+) queued", message.inner_text()).group(1))


def download_matches_the_input(page, row) -> None:
    link = row.get_by_role("link", name="Download .npy")
    answer = page.request.get(link.get_attribute("href"))
    assert answer.status == 200
    outputs = np.load(io.BytesIO(answer.body()))
    assert outputs.shape == (BATCH_ROWS, 10)  # digits: ten class probabilities per row


# A batch job that stays queued: created and never sent to Celery, so the click below
# always finds it waiting, however fast the machine runs jobs.
QUEUED_JOB = """
from registry.domain.choices import JobKind
from registry.jobs import records
from registry.models import RegisteredModel
model = RegisteredModel.objects.get(name="digits")
job = records.create(JobKind.BATCH, model, version=model.versions.get(number=1), input_format="npy", input_name="waiting.npy", send=False)
records.relay(job)
print(job.pk)
"""


def cancel_a_queued_job(page, stack) -> None:
    made = subprocess.run([sys.executable, "manage.py", "shell", "-c", QUEUED_JOB], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    job_id = int(made.stdout.strip().splitlines()[-1])
    row = page.locator(f'#jobs-table tr[data-job="{job_id}"]')
    expect(row.locator('[data-field="status"]')).to_have_text("Queued", timeout=LIVE_S)
    row.get_by_role("link", name=f"Cancel job #{job_id}…").click()
    page.locator(f"#cancel-job-{job_id}-dialog").get_by_role("button", name=f"Cancel job #{job_id}").click()
    expect(row.locator('[data-field="status"]')).to_have_text("Cancelled", timeout=LIVE_S)
    expect(row.get_by_role("link", name=f"Cancel job #{job_id}…")).to_have_count(0)
    stack.screenshot(page, "32-jobs-batch-cancelled")


def queued_job(stack) -> int:
    made = subprocess.run([sys.executable, "manage.py", "shell", "-c", QUEUED_JOB], cwd=ROOT, env=stack.env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    return int(made.stdout.strip().splitlines()[-1])


def test_a_jobs_cancel_asks_first_and_keep_it_cancels_nothing(page, stack):
    """Cancel acted at one click, where every other destructive action of the console (a
    rollback, an abort, archiving) asks first in a dialog."""
    job_id = queued_job(stack)
    sign_in(page, "olivia")
    page.goto("/models/digits/jobs/")
    row = page.locator(f'#jobs-table tr[data-job="{job_id}"]')
    status = row.locator('[data-field="status"]')
    expect(status).to_have_text("Queued")

    row.get_by_role("link", name=f"Cancel job #{job_id}…").click()

    dialog = page.locator(f"#cancel-job-{job_id}-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"Cancel job #{job_id}?")
    expect(dialog).to_contain_text("waiting.npy")
    expect(dialog.get_by_role("link", name="Keep it")).to_be_focused()  # Enter at 3 am keeps the job
    stack.screenshot(page, "33-jobs-cancel-confirm")
    page.keyboard.press("Enter")
    expect(dialog).to_be_hidden()
    page.wait_for_timeout(1000)
    expect(status).to_have_text("Queued")
    api = page.request.get(f"/api/models/digits/jobs/{job_id}/", headers={"Accept": "application/json"}).json()
    assert api["status"] == "queued" and not api.get("cancel_requested"), api

    row.get_by_role("link", name=f"Cancel job #{job_id}…").click()
    dialog.get_by_role("button", name=f"Cancel job #{job_id}").click()

    expect(status).to_have_text("Cancelled", timeout=LIVE_S)
    expect(page.locator("#messages .message-success")).to_contain_text(f"Job #{job_id} cancelled before it started.")


def test_a_jobs_cancel_without_javascript_is_a_confirmation_page(page, stack):
    job_id = queued_job(stack)
    sign_in(page, "olivia")
    page.goto(f"/models/digits/jobs/{job_id}/cancel")
    expect(page.get_by_role("heading", name=f"Cancel job #{job_id}?")).to_be_visible()
    page.get_by_role("button", name=f"Cancel job #{job_id}").click()
    expect(page.locator("#messages")).to_contain_text(f"Job #{job_id} cancelled before it started.")


def test_an_upload_is_validated_in_the_background_and_its_row_flips_live(page, stack, celery_worker, tmp_path):
    sign_in(page, "olivia")
    page.goto("/models/digits/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "on", timeout=LIVE_S)
    page.evaluate("window.jobsFlow = { loadedOnce: true }")

    number = upload_through_the_api(page, stack, to_bytes(random_mlp([64, 32, 10], seed=412)))
    row = page.locator(f'#versions-table tr[data-version="{number}"]')
    expect(row).to_have_attribute("data-status", "ready", timeout=JOB_S)
    expect(row).to_contain_text("samples/s @", timeout=JOB_S)  # its benchmark job's numbers
    expect(row).to_contain_text("p99 @1")
    assert page.evaluate("window.jobsFlow.loadedOnce"), "the page reloaded: the verdict should arrive in place"
    stack.screenshot(page, "33-model-validated-and-benchmarked-live")

    page.goto(f"/models/digits/versions/{number}/")
    expect(page.locator("#benchmark table.benchmark")).to_be_visible()
    expect(page.locator("#benchmark")).to_contain_text("peak memory")
    stack.screenshot(page, "34-version-benchmark")


def upload_through_the_api(page, stack, artifact: bytes) -> int:
    csrf = next(cookie["value"] for cookie in page.context.cookies() if cookie["name"] == "csrftoken")
    answer = page.request.post("/api/models/digits/versions/", headers={"X-CSRFToken": csrf, "Referer": stack.console_url + "/"},
                               multipart={"artifact": {"name": "jobs-flow.onnx", "mimeType": "application/octet-stream", "buffer": artifact},
                                          "description": "uploaded by the jobs browser test"})
    assert answer.status == 202, answer.text()
    return answer.json()["number"]


def test_viewer_sees_the_jobs_but_no_control(page, stack, celery_worker):
    sign_in(page, "victor")
    page.goto("/models/digits/jobs/")

    expect(page.locator("#jobs-table tr[data-job]").first).to_be_visible()
    for control in ("#batch-form", "#dataset-form", "#jobs-table button"):
        expect(page.locator(control)).to_have_count(0)
    stack.screenshot(page, "35-viewer-jobs")
