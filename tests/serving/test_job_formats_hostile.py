"""Array files written to break their reader: whatever bytes an upload holds, reading it
gives rows or a `FormatError` that names the file and the problem, never another
exception (the console answered each of those 500, the job child crashed on it)."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.jobs.formats import LABELS_MEMBER, ArrayFile, FormatError, InputLayout, check_batch_input, check_dataset, jsonl_rows
from serving.jobs.labels import LabelRule
from tests.fixtures.hostile_arrays import (
    npy_bytes,
    npy_with_header,
    npz_bytes,
    with_directory_moved,
    with_empty_last_name,
    with_version_needed,
)

FEATURES = InputLayout("input", np.dtype(np.float32), (4,))
ROWS = np.arange(12, dtype=np.float32).reshape(3, 4)
CLASSIFICATION = LabelRule("classification")


def refusal(path, file_format: str) -> str:
    with pytest.raises(FormatError) as refused:
        check_batch_input(path, file_format, (FEATURES,))
    return refused.value.reason


def test_a_header_numpy_cannot_tokenize_is_refused_as_no_readable_npy_array(tmp_path):
    path = tmp_path / "x.npy"
    path.write_bytes(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': ((3, 4), }", ROWS.tobytes()))

    assert refusal(path, "npy").startswith("the .npy file is not a readable .npy array (")


@pytest.mark.parametrize("descr", ["()", "-" * 3000 + "1"], ids=["a tuple without a dtype", "a literal nested past the parser's recursion"])
def test_a_dtype_description_numpy_cannot_build_is_refused_as_no_readable_npy_array(tmp_path, descr):
    path = tmp_path / "x.npy"
    path.write_bytes(npy_with_header(f"{{'descr': {descr}, 'fortran_order': False, 'shape': (3, 4), }}", ROWS.tobytes()))

    assert refusal(path, "npy").startswith("the .npy file is not a readable .npy array (")


def test_an_npz_member_needing_a_zip_version_zipfile_lacks_is_refused_as_no_readable_archive(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(with_version_needed(npz_bytes({"input": ROWS}), 99))

    assert refusal(path, "npz") == "the .npz file is not a readable zip archive (zip file version 9.9)"


def test_an_npz_member_placed_before_the_files_start_is_refused_naming_it(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(with_directory_moved(npz_bytes({"input": ROWS}), 100))

    assert refusal(path, "npz") == "the .npz array 'input' cannot be opened: the zip directory places it 100 bytes before the file's start"


def test_an_npz_member_with_an_empty_name_is_refused_as_no_array(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(with_empty_last_name(npz_bytes({"input": ROWS, "mask": ROWS})))

    assert refusal(path, "npz") == "the .npz member '' is not a .npy array"


# ---------------------------------------------------------------- mutated bytes


def read_everything(path, file_format: str) -> None:
    """What the console checks at upload, then every row as a job reads them."""
    if file_format == "npy":
        check_batch_input(path, "npy", (FEATURES,))
    else:
        check_dataset(path, "npz", (FEATURES,), CLASSIFICATION)
    with ArrayFile(path, file_format, label_member=LABELS_MEMBER if file_format == "npz" else None) as arrays:
        names = list(arrays.streams)
        for _ in arrays.chunks(names, [None] * len(names), 2):
            pass


VALID = {
    "npy": npy_bytes(ROWS),
    "npz": npz_bytes({"input": ROWS, LABELS_MEMBER: np.arange(3)}),
    "npz, deflated": npz_bytes({"input": ROWS, LABELS_MEMBER: np.arange(3)}, zipfile.ZIP_DEFLATED),
}
MUTATIONS = st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(VALID)), mutations=MUTATIONS, cut=st.one_of(st.none(), st.floats(0, 1)))
def test_a_mutated_array_file_is_read_or_refused_never_crashes_its_reader(tmp_path, kind, mutations, cut):
    data = bytearray(VALID[kind])
    for place, value in mutations:
        data[int(place * len(data))] = value
    if cut is not None:
        data = data[: int(cut * len(data))]
    path = tmp_path / f"mutant.{kind[:3]}"
    path.write_bytes(bytes(data))

    try:
        read_everything(path, kind[:3])
    except FormatError as refused:
        assert refused.reason


# ---------------------------------------------------------------- rows of no bytes


def test_an_npy_header_declaring_rows_of_no_values_is_refused_however_many_it_claims(tmp_path):
    """128 bytes declaring 10**18 rows of width 0: no data to bound the count by the file's size."""
    path = tmp_path / "x.npy"
    path.write_bytes(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000000000, 0), }"))

    with pytest.raises(FormatError) as refused:
        check_batch_input(path, "npy")
    assert refused.value.reason == "the .npy file has shape [1000000000000000000, 0] of float32: a row of it holds no bytes"


def test_an_npz_input_whose_rows_have_a_dimension_of_zero_is_refused_naming_it(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(npz_bytes({"input": np.zeros((3, 4, 0), np.float32)}))

    with pytest.raises(FormatError) as refused:
        check_batch_input(path, "npz")
    assert refused.value.reason == "the .npz array 'input' has shape [3, 4, 0] of float32: a row of it holds no bytes"


def test_labels_of_text_zero_characters_wide_are_refused_naming_them(tmp_path):
    labels = npy_with_header("{'descr': '<U0', 'fortran_order': False, 'shape': (3,), }")
    path = tmp_path / "d.npz"
    path.write_bytes(npz_bytes({"input": ROWS, LABELS_MEMBER: labels}))

    with pytest.raises(FormatError) as refused:
        check_dataset(path, "npz", (FEATURES,), CLASSIFICATION)
    assert refused.value.reason == "the .npz array 'labels' has shape [3] of <U0: a row of it holds no bytes"


def test_a_jsonl_row_of_no_values_is_refused_where_the_models_rows_have_no_fixed_width(tmp_path):
    any_width = InputLayout("input", np.dtype(np.float32), (None,))
    path = tmp_path / "x.jsonl"
    path.write_text("[]\n[1.5]\n")

    with pytest.raises(FormatError) as refused:
        check_batch_input(path, "jsonl", (any_width,))
    assert refused.value.reason == "line 1: input 'input' has shape [0]: a row of it holds no values"
    assert [(row.line, row.error) for row in jsonl_rows(path, (any_width,))] == [
        (1, "line 1: input 'input' has shape [0]: a row of it holds no values"), (2, None)]
