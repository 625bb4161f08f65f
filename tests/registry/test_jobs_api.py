"""Batch-inference jobs through the API: a file in, a job queued on a ready version, its
output downloaded; every refusal a clear 4xx that leaves no file and no job.

Tests marked ``child`` run the job for real (``python -m serving.jobs``)."""

from __future__ import annotations

import io
from datetime import timedelta
from urllib.parse import quote

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from rest_framework.test import APIClient

from registry.domain.choices import JobKind, JobStatus, VersionStatus
from registry.jobs import batch, files, records, runner
from registry.models import Job, ModelVersion
from serving.jobs import formats
from tests.fixtures import hostile_arrays
from tests.fixtures.job_world import (
    INPUT_WIDTH,
    SIGNATURE,
    jsonl_upload,
    members_npz,
    negative_rows_npy,
    npy_upload,
    npz_upload,
    predictions,
    rows,
)
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db
JOBS = "/api/models/digits/jobs/"
PIXELS_SIGNATURE = {**SIGNATURE, "inputs": [{"name": "pixels", "datatype": "FP32", "shape": ["batch", 16]}]}


def submit(client, upload, **fields):
    return client.post(JOBS, {"input": upload, **fields}, format="multipart")



def job_files(artifact_root) -> list:
    return [path for path in stored_files(artifact_root) if path.relative_to(artifact_root).parts[0] == "jobs"]


def left_behind(artifact_root) -> list:
    """Every stored file but the versions' artifacts: staged, job or data set files."""
    return [path for path in stored_files(artifact_root) if path.relative_to(artifact_root).parts[0] != "sha256"]


def batch_jobs() -> int:
    return Job.objects.filter(kind=JobKind.BATCH).count()


def test_a_batch_job_is_queued_on_the_stable_version_with_its_input_stored(jobs_model, operator_client):
    response = submit(operator_client, npy_upload(rows(10)))

    assert response.status_code == 202, response.json()
    body = response.json()
    assert (body["kind"], body["status"], body["version"], body["total"], body["done"]) == ("batch", "queued", 1, 10, 0)
    assert (body["input_format"], body["input_name"], body["params"]) == ("npy", "inputs.npy", {"batch_size": 256})
    job = Job.objects.get(pk=body["id"])
    assert np.array_equal(np.load(files.input_path(job)), rows(10))


def test_a_batch_inputs_file_name_keeps_no_directional_override_or_escape(jobs_model, operator_client):
    """Shown to viewers on the Jobs page: Django's multipart parser drops what is not printable
    from a file name, in either way of naming it (checked 7 Dec after a report that it did not)."""
    buffer = io.BytesIO()
    np.save(buffer, rows(2))
    boundary = "b0undary"
    name = quote("invoice\u202eypn.exe\x1b[2J.npy")
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"input\"; filename*=utf-8''{name}\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + buffer.getvalue() + f"\r\n--{boundary}--\r\n".encode()

    # Named as Python's requests names a file of non-ASCII characters (RFC 2231), which
    # Django decodes as sent; a plain filename="…" has them dropped by Django's parser.
    response = operator_client.generic("POST", JOBS, body, content_type=f"multipart/form-data; boundary={boundary}")

    assert response.status_code == 202
    assert response.json()["input_name"] == "invoiceypn.exe[2J.npy"


def test_a_batch_job_with_a_field_it_does_not_take_is_refused_naming_it_and_queues_nothing(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, npy_upload(rows(10)), batchsize="8")

    assert response.status_code == 400
    assert response.json()["error"] == "batchsize: this request does not take this field (it takes: input, version, batch_size)"
    assert batch_jobs() == 0
    assert left_behind(artifact_root) == []


def test_a_batch_job_runs_on_a_named_version_with_its_batch_size(jobs_model, operator_client):
    response = submit(operator_client, npy_upload(rows(3)), version=2, batch_size=7)

    assert response.status_code == 202
    assert (response.json()["version"], response.json()["params"]) == (2, {"batch_size": 7})


@pytest.mark.child
def test_a_finished_csv_job_with_a_header_reads_all_its_rows_done(jobs_model, operator_client):
    """Its line count (23 with the header) was the total the page kept: "22 / 23 (95%)"."""
    lines = [",".join(f"x{index}" for index in range(INPUT_WIDTH))] + [",".join(["0.5"] * INPUT_WIDTH)] * 22
    job_id = submit(operator_client, SimpleUploadedFile("inputs.csv", ("\n".join(lines) + "\n").encode())).json()["id"]

    assert runner.run(job_id) == JobStatus.SUCCEEDED
    job = operator_client.get(f"{JOBS}{job_id}/").json()
    assert (job["done"], job["total"]) == (22, 22)


@pytest.mark.child
def test_a_finished_batch_job_gives_the_models_answers_for_download(jobs_model, operator_client, artifact_root):
    job_id = submit(operator_client, npy_upload(rows(50)), batch_size=16).json()["id"]

    assert runner.run(job_id) == JobStatus.SUCCEEDED
    response = operator_client.get(f"{JOBS}{job_id}/output")

    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="digits-job{job_id}-output.npy"'
    assert response["Content-Type"] == "application/octet-stream"
    downloaded = b"".join(response.streaming_content)
    output = np.load(io.BytesIO(downloaded))
    assert np.array_equal(output.argmax(axis=1), predictions(jobs_model.versions.get(number=1), rows(50)))
    job = operator_client.get(f"{JOBS}{job_id}/").json()
    assert (job["status"], job["done"], job["total"], job["output_format"], job["output_available"]) == ("succeeded", 50, 50, "npy", True)
    assert job["output_bytes"] == len(downloaded)
    assert [path.name for path in job_files(artifact_root)] == ["output.npy"]  # the input went once it ended


@pytest.mark.child
def test_a_jsonl_batch_job_answers_every_row_and_reports_bad_ones(jobs_model, operator_client):
    lines = [{"input": row.tolist()} for row in rows(3)] + [{"input": [1.0, 2.0]}]
    job_id = submit(operator_client, jsonl_upload(lines)).json()["id"]

    assert runner.run(job_id) == JobStatus.SUCCEEDED
    response = operator_client.get(f"{JOBS}{job_id}/output")

    assert response["Content-Type"] == "application/x-ndjson"
    answers = b"".join(response.streaming_content).decode().splitlines()
    assert len(answers) == 4 and '"error"' in answers[3] and all('"outputs"' in answer for answer in answers[:3])
    assert Job.objects.get(pk=job_id).result["errors"] == 1


def test_an_input_whose_rows_the_version_does_not_take_is_refused_naming_the_shapes(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, npy_upload(np.zeros((4, INPUT_WIDTH - 3), np.float32)))

    assert response.status_code == 400
    assert response.json()["error"] == (
        f"the input file does not fit version 1: the .npy file has rows of shape [{INPUT_WIDTH - 3}]; input 'input' expects "
        f"rows of shape [{INPUT_WIDTH}] (version 1 takes 'input' rows [{INPUT_WIDTH}] float32)")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_an_npz_input_with_an_array_that_is_no_input_of_the_version_is_refused_naming_it(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, npz_upload("inputs.npz", input=rows(3), labels=np.arange(3)))

    assert response.status_code == 400
    assert response.json()["error"] == (
        "the input file does not fit version 1: the .npz array 'labels' is not an input of the model (its inputs: 'input') "
        f"(version 1 takes 'input' rows [{INPUT_WIDTH}] float32)")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_an_npz_input_of_exactly_the_versions_inputs_is_queued(jobs_model, operator_client):
    response = submit(operator_client, npz_upload("inputs.npz", input=rows(3)))

    assert response.status_code == 202, response.json()
    assert (response.json()["input_format"], response.json()["total"]) == ("npz", 3)


def test_a_jsonl_input_whose_first_row_does_not_fit_is_refused_naming_the_key(jobs_model, operator_client, artifact_root):
    lines = [{"input": row.tolist(), "labels": 1} for row in rows(3)]

    response = submit(operator_client, jsonl_upload(lines))

    assert response.status_code == 400
    assert response.json()["error"].startswith(
        "the input file does not fit version 1: line 1: 'labels' is not an input of the model (its inputs: 'input')")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_an_input_is_checked_against_the_version_it_will_run_on(jobs_model, operator_client, artifact_root):
    jobs_model.versions.filter(number=2).update(signature=PIXELS_SIGNATURE)

    response = submit(operator_client, npy_upload(rows(3)), version=2)

    assert response.status_code == 400
    assert response.json()["error"] == (
        f"the input file does not fit version 2: the .npy file has rows of shape [{INPUT_WIDTH}]; input 'pixels' expects "
        "rows of shape [16] (version 2 takes 'pixels' rows [16] float32)")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


@pytest.mark.child
def test_an_output_past_its_limit_fails_the_job_instead_of_filling_the_disk(jobs_model, operator_client, artifact_root, settings):
    settings.JOB_MAX_OUTPUT_BYTES = 64 * 1024  # 20,000 rows of 4 float32 outputs are 320 kB
    job_id = submit(operator_client, npy_upload(rows(20000))).json()["id"]

    assert runner.run(job_id) == JobStatus.FAILED
    job = operator_client.get(f"{JOBS}{job_id}/").json()
    assert "grew past its limit of 65536 bytes" in job["error"] and not job["output_available"]
    assert job_files(artifact_root) == []


@pytest.mark.child
def test_a_running_batch_job_stops_on_cancel_and_leaves_no_files(jobs_model, operator_client, artifact_root):
    job_id = submit(operator_client, npy_upload(rows(20000))).json()["id"]
    job = records.claim(job_id)
    operator_client.post(f"{JOBS}{job_id}/cancel/")

    with pytest.raises(runner.JobCancelled):
        batch.run(job)

    assert job_files(artifact_root) == []


@pytest.mark.child
def test_a_runner_the_sweep_took_for_lost_publishes_no_output_and_the_rerun_succeeds(jobs_model, operator_client, artifact_root, settings):
    # A runner stopped (not dead) past JOB_STALE_AFTER_S: the sweep queues its job again
    # while its child may still be writing. Both children wrote output.pending(.part), so
    # the first to finish renamed the other's file away and the rerun failed with
    # "No such file or directory"; and the lost runner published its output as the job's.
    settings.JOB_STALE_AFTER_S, settings.JOB_MAX_ATTEMPTS = 30, 2
    job_id = submit(operator_client, npy_upload(rows(50)), batch_size=16).json()["id"]
    lost = records.claim(job_id)
    Job.objects.filter(pk=job_id).update(heartbeat_at=timezone.now() - timedelta(seconds=31))
    assert records.sweep_stale() >= 1

    with pytest.raises(runner.JobFailed, match="no longer holds the job"):
        batch.run(lost)  # its child finished; the job is not its own any more

    assert [path.name for path in job_files(artifact_root)] == ["input.npy"]  # nothing published, nothing left of its own
    assert runner.run(job_id) == JobStatus.SUCCEEDED
    downloaded = b"".join(operator_client.get(f"{JOBS}{job_id}/output").streaming_content)
    assert np.array_equal(np.load(io.BytesIO(downloaded)).argmax(axis=1), predictions(jobs_model.versions.get(number=1), rows(50)))
    assert operator_client.get(f"{JOBS}{job_id}/").json()["attempts"] == 2


@pytest.mark.parametrize("name", ["inputs.txt", "inputs", "inputs.onnx", "inputs.npy.exe"])
def test_a_file_whose_extension_names_no_input_format_is_refused(jobs_model, operator_client, artifact_root, name):
    response = submit(operator_client, SimpleUploadedFile(name, b"1,2,3\n"))

    assert response.status_code == 400
    assert ".npy, .npz, .jsonl or .csv file" in response.json()["error"]
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_a_corrupt_npy_file_is_refused_naming_the_problem(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, SimpleUploadedFile("inputs.npy", b"\x93NUMPY garbage that is no header"))

    assert response.status_code == 400
    assert response.json()["error"].startswith("the input file cannot be used: ")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_an_array_without_rows_is_refused(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, npy_upload(np.zeros((0, INPUT_WIDTH), np.float32)))

    assert (response.status_code, response.json()["error"]) == (400, "the input file cannot be used: its arrays have no rows")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_an_array_header_with_a_negative_row_count_is_a_400_not_a_500(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, SimpleUploadedFile("inputs.npy", negative_rows_npy((-3, INPUT_WIDTH))))

    assert response.status_code == 400
    assert "with a negative dimension" in response.json()["error"]
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


HEADER_OF_ROWS = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, %d), }" % INPUT_WIDTH


@pytest.mark.parametrize(("name", "data", "problem"), [
    ("inputs.npy", hostile_arrays.npy_with_header(HEADER_OF_ROWS.replace("(3,", "((3,"), rows(3).tobytes()),
     "the .npy file is not a readable .npy array ("),
    ("inputs.npz", hostile_arrays.with_version_needed(hostile_arrays.npz_bytes({"input": rows(3)}), 99),
     "the .npz file is not a readable zip archive (zip file version 9.9)"),
    ("inputs.npz", hostile_arrays.with_directory_moved(hostile_arrays.npz_bytes({"input": rows(3)}), 100),
     "the .npz array 'input' cannot be opened: the zip directory places it 100 bytes before the file's start"),
    ("inputs.npz", hostile_arrays.with_empty_last_name(hostile_arrays.npz_bytes({"input": rows(3), "mask": rows(3)})),
     "the .npz member '' is not a .npy array"),
], ids=["npy header numpy cannot tokenize", "zip version 9.9", "member before the file's start", "member without a name"])
def test_an_array_file_its_reader_cannot_parse_is_a_400_naming_the_problem(jobs_model, operator_client, artifact_root, name, data, problem):
    response = submit(operator_client, SimpleUploadedFile(name, data))

    assert response.status_code == 400
    assert response.json()["error"].startswith(f"the input file cannot be used: {problem}")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_an_array_declaring_rows_of_no_values_is_refused_and_queues_no_job(jobs_model, operator_client, artifact_root):
    """128 bytes declaring 10**18 rows of width 0 were queued for a version whose rows have
    no fixed width, and held the jobs queue for minutes."""
    jobs_model.versions.filter(number=1).update(signature={**SIGNATURE, "inputs": [{"name": "input", "datatype": "FP32",
                                                                                   "shape": ["batch", "features"]}]})
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000000000, 0), }"
    response = submit(operator_client, SimpleUploadedFile("inputs.npy", hostile_arrays.npy_with_header(header)))

    assert (response.status_code, response.json()["error"]) == (
        400, "the input file cannot be used: the .npy file has shape [1000000000000000000, 0] of float32: a row of it holds no bytes")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_a_csv_row_far_wider_than_the_version_takes_is_refused_before_it_is_parsed(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, SimpleUploadedFile("inputs.csv", ",".join(["1.5"] * 1_000_000).encode() + b"\n"))

    assert response.status_code == 400
    assert "line 1 is longer than" in response.json()["error"]
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_an_empty_input_file_is_refused(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, SimpleUploadedFile("inputs.csv", b""))

    assert response.status_code == 400
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_an_input_past_the_limit_is_refused_with_413(jobs_model, operator_client, artifact_root, settings):
    settings.JOB_MAX_INPUT_BYTES = 1000

    response = submit(operator_client, npy_upload(rows(100)))

    assert response.status_code == 413
    assert response.json()["error"] == "the input file is larger than the limit of 1000 bytes (JOB_MAX_INPUT_BYTES)"
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_a_body_declared_past_the_limit_is_refused_unread(jobs_model, operator_client, artifact_root, settings):
    settings.JOB_MAX_INPUT_BYTES = 10

    response = submit(operator_client, SimpleUploadedFile("inputs.csv", b"1\n" * 40000))

    assert response.status_code == 413 and "(JOB_MAX_INPUT_BYTES)" in response.json()["error"]
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_an_unknown_version_is_404(jobs_model, operator_client):
    response = submit(operator_client, npy_upload(rows(2)), version=9)

    assert (response.status_code, response.json()["error"]) == (404, "model digits has no version 9")
    assert batch_jobs() == 0


def test_a_version_that_is_not_ready_is_409(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, npy_upload(rows(2)), version=3)

    assert (response.status_code, response.json()["error"]) == (409, "version 3 is validating: only a ready version runs batch jobs")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_a_version_retention_archives_while_the_input_is_read_is_409_and_queues_nothing(jobs_model, operator_client, artifact_root,
                                                                                        monkeypatch):
    # Reading a large input takes seconds; retention, run meanwhile, kept nothing for a job
    # not yet created, and the job was accepted for a version whose file was gone.
    read_input = formats.check_batch_input

    def read_while_retention_runs(*args, **kwargs):
        ModelVersion.objects.filter(model=jobs_model, number=2).update(status=VersionStatus.ARCHIVED)
        return read_input(*args, **kwargs)

    monkeypatch.setattr(formats, "check_batch_input", read_while_retention_runs)
    response = submit(operator_client, npy_upload(rows(2)), version=2)

    assert (response.status_code, response.json()["error"]) == (409, "version 2 is archived: only a ready version runs batch jobs")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_a_model_without_a_release_needs_a_version(jobs_model, operator_client):
    jobs_model.releases.all().delete()

    response = submit(operator_client, npy_upload(rows(2)))

    assert response.status_code == 409 and "name the version" in response.json()["error"]


@pytest.mark.parametrize("batch_size", [0, 4097, "many"])
def test_a_batch_size_out_of_range_is_400(jobs_model, operator_client, batch_size):
    response = submit(operator_client, npy_upload(rows(2)), batch_size=batch_size)

    assert response.status_code == 400 and response.json()["error"].startswith("batch_size")
    assert batch_jobs() == 0


def test_a_request_without_a_file_is_400(jobs_model, operator_client):
    response = operator_client.post(JOBS, {"version": "1"}, format="multipart")

    assert response.status_code == 400 and response.json()["error"].startswith("input")


def test_a_viewer_may_not_submit_a_job(jobs_model, viewer_client, artifact_root):
    response = submit(viewer_client, npy_upload(rows(2)))

    assert response.status_code == 403
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_a_stranger_may_not_list_jobs(jobs_model, stranger_client):
    assert stranger_client.get(JOBS).status_code == 401


def test_a_viewer_reads_the_jobs_newest_first(jobs_model, operator_client, viewer_client):
    first = submit(operator_client, npy_upload(rows(2))).json()["id"]
    second = submit(operator_client, npy_upload(rows(3))).json()["id"]

    listed = viewer_client.get(JOBS, {"kind": "batch"})
    one = viewer_client.get(f"{JOBS}{first}/")

    assert [job["id"] for job in listed.json()] == [second, first]
    assert (one.status_code, one.json()["id"], one.json()["total"]) == (200, first, 2)


def test_jobs_are_filtered_by_status(jobs_model, operator_client):
    kept = submit(operator_client, npy_upload(rows(2))).json()["id"]
    cancelled = submit(operator_client, npy_upload(rows(2))).json()["id"]
    operator_client.post(f"{JOBS}{cancelled}/cancel/")

    assert [job["id"] for job in operator_client.get(JOBS, {"status": "queued", "kind": "batch"}).json()] == [kept]
    assert [job["id"] for job in operator_client.get(JOBS, {"status": "cancelled"}).json()] == [cancelled]


@pytest.mark.parametrize("query", [{"kind": "training"}, {"status": "done"}])
def test_an_unknown_filter_value_is_400(jobs_model, operator_client, query):
    response = operator_client.get(JOBS, query)

    assert response.status_code == 400 and "must be one of" in response.json()["error"]


def test_a_job_of_another_model_is_404(jobs_model, operator_client):
    job_id = submit(operator_client, npy_upload(rows(2))).json()["id"]

    assert operator_client.get(f"/api/models/other/jobs/{job_id}/").status_code == 404
    assert operator_client.get(f"{JOBS}{job_id + 1000}/").status_code == 404


def test_cancelling_a_queued_job_cancels_it_and_removes_its_input(jobs_model, operator_client, artifact_root):
    job_id = submit(operator_client, npy_upload(rows(2))).json()["id"]

    response = operator_client.post(f"{JOBS}{job_id}/cancel/")

    assert response.status_code == 202
    assert (response.json()["status"], response.json()["error"]) == ("cancelled", "cancelled before it started")
    assert job_files(artifact_root) == []
    assert runner.run(job_id) is None


def test_cancelling_a_running_job_asks_its_runner_to_stop(jobs_model, operator_client):
    job_id = submit(operator_client, npy_upload(rows(2))).json()["id"]
    records.claim(job_id)

    response = operator_client.post(f"{JOBS}{job_id}/cancel/")

    assert response.status_code == 202
    assert (response.json()["status"], response.json()["cancel_requested"]) == ("running", True)


def test_cancelling_a_finished_job_is_409(jobs_model, operator_client):
    job_id = submit(operator_client, npy_upload(rows(2))).json()["id"]
    operator_client.post(f"{JOBS}{job_id}/cancel/")

    response = operator_client.post(f"{JOBS}{job_id}/cancel/")

    assert (response.status_code, response.json()["error"]) == (409, f"job {job_id} has finished (cancelled): there is nothing to cancel")


def test_a_viewer_may_not_cancel_a_job(jobs_model, operator_client, viewer_client):
    job_id = submit(operator_client, npy_upload(rows(2))).json()["id"]

    assert viewer_client.post(f"{JOBS}{job_id}/cancel/").status_code == 403
    assert Job.objects.get(pk=job_id).status == JobStatus.QUEUED


def test_the_output_of_a_job_that_has_not_succeeded_is_409(jobs_model, operator_client):
    job_id = submit(operator_client, npy_upload(rows(2))).json()["id"]

    response = operator_client.get(f"{JOBS}{job_id}/output")

    assert (response.status_code, response.json()["error"]) == (409, f"job {job_id} is queued: its output can be downloaded once it has succeeded")


def test_a_job_that_makes_no_output_file_has_no_output(jobs_model, operator_client):
    job = records.create(JobKind.BENCHMARK, jobs_model, version=jobs_model.versions.get(number=1), key="benchmark:test")

    response = operator_client.get(f"{JOBS}{job.pk}/output")

    assert response.status_code == 404 and "only batch jobs" in response.json()["error"]


def test_an_npz_input_of_thousands_of_members_is_refused_by_their_count_before_any_is_opened(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, members_npz("inputs.npz", {"input": rows(3)}, junk=5000))

    assert response.status_code == 400
    # The count, not the first junk member's bytes: the console read the zip's directory, no member.
    assert response.json()["error"] == (
        "the input file does not fit version 1: the .npz file holds 5001 members; it can hold at most 1 "
        f"(one array per input of the model) (version 1 takes 'input' rows [{INPUT_WIDTH}] float32)")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_a_stray_npz_member_that_is_not_even_npy_data_is_refused_by_its_name_unopened(jobs_model, operator_client, artifact_root):
    response = submit(operator_client, members_npz("inputs.npz", {"input": rows(3)}, junk=1))

    assert response.status_code == 400
    assert response.json()["error"] == (
        "the input file does not fit version 1: the .npz array 'arr_0' is not an input of the model (its inputs: 'input') "
        f"(version 1 takes 'input' rows [{INPUT_WIDTH}] float32)")
    assert batch_jobs() == 0 and left_behind(artifact_root) == []


def test_a_job_says_who_submitted_and_who_cancelled_it_and_the_audit_trail_keeps_both(jobs_model, operator_client):
    job_id = submit(operator_client, npy_upload(rows(2))).json()["id"]

    job = operator_client.post(f"{JOBS}{job_id}/cancel/").json()

    assert (job["created_by"], job["cancelled_by"]) == ("olivia", "olivia")
    trail = operator_client.get("/api/models/digits/audit/", {"kind": "job"}).json()
    assert [(event["actor"], event["message"]) for event in trail] == [
        ("olivia", f"Batch inference job #{job_id} of version 1 cancelled"), ("olivia", f"Batch job #{job_id} submitted on version 1")]


def test_a_second_cancel_of_a_running_job_keeps_the_first_person_who_asked(jobs_model, operator_client, admin_user):
    job_id = submit(operator_client, npy_upload(rows(2))).json()["id"]
    records.claim(job_id)
    operator_client.post(f"{JOBS}{job_id}/cancel/")
    admin_client = APIClient()
    admin_client.force_authenticate(admin_user)

    job = admin_client.post(f"{JOBS}{job_id}/cancel/").json()

    assert job["cancelled_by"] == "olivia"
    assert Job.objects.get(pk=job_id).cancelled_by.username == "olivia"
