"""An .npz file's members are counted and named from its zip directory before any is
opened: the readers of the console (upload checks) and of the job child
(`python -m serving.jobs`) do work bounded by what the model takes, not by the upload.

The junk members here are not .npy data at all, so a reader that opened one would refuse
the file as unreadable: a refusal that names the count or a name proves none was opened."""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest

from serving.jobs.formats import (
    LABELS_MEMBER,
    MAX_NPZ_MEMBERS,
    ArrayFile,
    FormatError,
    InputLayout,
    InputMismatch,
    check_batch_input,
    check_dataset,
)

FLOAT = np.dtype(np.float32)
LAYOUTS = (InputLayout("input", FLOAT, (4,)), InputLayout("mask", np.dtype(np.int64), (2,)))


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def write_npz(path, arrays: dict[str, np.ndarray], junk: int = 0):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            archive.writestr(f"{name}.npy", npy_bytes(array))
        for index in range(junk):
            archive.writestr(f"arr_{index}.npy", b"not an array")
    return path


def inputs(rows: int = 3) -> dict[str, np.ndarray]:
    return {"input": np.ones((rows, 4), np.float32), "mask": np.ones((rows, 2), np.int64)}


def test_an_npz_of_exactly_the_models_inputs_opens_and_fits(tmp_path):
    path = write_npz(tmp_path / "x.npz", inputs())

    with ArrayFile(path, "npz", inputs=LAYOUTS) as arrays:
        assert sorted(arrays.streams) == ["input", "mask"] and arrays.rows == 3
        assert arrays.match_inputs(LAYOUTS) == ["input", "mask"]
    assert check_batch_input(path, "npz", LAYOUTS) == 3


def test_an_npz_data_set_of_exactly_the_models_inputs_and_labels_opens_and_fits(tmp_path):
    path = write_npz(tmp_path / "d.npz", {**inputs(5), LABELS_MEMBER: np.arange(5)})

    with ArrayFile(path, "npz", label_member=LABELS_MEMBER, inputs=LAYOUTS) as arrays:
        assert sorted(arrays.streams) == ["input", "labels", "mask"]
    assert check_dataset(path, "npz", LAYOUTS) == 5


def test_one_member_more_than_the_model_takes_is_refused_by_its_name_unopened(tmp_path):
    path = write_npz(tmp_path / "x.npz", inputs(), junk=1)

    with pytest.raises(InputMismatch) as refused:
        ArrayFile(path, "npz", inputs=LAYOUTS)
    assert refused.value.reason == "the .npz array 'arr_0' is not an input of the model (its inputs: 'input', 'mask')"


@pytest.mark.parametrize(("label_member", "arrays", "allowed"), [
    (None, inputs(), "at most 2 (one array per input of the model)"),
    (LABELS_MEMBER, {**inputs(), LABELS_MEMBER: np.arange(3)}, "at most 3 (one array per input of the model and 'labels')"),
])
def test_thousands_of_members_are_refused_by_their_count_unopened(tmp_path, label_member, arrays, allowed):
    path = write_npz(tmp_path / "x.npz", arrays, junk=5000)

    with pytest.raises(InputMismatch) as refused:
        ArrayFile(path, "npz", label_member=label_member, inputs=LAYOUTS)
    assert refused.value.reason == f"the .npz file holds {len(arrays) + 5000} members; it can hold {allowed}"


def test_a_zip_directory_larger_than_its_end_record_admits_is_refused_by_its_size_unparsed(tmp_path):
    path = write_npz(tmp_path / "x.npz", inputs(), junk=5000)
    data = bytearray(path.read_bytes())
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, end + 8, 2, 2)  # the end record says 2 entries; the directory lists 5002
    path.write_bytes(bytes(data))

    with pytest.raises(InputMismatch) as refused:
        ArrayFile(path, "npz", inputs=LAYOUTS)
    assert refused.value.reason.startswith("the .npz file's zip directory takes ")
    assert refused.value.reason.endswith("the file can hold at most 2 (one array per input of the model)")


def test_without_the_models_inputs_the_reader_of_the_job_child_opens_at_most_its_cap(tmp_path):
    # As serving.jobs.batch and serving.jobs.evaluate open a file: no inputs given.
    fits = write_npz(tmp_path / "fits.npz", {f"a{index}": np.zeros(1, np.float32) for index in range(MAX_NPZ_MEMBERS)})
    with ArrayFile(fits, "npz") as arrays:
        assert len(arrays.streams) == MAX_NPZ_MEMBERS
    junk = write_npz(tmp_path / "junk.npz", inputs(), junk=MAX_NPZ_MEMBERS)

    with pytest.raises(FormatError) as refused:
        ArrayFile(junk, "npz")
    assert refused.value.reason == f"the .npz file holds {MAX_NPZ_MEMBERS + 2} members; it can hold at most {MAX_NPZ_MEMBERS} arrays"
