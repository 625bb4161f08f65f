"""Evaluation data sets through the API: added once per name, stored by content, each
ready version evaluated on it; a refused file leaves no file and no row.

Tests marked ``child`` run the evaluation for real (``python -m serving.jobs``)."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.domain import version_metrics
from registry.domain.choices import AuditKind, JobKind, JobStatus, VersionStatus
from registry.jobs import files, runner
from registry.models import EvaluationDataset, Job
from tests.fixtures import hostile_arrays
from tests.fixtures.job_world import (
    CLASSES,
    INPUT_WIDTH,
    SIGNATURE,
    jsonl_upload,
    members_npz,
    negative_rows_npy,
    npz_upload,
    predictions,
    rows,
)
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db
DATASETS = "/api/models/digits/datasets/"
PIXELS_SIGNATURE = {**SIGNATURE, "inputs": [{"name": "pixels", "datatype": "FP32", "shape": ["batch", 16]}]}


def add(client, upload, name="holdout", task="classification", **fields):
    return client.post(DATASETS, {"file": upload, "name": name, "task": task, **fields}, format="multipart")


def labelled(count: int = 6, seed: int = 0, name: str = "holdout.npz"):
    return npz_upload(name, input=rows(count, seed), labels=np.arange(count) % CLASSES)


def dataset_files(artifact_root) -> list:
    return [path for path in stored_files(artifact_root) if path.relative_to(artifact_root).parts[0] != "sha256"]


def evaluations() -> list[tuple[int, str]]:
    return sorted(Job.objects.filter(kind=JobKind.EVALUATION).values_list("version__number", "key"))


def test_a_data_set_whose_arrays_claim_negative_rows_is_a_400_not_a_409_over_its_name(jobs_model, operator_client, artifact_root):
    """Saved with rows = -3, its check constraint failed, and every integrity error was
    answered "model digits has a data set named negds already" though none had the name."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("input.npy", negative_rows_npy((-3, INPUT_WIDTH)))
        archive.writestr("labels.npy", negative_rows_npy((-3,)))

    response = add(operator_client, SimpleUploadedFile("negative.npz", buffer.getvalue()), name="negds")

    assert response.status_code == 400
    assert "with a negative dimension" in response.json()["error"]
    assert not EvaluationDataset.objects.exists() and dataset_files(artifact_root) == []


UNTOKENIZABLE_HEADER = "{'descr': '<f4', 'fortran_order': False, 'shape': ((6, %d), }" % INPUT_WIDTH


@pytest.mark.parametrize(("data", "problem"), [
    (hostile_arrays.npz_bytes({"input": hostile_arrays.npy_with_header(UNTOKENIZABLE_HEADER, rows(6).tobytes()), "labels": np.arange(6)}),
     "the .npz array 'input' is not a readable .npy array ("),
    (hostile_arrays.with_directory_moved(hostile_arrays.npz_bytes({"input": rows(6), "labels": np.arange(6)}), 100),
     "the .npz array 'input' cannot be opened: the zip directory places it 100 bytes before the file's start"),
], ids=["member header numpy cannot tokenize", "member before the file's start"])
def test_a_data_set_its_reader_cannot_parse_is_a_400_naming_the_problem_and_stores_nothing(jobs_model, operator_client, artifact_root,
                                                                                          data, problem):
    response = add(operator_client, SimpleUploadedFile("holdout.npz", data))

    assert response.status_code == 400
    assert response.json()["error"].startswith(f"the data set cannot be used: {problem}")
    assert not EvaluationDataset.objects.exists() and dataset_files(artifact_root) == []


def test_labels_of_text_zero_characters_wide_are_a_400_and_store_nothing(jobs_model, operator_client, artifact_root):
    labels = hostile_arrays.npy_with_header("{'descr': '<U0', 'fortran_order': False, 'shape': (6,), }")
    data = hostile_arrays.npz_bytes({"input": rows(6), "labels": labels})

    response = add(operator_client, SimpleUploadedFile("holdout.npz", data))

    assert (response.status_code, response.json()["error"]) == (
        400, "the data set cannot be used: the .npz array 'labels' has shape [6] of <U0: a row of it holds no bytes")
    assert not EvaluationDataset.objects.exists() and dataset_files(artifact_root) == []


def test_a_data_set_is_stored_by_content_and_every_ready_version_is_evaluated_on_it(jobs_model, operator_client):
    response = add(operator_client, labelled(6), description="held out")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert {key: body[key] for key in ("name", "task", "file_format", "rows", "description", "created_by")} == {
        "name": "holdout", "task": "classification", "file_format": "npz", "rows": 6, "description": "held out", "created_by": "olivia"}
    dataset = EvaluationDataset.objects.get(model=jobs_model, name="holdout")
    assert files.dataset_path(dataset).name == f"{body['sha256']}.npz" and files.dataset_path(dataset).stat().st_size == body["size_bytes"]
    versions = dict(jobs_model.versions.values_list("number", "pk"))
    assert evaluations() == [(1, f"evaluation:{versions[1]}:{dataset.pk}"), (2, f"evaluation:{versions[2]}:{dataset.pk}")]
    event = jobs_model.audit_events.get(kind=AuditKind.DATASET_ADDED)
    assert event.message.startswith("Data set holdout added (classification, 6 rows") and event.actor.username == "olivia"


def test_a_data_set_with_a_field_it_does_not_take_is_refused_naming_it_and_stores_nothing(jobs_model, operator_client, artifact_root):
    response = add(operator_client, labelled(6), descripton="typo")

    assert response.status_code == 400
    assert response.json()["error"] == "descripton: this request does not take this field (it takes: file, name, task, description)"
    assert not EvaluationDataset.objects.exists()
    assert dataset_files(artifact_root) == []


def test_a_jsonl_data_set_counts_its_rows(jobs_model, operator_client):
    lines = [{"input": row.tolist(), "label": [1.5] * CLASSES} for row in rows(3)]

    response = add(operator_client, jsonl_upload(lines, "targets.jsonl"), name="targets", task="regression")

    assert response.status_code == 201
    assert (response.json()["file_format"], response.json()["rows"], response.json()["task"]) == ("jsonl", 3, "regression")


FITTING = {"classification": 1, "regression": [0.5] * CLASSES}  # the checked version's output: [batch, CLASSES]


@pytest.mark.parametrize(("task", "label", "words"), [
    ("classification", 1.5, "a classification label is an integer or a string, not 1.5"),
    ("classification", float("nan"), "a classification label is an integer or a string, not NaN"),
    ("classification", [1, 2], "a classification label is an integer or a string"),
    pytest.param("classification", "\u202etxt.exe", "a class label of text is one line of at most 200 characters", id="class-bidi-override"),
    pytest.param("classification", "red\x1b[31m", "a class label of text is one line", id="class-escape"),
    pytest.param("classification", "x" * 201, "a class label of text is one line of at most 200 characters", id="class-too-long"),
    ("regression", "cat", "a regression label is a finite number or a list of finite numbers"),
    ("regression", float("nan"), "a regression label is a finite number or a list of finite numbers, not NaN"),
    ("regression", float("inf"), "a regression label is a finite number or a list of finite numbers"),
    ("regression", [1.0, 2.0, 3.0, float("nan")], "a regression label is a finite number or a list of finite numbers"),
    pytest.param("regression", 10**400, "a regression label is a finite number or a list of finite numbers", id="regression-int-past-float"),
    ("regression", [1.0, 2.0], "the label has 2 values; a row of the model's first output has 4"),
    ("regression", 1.0, "the label has 1 values; a row of the model's first output has 4"),
])
def test_a_jsonl_label_its_task_cannot_score_is_a_400_naming_the_line(jobs_model, operator_client, artifact_root, task, label, words):
    lines = [{"input": row.tolist(), "label": FITTING[task]} for row in rows(3)]
    lines[2]["label"] = label

    response = add(operator_client, jsonl_upload(lines, "odd.jsonl"), task=task)

    assert response.status_code == 400
    assert response.json()["error"].startswith(f"the data set cannot be used: line 3: {words}")
    assert EvaluationDataset.objects.count() == 0 and Job.objects.count() == 0 and dataset_files(artifact_root) == []


def regression_labels(*bad_row: float) -> np.ndarray:
    labels = np.full((4, CLASSES), 0.5)
    labels[3, :len(bad_row)] = bad_row
    return labels


@pytest.mark.parametrize(("task", "labels", "words"), [
    ("classification", np.array([0.0, 1.5, 2.0, 1.0]), "row 1: a classification label is an integer or a string, not 1.5"),
    ("classification", np.array([0.0, 1.0, np.nan, 1.0]), "row 2: a classification label is an integer or a string"),
    ("classification", np.zeros((4, 2), np.int64), "a classification label is an integer or a string, one per row"),
    ("classification", np.array([True, False, True, False]), "a classification label is an integer or a string, one per row"),
    ("classification", np.array(["a" * 201, "b", "c", "d"]), "the labels are text of up to 201 characters; a class label of text is one line"),
    pytest.param("classification", np.array(["cat", "dog", "\x1b[31mred", "cat"]), "row 2: a class label of text is one line", id="npz-escape"),
    pytest.param("classification", np.array(["cat", "txt.exe\u202e", "dog", "cat"]), "row 1: a class label of text is one line", id="npz-bidi"),
    pytest.param("classification", np.array(["cat", "dog", "cat", "two\nlines"]), "row 3: a class label of text is one line", id="npz-line"),
    ("regression", regression_labels(np.inf), "row 3: a regression label is a finite number or a list of finite numbers"),
    ("regression", regression_labels(0.5, np.nan), "row 3: a regression label is a finite number or a list of finite numbers"),
    ("regression", np.array(["a", "b", "c", "d"]), "a regression label is a finite number or a list of finite numbers"),
    ("regression", np.zeros((4, 2)), "the label has 2 values; a row of the model's first output has 4"),
    ("regression", np.zeros((4, 0)), "the .npz array 'labels' has shape [4, 0] of float64: a row of it holds no bytes"),
])
def test_an_npz_label_its_task_cannot_score_is_a_400(jobs_model, operator_client, artifact_root, task, labels, words):
    response = add(operator_client, npz_upload("odd.npz", input=rows(4), labels=labels), task=task)

    assert response.status_code == 400
    assert response.json()["error"].startswith("the data set cannot be used: ") and words in response.json()["error"]
    assert EvaluationDataset.objects.count() == 0 and Job.objects.count() == 0 and dataset_files(artifact_root) == []


@pytest.mark.parametrize(("task", "labels"), [
    ("classification", np.array([0.0, 1.0, 2.0, 1.0])),
    ("classification", np.array(["cat", "dog", "cat", ""])),
    ("regression", np.full((4, CLASSES), 0.5)),
    ("regression", np.arange(4 * CLASSES).reshape(4, CLASSES)),
])
def test_labels_a_task_can_score_are_accepted(jobs_model, operator_client, task, labels):
    response = add(operator_client, npz_upload("fine.npz", input=rows(4), labels=labels), task=task)

    assert response.status_code == 201, response.json()


def test_a_data_set_name_taken_is_409_and_leaves_nothing_new(jobs_model, operator_client, artifact_root):
    add(operator_client, labelled(6))
    before = dataset_files(artifact_root)

    response = add(operator_client, labelled(8, seed=1))

    assert (response.status_code, response.json()["error"]) == (409, "model digits has a data set named holdout already")
    assert dataset_files(artifact_root) == before and EvaluationDataset.objects.count() == 1


def test_a_data_set_for_an_archived_model_is_409_and_stores_nothing(jobs_model, operator_client, artifact_root):
    """The README's "no uploads" for an archived model held for versions only: a data set
    was stored and every version evaluated on it."""
    assert operator_client.post("/api/models/digits/archive/", {"reason": "retired"}, format="json").status_code == 200

    response = add(operator_client, labelled(6))

    assert (response.status_code, response.json()["error"]) == (409, "digits is archived: restore it from the archive before adding data sets")
    assert EvaluationDataset.objects.count() == 0 and Job.objects.count() == 0 and dataset_files(artifact_root) == []


def test_a_data_set_without_labels_is_refused_naming_the_problem(jobs_model, operator_client, artifact_root):
    response = add(operator_client, npz_upload("holdout.npz", input=rows(4)))

    assert response.status_code == 400
    assert response.json()["error"].startswith("the data set cannot be used: ") and "labels" in response.json()["error"]
    assert EvaluationDataset.objects.count() == 0 and Job.objects.count() == 0 and dataset_files(artifact_root) == []


def test_a_jsonl_row_without_a_label_is_refused(jobs_model, operator_client, artifact_root):
    response = add(operator_client, jsonl_upload([{"input": [0.0] * 8, "label": 1}, {"input": [0.0] * 8}], "rows.jsonl"))

    assert response.status_code == 400 and "line 2" in response.json()["error"]
    assert dataset_files(artifact_root) == []


def test_an_npz_data_set_with_an_array_that_is_no_input_is_refused_naming_it_and_the_version(jobs_model, operator_client, artifact_root):
    upload = npz_upload("holdout.npz", **{"../../../../tmp/ZIPSLIP": rows(4), "labels": np.arange(4) % CLASSES})

    response = add(operator_client, upload)

    assert response.status_code == 400
    assert response.json()["error"] == (
        "the data set does not fit version 1 (the stable version, which it was checked against): the .npz array "
        "'../../../../tmp/ZIPSLIP' is not an input of the model (its inputs: 'input') "
        f"(version 1 takes 'input' rows [{INPUT_WIDTH}] float32, and 'labels')")
    assert EvaluationDataset.objects.count() == 0 and Job.objects.count() == 0 and dataset_files(artifact_root) == []


@pytest.mark.parametrize(("width", "problem"), [
    (INPUT_WIDTH + 1, f"line 2: input 'input' has shape [{INPUT_WIDTH + 1}]; the model expects [{INPUT_WIDTH}]"),
    (2_000_000, "line 2 is longer than 66560 bytes, more than a row of the model's inputs takes as text"),  # refused unparsed
])
def test_a_jsonl_data_set_with_any_row_of_the_wrong_shape_is_refused_naming_it(jobs_model, operator_client, artifact_root, width, problem):
    lines = [{"input": [0.0] * INPUT_WIDTH, "label": 1}, {"input": [0] * width, "label": 2}]

    response = add(operator_client, jsonl_upload(lines, "holdout.jsonl"))

    assert response.status_code == 400
    assert response.json()["error"] == (
        f"the data set does not fit version 1 (the stable version, which it was checked against): {problem} "
        f"(version 1 takes 'input' rows [{INPUT_WIDTH}] float32, and 'label')")
    assert EvaluationDataset.objects.count() == 0 and Job.objects.count() == 0 and dataset_files(artifact_root) == []


def test_a_data_set_is_checked_against_the_stable_version_not_another_ready_one(jobs_model, operator_client):
    jobs_model.versions.filter(number=2).update(signature=PIXELS_SIGNATURE)

    fits_the_stable = add(operator_client, labelled(4))
    fits_another = add(operator_client, npz_upload("other.npz", pixels=np.zeros((4, 16), np.float32), labels=np.arange(4)), name="other")

    assert fits_the_stable.status_code == 201, fits_the_stable.json()
    assert fits_another.status_code == 400
    assert fits_another.json()["error"].startswith(
        "the data set does not fit version 1 (the stable version, which it was checked against): ")


def test_without_a_release_a_data_set_is_checked_against_the_newest_ready_version(jobs_model, operator_client, artifact_root):
    jobs_model.releases.all().delete()
    jobs_model.versions.filter(number=2).update(signature=PIXELS_SIGNATURE)

    response = add(operator_client, labelled(4))

    assert response.status_code == 400
    assert response.json()["error"].startswith(
        "the data set does not fit version 2 (the newest ready version, which it was checked against): "
        "the .npz array 'input' is not an input of the model (its inputs: 'pixels')")
    assert EvaluationDataset.objects.count() == 0 and dataset_files(artifact_root) == []


def test_without_a_ready_version_only_the_data_sets_format_is_checked(jobs_model, operator_client):
    jobs_model.versions.update(status=VersionStatus.VALIDATING)

    response = add(operator_client, npz_upload("holdout.npz", pixels=np.zeros((4, 16), np.float32), labels=np.arange(4)))

    assert response.status_code == 201, response.json()
    assert Job.objects.filter(kind=JobKind.EVALUATION).count() == 0


@pytest.mark.parametrize("name", ["holdout.csv", "holdout.npy", "holdout"])
def test_a_data_set_file_of_another_format_is_refused(jobs_model, operator_client, artifact_root, name):
    response = add(operator_client, SimpleUploadedFile(name, b"1,2\n"))

    assert response.status_code == 400 and "the data set must be a .npz or .jsonl file" in response.json()["error"]
    assert EvaluationDataset.objects.count() == 0 and dataset_files(artifact_root) == []


@pytest.mark.parametrize("fields", [{"name": "has space"}, {"name": ""}, {"task": "ranking"}])
def test_a_bad_name_or_task_is_400(jobs_model, operator_client, artifact_root, fields):
    response = add(operator_client, labelled(), **{"name": "holdout", "task": "classification", **fields})

    assert response.status_code == 400
    assert EvaluationDataset.objects.count() == 0 and dataset_files(artifact_root) == []


def test_a_data_set_past_its_limit_is_413(jobs_model, operator_client, artifact_root, settings):
    settings.DATASET_MAX_BYTES = 500

    response = add(operator_client, labelled(50))

    assert (response.status_code, response.json()["error"]) == (413, "the data set is larger than the limit of 500 bytes (DATASET_MAX_BYTES)")
    assert EvaluationDataset.objects.count() == 0 and dataset_files(artifact_root) == []


def test_a_viewer_may_not_add_a_data_set_but_reads_them(jobs_model, operator_client, viewer_client, artifact_root):
    refused = add(viewer_client, labelled(), name="mine")
    add(operator_client, labelled())

    assert refused.status_code == 403
    assert [dataset["name"] for dataset in viewer_client.get(DATASETS).json()] == ["holdout"]
    assert viewer_client.get(f"{DATASETS}holdout/").json()["rows"] == 6
    assert viewer_client.get(f"{DATASETS}mine/").status_code == 404


def test_the_data_sets_of_an_unknown_model_are_404(operator_client, db):
    assert operator_client.get("/api/models/nope/datasets/").status_code == 404
    assert add(operator_client, labelled()).status_code == 404


@pytest.mark.child
def test_an_evaluation_measures_the_exact_accuracy_and_keeps_it_with_the_data_set(jobs_model, operator_client):
    pixels = rows(40, seed=3)
    version = jobs_model.versions.get(number=1)
    answers = predictions(version, pixels)
    labels = np.where(np.arange(40) < 30, answers, (answers + 1) % CLASSES)  # the last 10 wrong
    add(operator_client, npz_upload("holdout.npz", input=pixels, labels=labels))
    job = Job.objects.get(kind=JobKind.EVALUATION, version=version)

    assert runner.run(job.pk) == JobStatus.SUCCEEDED

    version.refresh_from_db()
    kept = version.metrics["evaluation"]["holdout"]
    assert (kept["accuracy"], kept["samples"], kept["job"]) == (0.75, 40, job.pk)
    assert kept["dataset_sha256"] == EvaluationDataset.objects.get(name="holdout").sha256
    table = version_metrics.evaluation_table(jobs_model)
    assert [(row["version"], row["cells"]) for row in table["rows"]] == [(2, {"holdout": {"status": "queued"}}), (1, {"holdout": {"accuracy": 0.75}})]


def test_an_npz_data_set_of_thousands_of_members_is_refused_by_their_count_before_any_is_opened(jobs_model, operator_client,
                                                                                                artifact_root):
    upload = members_npz("holdout.npz", {"input": rows(6), "labels": np.arange(6) % CLASSES}, junk=5000)

    response = add(operator_client, upload)

    assert response.status_code == 400
    # The count, not the first junk member's bytes: the console read the zip's directory, no member.
    assert response.json()["error"] == (
        "the data set does not fit version 1 (the stable version, which it was checked against): the .npz file holds 5002 members; "
        "it can hold at most 2 (one array per input of the model and 'labels') "
        f"(version 1 takes 'input' rows [{INPUT_WIDTH}] float32, and 'labels')")
    assert EvaluationDataset.objects.count() == 0 and Job.objects.count() == 0 and dataset_files(artifact_root) == []


def test_without_a_ready_version_an_npz_data_set_of_thousands_of_members_is_refused_by_their_count(jobs_model, operator_client,
                                                                                                 artifact_root):
    jobs_model.versions.update(status=VersionStatus.VALIDATING)
    upload = members_npz("holdout.npz", {"input": rows(6), "labels": np.arange(6) % CLASSES}, junk=5000)

    response = add(operator_client, upload)

    assert (response.status_code, response.json()["error"]) == (
        400, "the data set cannot be used: the .npz file holds 5002 members; it can hold at most 1024 arrays")
    assert EvaluationDataset.objects.count() == 0 and Job.objects.count() == 0 and dataset_files(artifact_root) == []


def test_a_data_set_description_with_a_directional_override_is_refused_and_stores_nothing(jobs_model, operator_client, artifact_root):
    response = add(operator_client, labelled(6), description="\u202eslebal")

    assert response.status_code == 400
    assert response.json()["error"] == "description: must not hold control characters or directional overrides (found U+202E)"
    assert not EvaluationDataset.objects.exists()
    assert dataset_files(artifact_root) == []


@pytest.mark.parametrize("charset", ["utf-7", "unicode_escape"])
def test_a_multipart_upload_in_another_charset_is_a_400_and_stores_nothing(jobs_model, operator_client, artifact_root, charset):
    """Django decodes a multipart form's fields by its charset: under utf-7 a description of
    "+ADw-script+AD4-" was stored as "<script>", other text than a proxy in front had read."""
    from django.test.client import encode_multipart

    body = encode_multipart("B", {"file": labelled(6), "name": "held", "task": "classification", "description": "safe +ADw-script+AD4-"})

    response = operator_client.post(DATASETS, body, content_type=f"multipart/form-data; boundary=B; charset={charset}")

    assert response.status_code == 400
    assert response.json()["error"] == ("HTTP requests with the 'multipart/form-data' content type must be UTF-8 encoded, "
                                        f"not charset={charset}.")
    assert not EvaluationDataset.objects.exists() and dataset_files(artifact_root) == []
