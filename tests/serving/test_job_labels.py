"""What an upload knows of the labels an evaluation can score (``serving.jobs.labels``):
the bounds that keep its check's memory small, and the width a regression label needs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serving.jobs.formats import FormatError, check_dataset
from serving.jobs.labels import (
    CHECK_BYTES,
    MAX_LABEL_BYTES,
    MAX_LABEL_VALUES,
    LabelRule,
    header_problem,
    reads_rows,
    regression_width,
    rows_per_check,
    value_problem,
)


def test_labels_are_read_at_most_check_bytes_at_a_time_however_wide_a_row():
    """65,536 rows of a million float64 values each were read at once: 2.3 GB of console
    memory for a 778 KB compressed upload."""
    assert rows_per_check(8 * 1_000_000) * 8 * 1_000_000 <= CHECK_BYTES
    assert rows_per_check(8) == 65_536
    assert MAX_LABEL_VALUES * np.dtype(np.longdouble).itemsize <= CHECK_BYTES  # the widest row read fits in one chunk


def test_only_float_labels_and_short_text_classes_are_read_the_others_are_judged_by_their_header():
    """A 117 KB file of three '<U10000000' labels took 153 MiB to read, for nothing: text
    that wide is refused by its header, unread. Text classes up to 200 characters are read
    for what a page could not show (ESC, U+202E, a line break); an integer is a class
    whatever its value."""
    assert header_problem(np.dtype("<U10000000"), (), LabelRule("classification")).startswith(
        "the labels are text of up to 10000000 characters")
    assert reads_rows(np.dtype("<U200"), LabelRule("classification"))
    assert not reads_rows(np.dtype(np.int64), LabelRule("classification"))
    assert not reads_rows(np.dtype(np.int64), LabelRule("regression"))
    assert reads_rows(np.dtype(np.float32), LabelRule("classification"))
    assert not reads_rows(np.dtype(np.float32), LabelRule())


def test_labels_over_the_byte_bound_are_refused_from_their_header():
    """Inflating them ran inside the upload's request: 400 MB of labels in a 389 KB file took a second."""
    problem = header_problem(np.dtype(np.float64), (1000,), LabelRule("regression"), MAX_LABEL_BYTES + 1)

    assert problem == f"the labels hold {MAX_LABEL_BYTES + 1} bytes; at most {MAX_LABEL_BYTES} are read"


def test_a_label_row_wider_than_the_bound_is_refused_from_its_header():
    problem = header_problem(np.dtype(np.float64), (MAX_LABEL_VALUES + 1,), LabelRule("regression"))

    assert problem == f"a label row holds {MAX_LABEL_VALUES + 1} values; at most {MAX_LABEL_VALUES} are read"


def test_the_regression_width_is_the_first_outputs_values_per_row_when_fixed():
    assert regression_width({"outputs": [{"name": "y", "shape": ["batch", 3, 2]}, {"name": "z", "shape": ["batch", 9]}]}) == 6
    assert regression_width({"outputs": [{"name": "y", "shape": ["batch"]}]}) == 1


def test_the_regression_width_is_unknown_when_a_dimension_is_not_fixed_or_no_output_is_recorded():
    assert regression_width({"outputs": [{"name": "y", "shape": ["batch", "width"]}]}) is None
    assert regression_width({"outputs": []}) is None
    assert regression_width(None) is None


def test_without_a_width_from_the_model_regression_labels_must_be_as_wide_as_the_first():
    rule = LabelRule("regression").after([1.0, 2.0])

    assert value_problem(3.0, rule) == "the label has 1 values; the first row's label has 2"
    assert value_problem([3.0, 4.0], rule) is None


def test_a_width_from_the_model_is_kept_after_the_first_row():
    rule = LabelRule("regression", 4).after([1.0, 2.0])

    assert value_problem([1.0, 2.0], rule) == "the label has 2 values; a row of the model's first output has 4"


def test_a_jsonl_data_set_whose_regression_labels_change_width_is_refused_at_the_row(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in [{"x": [1.0], "label": [1.0, 2.0]}, {"x": [1.0], "label": 3.0}]))

    with pytest.raises(FormatError, match="line 2: the label has 1 values; the first row's label has 2"):
        check_dataset(path, "jsonl", None, LabelRule("regression"))
