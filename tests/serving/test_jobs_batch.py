"""`python -m serving.jobs batch`: every row through the model, streamed, into an output file."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import time
import zipfile

import numpy as np
import pytest
from jobs_testkit import (
    captured_events,
    child_env,
    fixed_single_row,
    job_command,
    labels_of_argmax,
    ort_outputs,
    read_jsonl,
    relu_and_negated,
    relu_any_width,
    run_job_cli,
    sum_and_product,
    write_jsonl,
    write_model,
)
from numpy.lib import format as npy_format

from registry.building.onnx_build import mlp_dropping_rows, random_mlp
from serving.jobs import batch
from serving.jobs.model import BATCH_BUDGET_BYTES, rows_per_batch
from serving.jobs.protocol import Progress, emit, run_job

BIG_ROWS, BIG_WIDTH = 100_000, 512  # 204.8 MB of float32


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("models") / "mlp.onnx", random_mlp([8, 16, 3], seed=4))


@pytest.fixture
def features():
    return np.random.default_rng(5).standard_normal((300, 8)).astype(np.float32)


def run_in_process(capsys, *args) -> tuple[int, list[dict]]:
    """The command through the same protocol the CLI uses, in this process (cheaper than a child)."""
    code = run_job(lambda: batch.run(*args))
    return code, captured_events(capsys.readouterr().out)


# ---------------------------------------------------------------- outputs equal ONNX Runtime's


def test_npy_outputs_equal_onnxruntime(tmp_path, mlp, features):
    np.save(tmp_path / "x.npy", features)
    job = run_job_cli("batch", "--model", mlp, "--input", tmp_path / "x.npy", "--format", "npy",
                      "--output", tmp_path / "out.npy", "--batch-size", 64)
    assert job.returncode == 0
    assert {key: job.result[key] for key in ("rows", "errors", "output_format", "batch_size")} == {
        "rows": 300, "errors": 0, "output_format": "npy", "batch_size": 64}
    assert job.result["output_bytes"] == (tmp_path / "out.npy").stat().st_size
    [expected] = ort_outputs(mlp, {"input": features})
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-6, atol=1e-7)


def test_npz_outputs_are_named_by_the_model_outputs_and_equal_onnxruntime(tmp_path, capsys):
    model = write_model(tmp_path / "two.onnx", sum_and_product(3))
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((50, 3)).astype(np.float32), rng.standard_normal((50, 3)).astype(np.float32)
    np.savez_compressed(tmp_path / "x.npz", a=a, b=b)
    code, events = run_in_process(capsys, model, tmp_path / "x.npz", "npz", tmp_path / "out.npz", 16)
    assert code == 0 and events[-1]["result"]["output_format"] == "npz"
    expected_sum, expected_product = ort_outputs(model, {"a": a, "b": b})
    with np.load(tmp_path / "out.npz") as out:
        assert sorted(out.files) == ["product", "sum"]
        np.testing.assert_array_equal(out["sum"], expected_sum)
        np.testing.assert_array_equal(out["product"], expected_product)


def test_an_npy_input_to_a_model_with_two_outputs_gives_an_npz(tmp_path, capsys):
    model = write_model(tmp_path / "two.onnx", relu_and_negated(2))
    rows = np.array([[1, -2], [-3, 4]], np.float32)
    np.save(tmp_path / "x.npy", rows)
    code, events = run_in_process(capsys, model, tmp_path / "x.npy", "npy", tmp_path / "out.npz", 16)
    assert code == 0 and events[-1]["result"]["output_format"] == "npz"
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["relu"], np.maximum(rows, 0))
        np.testing.assert_array_equal(out["negated"], -rows)


def test_a_single_npy_cannot_feed_a_model_with_two_inputs(tmp_path, capsys):
    model = write_model(tmp_path / "two.onnx", sum_and_product(2))
    np.save(tmp_path / "a.npy", np.ones((4, 2), np.float32))
    code, events = run_in_process(capsys, model, tmp_path / "a.npy", "npy", tmp_path / "out.npz", 16)
    assert code == 2 and "use an .npz file with one array per input" in events[-1]["reason"]


def test_jsonl_outputs_equal_onnxruntime_and_a_bad_row_is_its_own_error(tmp_path, mlp, features):
    rows = [row.tolist() for row in features[:6]]
    rows[2] = rows[2][:5]  # wrong feature count on one line only
    write_jsonl(tmp_path / "x.jsonl", rows)
    job = run_job_cli("batch", "--model", mlp, "--input", tmp_path / "x.jsonl", "--format", "jsonl",
                      "--output", tmp_path / "out.jsonl", "--batch-size", 4)
    assert job.returncode == 0 and (job.result["rows"], job.result["errors"]) == (6, 1)
    lines = read_jsonl(tmp_path / "out.jsonl")
    assert [line["row"] for line in lines] == [0, 1, 2, 3, 4, 5]
    assert lines[2] == {"row": 2, "error": "line 3: input 'input' has shape [5]; the model expects [8]"}
    good = [0, 1, 3, 4, 5]
    [expected] = ort_outputs(mlp, {"input": features[good]})
    got = np.array([lines[index]["outputs"]["probabilities"] for index in good], np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_csv_outputs_equal_onnxruntime_and_a_bad_row_is_its_own_error(tmp_path, capsys, mlp, features):
    lines = [",".join(f"f{k}" for k in range(8))] + [",".join(map(str, row.tolist())) for row in features[:5]]
    fields = lines[4].split(",")
    lines[4] = ",".join([fields[0], "oops", *fields[2:]])  # data row 3 gets a non-number
    (tmp_path / "x.csv").write_text("\n".join(lines) + "\n")
    code, events = run_in_process(capsys, mlp, tmp_path / "x.csv", "csv", tmp_path / "out.csv", 2)
    assert code == 0 and (events[-1]["result"]["rows"], events[-1]["result"]["errors"]) == (5, 1)
    with open(tmp_path / "out.csv", newline="") as fp:
        table = list(csv.reader(fp))
    assert table[0] == ["row", "probabilities_0", "probabilities_1", "probabilities_2", "error"]
    assert table[4] == ["3", "", "", "", "line 5: field 2 ('oops') is not a number"]
    good = [0, 1, 2, 4]
    [expected] = ort_outputs(mlp, {"input": features[good]})
    got = np.array([[float(cell) for cell in table[1 + index][1:4]] for index in good], np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert all(table[1 + index][4] == "" for index in good)


def test_csv_columns_of_a_dynamic_output_come_from_the_first_row_that_ran(tmp_path, capsys):
    model = write_model(tmp_path / "relu.onnx", relu_any_width())
    (tmp_path / "x.csv").write_text("a,b,c\n1,x,3\n-1,2,-3\n4,-5,6\n")
    code, _ = run_in_process(capsys, model, tmp_path / "x.csv", "csv", tmp_path / "out.csv", 8)
    assert code == 0
    assert (tmp_path / "out.csv").read_text().splitlines() == [  # text quoted, numbers bare
        '"row","output_0","output_1","output_2","error"',
        '0,"","","","line 2: field 2 (\'x\') is not a number"',
        '1,0.0,2.0,0.0,""',
        '2,4.0,0.0,6.0,""',
    ]


def test_csv_output_names_and_quoted_client_fields_are_written_as_text_a_spreadsheet_never_runs(tmp_path, capsys):
    # An output name comes from the model file and an error quotes the client's field: in
    # a spreadsheet "=HYPERLINK(...)" ran, and a bare "x;=2+5" split at ";" into a formula.
    model = write_model(tmp_path / "relu.onnx", relu_any_width(output='=HYPERLINK("http://x")'))
    (tmp_path / "x.csv").write_text("a,b,c\n1,x;=2+5,3\n-1,2,-3\n")
    code, _ = run_in_process(capsys, model, tmp_path / "x.csv", "csv", tmp_path / "out.csv", 8)
    assert code == 0
    lines = (tmp_path / "out.csv").read_text().splitlines()
    assert lines[0].startswith('"row","\'=HYPERLINK(""http://x"")_0"')
    assert lines[1] == '0,"","","","line 2: field 2 (\'x;=2+5\') is not a number"'
    assert lines[2] == '1,0.0,2.0,0.0,""'  # numbers stay bare


def test_csv_text_a_model_answers_is_written_as_text_a_spreadsheet_never_runs(tmp_path, capsys):
    model = write_model(tmp_path / "labels.onnx", labels_of_argmax(['=HYPERLINK("http://x")', "ok"]))
    (tmp_path / "x.csv").write_text("a,b\n1,0\n0,1\n")
    code, _ = run_in_process(capsys, model, tmp_path / "x.csv", "csv", tmp_path / "out.csv", 8)
    assert code == 0
    assert (tmp_path / "out.csv").read_text().splitlines()[1:] == ['0,"\'=HYPERLINK(""http://x"")",""', '1,"ok",""']


def test_a_row_the_model_fails_on_is_its_own_error_in_jsonl(tmp_path, capsys):
    model = write_model(tmp_path / "drops.onnx", mlp_dropping_rows([4, 8, 2], seed=1, feature=0, above=5.0))
    rows = [[0.0, 0.1, 0.2, 0.3], [9.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]]  # row 1 makes the model drop a row
    write_jsonl(tmp_path / "x.jsonl", rows)
    code, events = run_in_process(capsys, model, tmp_path / "x.jsonl", "jsonl", tmp_path / "out.jsonl", 8)
    assert code == 0 and events[-1]["result"]["errors"] == 1
    lines = read_jsonl(tmp_path / "out.jsonl")
    assert "outputs" in lines[0] and "outputs" in lines[2]
    assert lines[1]["error"].startswith("line 2: the model failed on this row: the model returned output")


def test_a_non_finite_output_is_written_as_null_in_jsonl(tmp_path, capsys):
    model = write_model(tmp_path / "two.onnx", relu_and_negated(2))
    (tmp_path / "x.jsonl").write_text("[1.5, NaN]\n")
    code, _ = run_in_process(capsys, model, tmp_path / "x.jsonl", "jsonl", tmp_path / "out.jsonl", 8)
    assert code == 0
    assert (tmp_path / "out.jsonl").read_text() == '{"row":0,"outputs":{"relu":[1.5,null],"negated":[-1.5,null]}}\n'


def test_a_model_that_is_not_batchable_runs_one_row_at_a_time(tmp_path, capsys):
    model = write_model(tmp_path / "fixed.onnx", fixed_single_row(3))
    rows = np.array([[1, -2, 3], [-4, 5, -6], [7, 8, -9]], np.float32)
    np.save(tmp_path / "x.npy", rows)
    code, events = run_in_process(capsys, model, tmp_path / "x.npy", "npy", tmp_path / "out.npy", 64)
    assert code == 0 and events[-1]["result"]["batch_size"] == 1
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), np.maximum(rows, 0))


def test_rows_per_batch_are_capped_by_the_byte_budget():
    row_bytes = 1024 * 1024
    assert rows_per_batch(10_000, row_bytes) == BATCH_BUDGET_BYTES // row_bytes
    assert rows_per_batch(8, row_bytes) == 8
    assert rows_per_batch(8, 10 * BATCH_BUDGET_BYTES) == 1


def test_batches_held_at_once_share_the_byte_budget():
    row_bytes = 1024 * 1024
    assert rows_per_batch(10_000, row_bytes, 2) == BATCH_BUDGET_BYTES // (2 * row_bytes)
    assert rows_per_batch(10_000, BATCH_BUDGET_BYTES, 2) == 1


# ---------------------------------------------------------------- bad files: error event, exit 2


def test_a_truncated_npy_is_an_error_event_and_exit_2(tmp_path, mlp, features):
    np.save(tmp_path / "x.npy", features)
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(data[:-100])
    job = run_job_cli("batch", "--model", mlp, "--input", tmp_path / "x.npy", "--format", "npy",
                      "--output", tmp_path / "out.npy", "--batch-size", 64)
    assert job.returncode == 2
    assert job.events == [{"event": "error", "reason": "the .npy file is truncated: its header promises 9600 bytes "
                                                        "of data, it holds 9500"}]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["x.npy"]


@pytest.mark.parametrize(("name", "write", "reason"), [
    ("garbage.npz", lambda path: path.write_bytes(b"\x00garbage" * 64), "the .npz file is not a readable zip archive"),
    ("pickled.npy", lambda path: np.save(path, np.array([object()] * 3), allow_pickle=True),
     "the .npy file holds Python objects (a pickled array); only arrays of numbers are accepted"),
    ("wide.npy", lambda path: np.save(path, np.zeros((5, 9), np.float32)),
     "the .npy file has rows of shape [9]; input 'input' expects rows of shape [8]"),
], ids=["garbage-npz", "pickled-npy", "wrong-feature-count"])
def test_a_bad_array_file_is_an_error_event_and_exit_2(tmp_path, capsys, mlp, name, write, reason):
    write(tmp_path / name)
    file_format = name.rsplit(".", 1)[1]
    code, events = run_in_process(capsys, mlp, tmp_path / name, file_format, tmp_path / f"out.{file_format}", 8)
    assert code == 2
    assert len(events) == 1 and events[0]["event"] == "error" and events[0]["reason"].startswith(reason)
    assert not (tmp_path / f"out.{file_format}").exists()


def test_the_child_refuses_a_stray_npz_member_by_its_name_unopened(tmp_path, capsys, mlp, features):
    """The job child reads with the model's inputs too (an .npz stored before the console
    counted members): a stray member that is not even .npy data is named, never opened."""
    with zipfile.ZipFile(tmp_path / "x.npz", "w") as archive:
        with archive.open("input.npy", "w") as member:
            np.save(member, features)
        archive.writestr("arr_0.npy", b"not an array")

    code, events = run_in_process(capsys, mlp, tmp_path / "x.npz", "npz", tmp_path / "out.npz", 8)

    assert code == 2
    assert events == [{"event": "error", "reason": "the .npz array 'arr_0' is not an input of the model (its inputs: 'input')"}]


def test_a_file_that_is_not_an_onnx_model_is_an_error_event(tmp_path, capsys, features):
    (tmp_path / "model.onnx").write_bytes(b"not a model")
    np.save(tmp_path / "x.npy", features)
    code, events = run_in_process(capsys, tmp_path / "model.onnx", tmp_path / "x.npy", "npy", tmp_path / "out.npy", 8)
    assert code == 2 and events[0]["reason"].startswith("not a readable ONNX model")


def test_a_csv_input_to_a_model_with_two_inputs_is_an_error_event(tmp_path, capsys):
    model = write_model(tmp_path / "two.onnx", sum_and_product(2))
    (tmp_path / "x.csv").write_text("1,2\n")
    code, events = run_in_process(capsys, model, tmp_path / "x.csv", "csv", tmp_path / "out.csv", 8)
    assert code == 2 and "a .csv file feeds models with one input" in events[0]["reason"]


# ---------------------------------------------------------------- a big file: memory, progress, cancel


@pytest.fixture(scope="module")
def big_npy(tmp_path_factory):
    """~205 MB of float32 rows, written a slice at a time (this process never holds it all)."""
    path = tmp_path_factory.mktemp("big") / "big.npy"
    rng = np.random.default_rng(7)
    with open(path, "wb") as fp:
        npy_format.write_array_header_1_0(fp, {"descr": "<f4", "fortran_order": False, "shape": (BIG_ROWS, BIG_WIDTH)})
        fp.writelines(rng.standard_normal((10_000, BIG_WIDTH), dtype=np.float32).tobytes()
                      for _ in range(BIG_ROWS // 10_000))
    return path


@pytest.fixture(scope="module")
def big_run(tmp_path_factory, big_npy):
    directory = tmp_path_factory.mktemp("big-run")
    model = write_model(directory / "small.onnx", random_mlp([BIG_WIDTH, 4], seed=8))
    return run_job_cli("batch", "--model", model, "--input", big_npy, "--format", "npy",
                       "--output", directory / "out.npy", "--batch-size", 2048)


def test_memory_is_bounded_by_a_batch_not_the_file(big_run, big_npy):
    assert big_run.returncode == 0 and big_run.result["rows"] == BIG_ROWS
    assert big_run.result["peak_rss_bytes"] < 0.6 * big_npy.stat().st_size


def test_a_huge_batch_size_is_capped_by_the_byte_budget(tmp_path, big_npy):
    model = write_model(tmp_path / "small.onnx", random_mlp([BIG_WIDTH, 4], seed=8))
    job = run_job_cli("batch", "--model", model, "--input", big_npy, "--format", "npy",
                      "--output", tmp_path / "out.npy", "--batch-size", BIG_ROWS)
    # The job holds batch.INPUT_BUFFERS batches of input at once; together they fit the budget.
    assert job.result["batch_size"] == BATCH_BUDGET_BYTES // (batch.INPUT_BUFFERS * BIG_WIDTH * 4)
    assert job.result["peak_rss_bytes"] < 0.8 * big_npy.stat().st_size


def test_progress_is_reported_during_the_run_and_at_the_end(big_run):
    progress = big_run.progress
    assert len(progress) > 1
    assert progress[0]["done"] < BIG_ROWS and progress[0]["total"] == BIG_ROWS
    assert progress[-1] == {"event": "progress", "done": BIG_ROWS, "total": BIG_ROWS}
    assert [event["done"] for event in progress] == sorted(event["done"] for event in progress)


def test_progress_events_are_at_most_five_a_second_and_the_last_is_complete(capsys):
    now_s = [0.0]
    progress = Progress(total=100, clock=lambda: now_s[0])
    for done in range(1, 11):  # ten rows, 0.125 s apart
        progress.tick(done)
        now_s[0] += 0.125
    progress.finish(10)
    events = captured_events(capsys.readouterr().out)
    assert [event["done"] for event in events] == [1, 3, 5, 7, 9, 10]
    assert events[-1] == {"event": "progress", "done": 10, "total": 10}


def test_a_non_finite_number_in_an_event_is_written_as_null(capsys):
    emit({"event": "result", "result": {"mae": float("nan"), "values": [1.0, float("inf")]}})
    assert capsys.readouterr().out == '{"event":"result","result":{"mae":null,"values":[1.0,null]}}\n'


def test_sigterm_stops_a_running_batch_within_a_second(tmp_path, big_npy):
    model = write_model(tmp_path / "heavy.onnx", random_mlp([BIG_WIDTH, 2048, 2048, 10], seed=9))
    command = job_command("batch", "--model", model, "--input", big_npy, "--format", "npy",
                          "--output", tmp_path / "out.npy", "--batch-size", 1024)
    # Started with SIGTERM ignored, which exec passes on: as under a parent that ignores it.
    child = subprocess.Popen(["sh", "-c", 'trap "" TERM; exec "$@"', "sh", *command],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env(), text=True)
    try:
        first = json.loads(child.stdout.readline())  # the first batch ran: the child is mid-file
        assert first["event"] == "progress" and first["done"] < BIG_ROWS
        signalled_s = time.monotonic()
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=5)
        assert time.monotonic() - signalled_s < 1.0
        assert child.returncode == -signal.SIGTERM
        assert not (tmp_path / "out.npy").exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_corrupt_npz_midway_is_an_error_event_and_leaves_no_output(tmp_path, capsys, mlp):
    rows = np.random.default_rng(8).standard_normal((4000, 8)).astype(np.float32)
    np.savez_compressed(tmp_path / "x.npz", input=rows)
    data = bytearray((tmp_path / "x.npz").read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)  # the deflate stream breaks well after the first batches
    (tmp_path / "x.npz").write_bytes(bytes(data))
    code, events = run_in_process(capsys, mlp, tmp_path / "x.npz", "npz", tmp_path / "out.npz", 64)
    assert code == 2
    assert events[-1]["event"] == "error" and events[-1]["reason"].startswith("the .npz array 'input' is corrupt")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["x.npz"]
