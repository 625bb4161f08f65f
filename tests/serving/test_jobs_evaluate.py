"""`python -m serving.jobs evaluate`: how well a model answers a labelled dataset."""

from __future__ import annotations

import numpy as np
import pytest
from jobs_testkit import (
    captured_events,
    first_feature,
    identity_mlp,
    labels_of_argmax,
    relu_and_negated,
    run_job_cli,
    write_jsonl,
    write_model,
)

from serving.jobs import evaluate
from serving.jobs.protocol import run_job

# The identity model predicts the position of each row's largest value; 7 of these 10 labels agree.
PREDICTED = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
LABELS = [0, 1, 2, 3, 0, 1, 2, 0, 3, 2]
REPEATS = 30  # 300 rows: more than one evaluation batch


def one_hot_rows(classes: list[int], width: int = 4) -> np.ndarray:
    rows = np.zeros((len(classes), width), np.float32)
    rows[np.arange(len(classes)), classes] = 3.0
    return rows


def evaluate_in_process(capsys, *args) -> tuple[int, list[dict]]:
    code = run_job(lambda: evaluate.run(*args))
    return code, captured_events(capsys.readouterr().out)


@pytest.fixture
def identity(tmp_path):
    return write_model(tmp_path / "identity.onnx", identity_mlp(4))


def test_classification_reports_exact_accuracy_per_class_scores_and_the_confusion_matrix(tmp_path, identity):
    np.savez(tmp_path / "d.npz", input=one_hot_rows(PREDICTED * REPEATS), labels=np.array(LABELS * REPEATS))
    job = run_job_cli("evaluate", "--model", identity, "--dataset", tmp_path / "d.npz", "--task", "classification")
    assert job.returncode == 0
    assert job.result == {
        "task": "classification", "samples": 300, "accuracy": 0.7, "classes": [0, 1, 2, 3], "classes_count": 4,
        "per_class": {
            "0": {"precision": 2 / 3, "recall": 2 / 3, "support": 90},
            "1": {"precision": 2 / 3, "recall": 1.0, "support": 60},
            "2": {"precision": 1.0, "recall": 2 / 3, "support": 90},
            "3": {"precision": 0.5, "recall": 0.5, "support": 60},
        },
        "confusion_matrix": [[60, 0, 0, 30], [0, 60, 0, 0], [0, 30, 60, 0], [30, 0, 0, 30]],
    }
    assert len(job.progress) > 1 and job.progress[-1]["done"] == 300


def test_classes_stored_as_long_double_floats_are_scored_as_integers(tmp_path, capsys, identity):
    """``np.longdouble(1).item()`` is itself, not a float: such labels passed the upload's
    check and failed every evaluation at row 0."""
    np.savez(tmp_path / "d.npz", input=one_hot_rows(PREDICTED), labels=np.array(LABELS, dtype=np.longdouble))

    code, events = evaluate_in_process(capsys, identity, tmp_path / "d.npz", "npz", "classification")

    assert code == 0
    assert (events[-1]["result"]["accuracy"], events[-1]["result"]["classes"]) == (0.7, [0, 1, 2, 3])


def test_string_labels_compare_as_text_and_a_class_never_predicted_has_no_precision(tmp_path, capsys, identity):
    rows = one_hot_rows([0, 1, 1, 2])
    labels = ["0", "1", "3", "2"]  # class "3" is never predicted
    write_jsonl(tmp_path / "d.jsonl", [{"input": row.tolist(), "label": label} for row, label in zip(rows, labels)])
    code, events = evaluate_in_process(capsys, identity, tmp_path / "d.jsonl", "jsonl", "classification")
    assert code == 0
    result = events[-1]["result"]
    assert (result["accuracy"], result["classes"]) == (0.75, ["0", "1", "2", "3"])
    assert result["per_class"]["3"] == {"precision": None, "recall": 0.0, "support": 1}
    assert result["per_class"]["1"] == {"precision": 0.5, "recall": 1.0, "support": 1}


def test_past_64_classes_no_matrix_is_kept_and_per_class_figures_only_for_the_256_most_supported(tmp_path, capsys, identity):
    """540 classes made a version page of 294,338 cells; 1,500 a result line the runner
    dropped (the job then 'failed with no message')."""
    labels = [1000 + index for index in range(600)] + [1] * 400  # 600 classes of one row, then class 1
    np.savez(tmp_path / "d.npz", input=one_hot_rows([1] * 1000), labels=np.array(labels))

    code, events = evaluate_in_process(capsys, identity, tmp_path / "d.npz", "npz", "classification")

    result = events[-1]["result"]
    assert code == 0
    assert (result["accuracy"], result["classes_count"], result["confusion_matrix"]) == (0.4, 601, None)
    assert len(result["per_class"]) == len(result["classes"]) == evaluate.MAX_PER_CLASS
    assert result["per_class"]["1"] == {"precision": 0.4, "recall": 1.0, "support": 400}  # the most supported is kept


def test_up_to_64_classes_the_matrix_is_kept(tmp_path, capsys, identity):
    labels = [1000 + index for index in range(63)] + [1]
    np.savez(tmp_path / "d.npz", input=one_hot_rows([1] * 64), labels=np.array(labels))

    code, events = evaluate_in_process(capsys, identity, tmp_path / "d.npz", "npz", "classification")

    result = events[-1]["result"]
    assert (result["classes_count"], len(result["confusion_matrix"]), len(result["per_class"])) == (64, 64, 64)


def test_a_class_the_model_answers_as_text_is_shown_cut_and_without_hidden_characters(tmp_path, capsys):
    """A model's string output may be anything: ESC sequences and U+202E were kept as
    classes, and a class of 5,000 characters as a row heading of the version page."""
    model = write_model(tmp_path / "named.onnx", labels_of_argmax(["\x1b[2Jcat", "dog\u202eevil", "y" * 5000]))
    write_jsonl(tmp_path / "d.jsonl", [{"input": row.tolist(), "label": "cat"} for row in one_hot_rows([0, 1, 2], width=3)])

    code, events = evaluate_in_process(capsys, model, tmp_path / "d.jsonl", "jsonl", "classification")

    classes = events[-1]["result"]["classes"]
    assert code == 0
    assert "\ufffd[2Jcat" in classes and "dog\ufffdevil" in classes and "y" * 200 in classes
    assert max(len(cls) for cls in classes) == 200


def test_regression_reports_exact_mae_and_mse(tmp_path, capsys):
    model = write_model(tmp_path / "first.onnx", first_feature(4))
    rows = np.zeros((4, 4), np.float32)
    rows[:, 0] = [1.0, 2.0, 3.0, 4.0]
    np.savez(tmp_path / "d.npz", input=rows, labels=np.array([1.5, 1.0, 5.0, 4.0]))  # errors -0.5, 1, -2, 0
    code, events = evaluate_in_process(capsys, model, tmp_path / "d.npz", "npz", "regression")
    assert code == 0
    assert events[-1]["result"] == {"task": "regression", "samples": 4, "mae": 0.875, "mse": 1.3125}


def test_regression_labels_may_be_lists_in_jsonl(tmp_path, capsys):
    model = write_model(tmp_path / "two.onnx", relu_and_negated(2))
    write_jsonl(tmp_path / "d.jsonl", [{"input": [1, -2], "label": [1, 1]}, {"input": [3, 4], "label": [3, 2]}])
    code, events = evaluate_in_process(capsys, model, tmp_path / "d.jsonl", "jsonl", "regression")
    assert code == 0
    assert events[-1]["result"] == {"task": "regression", "samples": 2, "mae": 0.75, "mse": 1.25}


def test_a_model_without_a_class_output_cannot_be_scored_as_classification(tmp_path, capsys):
    model = write_model(tmp_path / "first.onnx", first_feature(4))
    np.savez(tmp_path / "d.npz", input=np.zeros((3, 4), np.float32), labels=np.arange(3))
    code, events = evaluate_in_process(capsys, model, tmp_path / "d.npz", "npz", "classification")
    assert code == 2
    assert events[-1]["reason"].startswith("no output of the model gives a class")


def test_a_regression_label_of_the_wrong_width_is_named_by_row(tmp_path, capsys):
    model = write_model(tmp_path / "two.onnx", relu_and_negated(2))
    write_jsonl(tmp_path / "d.jsonl", [{"input": [1, 2], "label": [1, 2]}, {"input": [3, 4], "label": 3}])
    code, events = evaluate_in_process(capsys, model, tmp_path / "d.jsonl", "jsonl", "regression")
    assert code == 2
    assert events[-1] == {"event": "error", "reason": "row 1: the label has 1 values; output 'relu' has 2 per row"}


def test_a_dataset_without_the_model_input_is_an_error_event(tmp_path, capsys, identity):
    np.savez(tmp_path / "d.npz", pixels=np.zeros((3, 4), np.float32), labels=np.arange(3))
    code, events = evaluate_in_process(capsys, identity, tmp_path / "d.npz", "npz", "classification")
    assert code == 2
    assert events == [{"event": "error", "reason": "the .npz array 'pixels' is not an input of the model "
                                                   "(its inputs: 'input')"}]


def test_a_bad_jsonl_dataset_row_fails_the_evaluation_with_its_line(tmp_path, capsys, identity):
    write_jsonl(tmp_path / "d.jsonl", [{"input": [0, 0, 0, 1], "label": 3}, {"input": [0, 1], "label": 1}])
    code, events = evaluate_in_process(capsys, identity, tmp_path / "d.jsonl", "jsonl", "classification")
    assert code == 2
    assert events[-1]["reason"] == "line 2: input 'input' has shape [2]; the model expects [4]"
