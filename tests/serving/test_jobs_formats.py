"""serving/jobs/formats.py: streaming readers of job files and the console's upload checks."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest
from jobs_testkit import REPO_ROOT, write_jsonl
from numpy.lib import format as npy_format

from serving.jobs.formats import (
    ArrayFile,
    FormatError,
    InputLayout,
    check_batch_input,
    check_dataset,
    csv_rows,
    group_rows,
    jsonl_rows,
)

FLOAT = np.dtype(np.float32)
FEATURES = InputLayout("input", FLOAT, (4,))


def truncated_npy(path, rows=10, width=4):
    np.save(path, np.ones((rows, width), np.float32))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 5])
    return path


# ---------------------------------------------------------------- upload checks


def test_the_formats_module_imports_neither_onnxruntime_nor_onnx():
    code = "import sys, serving.jobs.formats; print(sorted({'onnxruntime', 'onnx'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert done.stdout.strip() == "[]"


def test_check_batch_input_gives_the_rows_of_an_npy_file(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((7, 3), np.float32))
    assert check_batch_input(tmp_path / "x.npy", "npy") == 7


def test_a_truncated_npy_file_is_refused_as_truncated(tmp_path):
    with pytest.raises(FormatError, match="truncated"):
        check_batch_input(truncated_npy(tmp_path / "x.npy"), "npy")


def test_a_pickled_npy_file_is_refused_without_unpickling_it(tmp_path):
    np.save(tmp_path / "x.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(FormatError, match="pickled"):
        check_batch_input(tmp_path / "x.npy", "npy")


def test_a_file_that_is_not_npy_is_refused(tmp_path):
    (tmp_path / "x.npy").write_bytes(b"hello, not an array")
    with pytest.raises(FormatError, match="not a readable .npy array"):
        check_batch_input(tmp_path / "x.npy", "npy")


def test_a_fortran_order_array_is_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.asfortranarray(np.ones((3, 4), np.float32)))
    with pytest.raises(FormatError, match="Fortran order"):
        check_batch_input(tmp_path / "x.npy", "npy")


def test_a_garbage_npz_file_is_refused(tmp_path):
    (tmp_path / "x.npz").write_bytes(b"PK\x03\x04 but garbage after the magic")
    with pytest.raises(FormatError, match="not a readable zip archive"):
        check_batch_input(tmp_path / "x.npz", "npz")


def test_an_npz_whose_arrays_differ_in_rows_is_refused(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.zeros((3, 2)), b=np.zeros((4, 2)))
    with pytest.raises(FormatError, match="different numbers of rows"):
        check_batch_input(tmp_path / "x.npz", "npz")


def test_an_npz_member_that_is_not_an_array_is_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "x.npz", "w") as archive:
        archive.writestr("notes.txt", "hello")
    with pytest.raises(FormatError, match="'notes.txt' is not a .npy array"):
        check_batch_input(tmp_path / "x.npz", "npz")


def test_a_truncated_npz_member_is_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "x.npz", "w") as archive:
        truncated = truncated_npy(tmp_path / "a.npy")
        archive.write(truncated, "a.npy")
    with pytest.raises(FormatError, match="'a' is truncated"):
        check_batch_input(tmp_path / "x.npz", "npz")


def test_a_jsonl_file_whose_first_line_is_not_json_is_refused(tmp_path):
    (tmp_path / "x.jsonl").write_text("{oops\n[1, 2]\n")
    with pytest.raises(FormatError, match="line 1 is not valid JSON"):
        check_batch_input(tmp_path / "x.jsonl", "jsonl")


def test_a_csv_file_with_only_a_header_is_refused(tmp_path):
    (tmp_path / "x.csv").write_text("a,b,c\n")
    with pytest.raises(FormatError, match="no rows"):
        check_batch_input(tmp_path / "x.csv", "csv")


def test_a_csv_file_with_a_header_and_numbers_passes(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    assert check_batch_input(tmp_path / "x.csv", "csv") is None


def test_an_unknown_batch_format_is_refused(tmp_path):
    with pytest.raises(FormatError, match="not a batch input format"):
        check_batch_input(tmp_path / "x.parquet", "parquet")


def test_check_dataset_counts_the_rows_of_an_npz_dataset(tmp_path):
    np.savez(tmp_path / "d.npz", input=np.zeros((5, 4), np.float32), labels=np.arange(5))
    assert check_dataset(tmp_path / "d.npz", "npz") == 5


def test_an_npz_dataset_without_labels_is_refused(tmp_path):
    np.savez(tmp_path / "d.npz", input=np.zeros((5, 4), np.float32))
    with pytest.raises(FormatError, match="no 'labels' array"):
        check_dataset(tmp_path / "d.npz", "npz")


def test_check_dataset_counts_the_rows_of_a_jsonl_dataset(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"input": [1, 2], "label": "cat"}, {"input": [3, 4], "label": 2}])
    assert check_dataset(tmp_path / "d.jsonl", "jsonl") == 2


def test_a_jsonl_dataset_row_without_a_label_is_refused_by_line(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"input": [1, 2], "label": 0}, {"input": [3, 4]}])
    with pytest.raises(FormatError, match="line 2 is not a JSON object with a 'label'"):
        check_dataset(tmp_path / "d.jsonl", "jsonl")


def test_a_jsonl_dataset_with_a_label_of_the_wrong_kind_is_refused(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"input": [1, 2], "label": {"class": 1}}])
    with pytest.raises(FormatError, match="line 1: the label is not"):
        check_dataset(tmp_path / "d.jsonl", "jsonl")


# ---------------------------------------------------------------- readers


def test_npz_arrays_are_read_in_lockstep_chunks(tmp_path):
    a, b = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10, dtype=np.int64)
    np.savez_compressed(tmp_path / "x.npz", a=a, b=b)
    with ArrayFile(tmp_path / "x.npz", "npz") as arrays:
        chunks = list(arrays.chunks(["a", "b"], [None, None], 4))
    assert [start for start, _ in chunks] == [0, 4, 8]
    np.testing.assert_array_equal(np.concatenate([chunk[0] for _, chunk in chunks]), a)
    np.testing.assert_array_equal(np.concatenate([chunk[1] for _, chunk in chunks]), b)


def test_chunks_are_converted_to_the_input_dtype(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(8, dtype=">f8").reshape(2, 4))
    with ArrayFile(tmp_path / "x.npy", "npy") as arrays:
        [(_, [chunk])] = list(arrays.chunks([None], [FLOAT], 10))
    assert chunk.dtype == FLOAT
    np.testing.assert_array_equal(chunk, np.arange(8, dtype=np.float32).reshape(2, 4))


def test_rows_read_into_a_given_buffer_fill_its_start_and_are_a_view_of_it(tmp_path):
    rows = np.arange(24, dtype=np.float32).reshape(6, 4)
    np.save(tmp_path / "x.npy", rows)
    buffer = bytearray(4 * rows[0].nbytes)
    with ArrayFile(tmp_path / "x.npy", "npy") as arrays:
        stream = arrays.streams[None]
        first = stream.read(4, FLOAT, into=buffer)
        np.testing.assert_array_equal(first, rows[:4])
        assert np.shares_memory(first, np.frombuffer(buffer, np.uint8))
        rest = stream.read(2, FLOAT, into=buffer)
    np.testing.assert_array_equal(rest, rows[4:])
    np.testing.assert_array_equal(np.frombuffer(buffer, np.float32)[8:], rows[2:4].ravel())  # the tail is untouched


def test_an_array_with_the_wrong_feature_count_does_not_fit_the_input(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((3, 5), np.float32))
    with ArrayFile(tmp_path / "x.npy", "npy") as arrays, pytest.raises(FormatError) as refused:
        arrays.match_inputs([FEATURES])
    assert refused.value.reason == "the .npy file has rows of shape [5]; input 'input' expects rows of shape [4]"


def test_floats_do_not_fit_an_integer_input(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((3, 4), np.float32))
    with ArrayFile(tmp_path / "x.npy", "npy") as arrays, pytest.raises(FormatError, match="change kind"):
        arrays.match_inputs([InputLayout("ids", np.dtype(np.int64), (4,))])


def test_a_single_npy_does_not_feed_a_model_with_two_inputs(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((3, 4), np.float32))
    with ArrayFile(tmp_path / "x.npy", "npy") as arrays, pytest.raises(FormatError, match="use an .npz file"):
        arrays.match_inputs([FEATURES, InputLayout("other", FLOAT, (4,))])


def test_an_npz_array_that_is_not_an_input_is_named(tmp_path):
    np.savez(tmp_path / "x.npz", input=np.zeros((3, 4), np.float32), extra=np.zeros((3, 1)))
    with ArrayFile(tmp_path / "x.npz", "npz") as arrays, pytest.raises(FormatError, match="'extra' is not an input"):
        arrays.match_inputs([FEATURES])


def test_jsonl_rows_accept_objects_and_bare_lists_and_flag_bad_lines(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", [{"input": [1, 2, 3, 4]}, [5, 6, 7, 8], [1, 2], {"inptu": [1, 2, 3, 4]},
                                       ["a", "b", "c", "d"]])
    rows = list(jsonl_rows(tmp_path / "x.jsonl", [FEATURES]))
    assert [row.feeds[0].tolist() if row.feeds else None for row in rows] == [[1, 2, 3, 4], [5, 6, 7, 8], None, None, None]
    assert [row.error for row in rows[2:]] == [
        "line 3: input 'input' has shape [2]; the model expects [4]",
        "line 4: 'inptu' is not an input of the model (its inputs: 'input')",
        "line 5: input 'input' holds something other than numbers",
    ]
    assert rows[0].feeds[0].dtype == FLOAT


def test_blank_jsonl_lines_are_skipped_but_line_numbers_stay_true(tmp_path):
    (tmp_path / "x.jsonl").write_text("[1,2,3,4]\n\n{bad\n")
    rows = list(jsonl_rows(tmp_path / "x.jsonl", [FEATURES]))
    assert [(row.index, row.line, row.error) for row in rows] == [(0, 1, None), (1, 3, "line 3: the line is not valid JSON")]


def test_a_csv_header_is_skipped_and_a_short_row_is_its_own_error(tmp_path):
    (tmp_path / "x.csv").write_text("a,b,c,d\n1,2,3,4\n1,2,3\n5,6,7,x\n")
    rows = list(csv_rows(tmp_path / "x.csv", [FEATURES]))
    assert rows[0].feeds[0].tolist() == [1, 2, 3, 4]
    assert [row.error for row in rows] == [None, "line 3: the row has 3 values; input 'input' expects 4",
                                           "line 4: field 4 ('x') is not a number"]


def test_a_csv_number_in_other_digits_or_with_underscores_is_an_error_of_its_row(tmp_path):
    # float() reads '١٠' and '1_0' as 10: no spreadsheet writes them, and a typo read as a
    # number is an answer on the wrong input.
    (tmp_path / "x.csv").write_text("1,2,3,4\n1,2,3,\u0661\u0660\n1_0,2,3,4\n5,6,7,8\n", encoding="utf-8")
    rows = list(csv_rows(tmp_path / "x.csv", [FEATURES]))
    assert [row.error for row in rows] == [None, "line 2: field 4 ('\u0661\u0660') is not a number", "line 3: field 1 ('1_0') is not a number", None]


def test_a_first_csv_record_of_numbers_with_underscores_is_a_header_not_a_row(tmp_path):
    (tmp_path / "x.csv").write_text("1_0,2_0,3_0,4_0\n1,2,3,4\n")
    rows = list(csv_rows(tmp_path / "x.csv", [FEATURES]))
    assert [(row.line, row.feeds[0].tolist()) for row in rows] == [(2, [1, 2, 3, 4])]


def test_a_csv_file_starting_with_a_byte_order_mark_keeps_its_first_row(tmp_path):
    """Excel's "CSV UTF-8" writes a BOM: read into the first value, that row was taken for a
    header and dropped, and every output row shifted by one."""
    (tmp_path / "x.csv").write_bytes(b"\xef\xbb\xbf1,2,3,4\n5,6,7,8\n")
    rows = list(csv_rows(tmp_path / "x.csv", [FEATURES]))
    assert [(row.line, row.feeds[0].tolist()) for row in rows] == [(1, [1, 2, 3, 4]), (2, [5, 6, 7, 8])]


def test_csv_feeds_only_a_single_rank_two_input(tmp_path):
    (tmp_path / "x.csv").write_text("1,2\n")
    with pytest.raises(FormatError, match="one input of shape \\[batch, features\\]"):
        list(csv_rows(tmp_path / "x.csv", [InputLayout("image", FLOAT, (3, 8, 8))]))


def test_rows_are_grouped_by_shape_and_split_around_bad_rows(tmp_path):
    free = InputLayout("input", FLOAT, (None,))
    write_jsonl(tmp_path / "x.jsonl", [[1, 2], [3, 4], [5, 6, 7], "bad", [8, 9, 1], [2, 3, 4]])
    batches = group_rows(jsonl_rows(tmp_path / "x.jsonl", [free]), max_rows=2, max_bytes=1 << 20)
    assert [[row.index for row in batch] for batch in batches] == [[0, 1], [2], [3], [4, 5]]


# ---------------------------------------------------------------- rows longer than the model's rows


WIDE = InputLayout("input", FLOAT, (64,))


def _peak_bytes(call) -> int:
    tracemalloc.start()
    try:
        with contextlib.suppress(FormatError):
            call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(("file_format", "line"), [("csv", ",".join(["1.5"] * 1_000_000)), ("jsonl", "[" + ",".join(["1.5"] * 1_000_000) + "]")])
def test_a_first_row_far_wider_than_the_model_is_refused_before_it_is_parsed(tmp_path, file_format, line):
    """A 40 MB line of numbers took 0.6-1.2 GB of the console's memory to be told it had
    the wrong width: the csv module split it, json.loads built a float per value."""
    path = tmp_path / f"x.{file_format}"
    path.write_text(line + "\n")

    with pytest.raises(FormatError, match="more than a row of the model's inputs takes as text"):
        check_batch_input(path, file_format, [WIDE])
    assert _peak_bytes(lambda: check_batch_input(path, file_format, [WIDE])) < 1_000_000  # the file is 4 MB


def test_a_jsonl_dataset_row_far_wider_than_the_model_is_refused_by_line(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"input": [1.0] * 64, "label": 1}, {"input": [1.0] * 100_000, "label": 1}])
    with pytest.raises(FormatError, match="line 2 is longer than .* more than a row of the model's inputs takes as text"):
        check_dataset(tmp_path / "d.jsonl", "jsonl", [WIDE])


def test_rows_as_long_as_text_of_the_models_width_can_be_are_read(tmp_path):
    value = "-1.2345678901234567e-300"  # the longest a float32's repr needs, and more
    (tmp_path / "x.csv").write_text(", ".join([value] * 64) + "\n")
    write_jsonl(tmp_path / "x.jsonl", [{"input": [float(value)] * 64}])

    assert check_batch_input(tmp_path / "x.csv", "csv", [WIDE]) is None
    assert check_batch_input(tmp_path / "x.jsonl", "jsonl", [WIDE]) is None


def test_a_model_whose_rows_have_no_fixed_size_keeps_the_general_line_bound(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text(",".join(["1.5"] * 100_000) + "\n")
    assert check_batch_input(path, "csv", [InputLayout("input", FLOAT, (None,))]) is None


def test_a_wide_csv_row_in_a_job_fails_the_job_naming_its_line(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("1,2,3,4\n" + ",".join(["1.5"] * 100_000) + "\n")
    with pytest.raises(FormatError, match="line 2 is longer than"):
        list(csv_rows(path, [FEATURES]))


def test_a_wide_jsonl_row_in_a_job_is_an_error_of_its_own_line(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", [[1, 2, 3, 4], [1.5] * 100_000, [5, 6, 7, 8]])
    rows = list(jsonl_rows(tmp_path / "x.jsonl", [FEATURES]))
    assert [row.error is None for row in rows] == [True, False, True]
    assert "line 2 is longer than" in rows[1].error


@pytest.mark.parametrize("file_format", ["npy", "npz"])
def test_an_array_header_with_a_negative_dimension_is_refused(tmp_path, file_format):
    header = npy_format.header_data_from_array_1_0(np.zeros((3, 64), np.float32))
    buffer = io.BytesIO()
    npy_format.write_array_header_1_0(buffer, {**header, "shape": (-3, 64)})
    path = tmp_path / f"x.{file_format}"
    if file_format == "npy":
        path.write_bytes(buffer.getvalue())
    else:
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("input.npy", buffer.getvalue())
    with pytest.raises(FormatError, match=r"shape \[-3, 64\], with a negative dimension"):
        check_batch_input(path, file_format, [WIDE])
