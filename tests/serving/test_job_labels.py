"""What an upload knows of the labels an evaluation can score (``serving.jobs.labels``):
the bounds that keep its check's memory small, and the width a regression label needs."""

from __future__ import annotations

import numpy as np

from serving.jobs.labels import CHECK_BYTES, MAX_LABEL_VALUES, LabelRule, header_problem, regression_width, rows_per_check


def test_labels_are_read_at_most_check_bytes_at_a_time_however_wide_a_row():
    """65,536 rows of a million float64 values each were read at once: 2.3 GB of console
    memory for a 778 KB compressed upload."""
    assert rows_per_check(8 * 1_000_000) * 8 * 1_000_000 <= CHECK_BYTES
    assert rows_per_check(CHECK_BYTES * 4) == 1
    assert rows_per_check(8) == 65_536


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
