"""serving/jobs/writers.py: a model's answers written as .npy rows, whatever their shape."""

from __future__ import annotations

import numpy as np

from serving.engine import TensorSpec
from serving.jobs.writers import RawRows


def test_an_output_whose_rows_hold_no_values_is_written_as_an_array_of_that_shape(tmp_path):
    """A model may answer [batch, 0]; writing it failed the job on a raw TypeError from memoryview."""
    rows = RawRows(TensorSpec("empty", "FP32", (None, 0)), tmp_path)
    rows.append(np.zeros((3, 0), np.float32))
    rows.append(np.zeros((2, 0), np.float32))

    with open(tmp_path / "out.npy", "wb") as target:
        rows.write_npy(target)
    rows.close()

    written = np.load(tmp_path / "out.npy")
    assert (written.shape, written.dtype) == ((5, 0), np.float32)
