"""What a loaded version answered, summarised per report interval (serving/output_summary.py):
top-class counts of class scores, label counts, count/sum/sample of other values; only
the rows of requests the traffic split sent (serving/batch_run.py)."""

from __future__ import annotations

import sys
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from serving_testkit import make_config

from registry.building.onnx_build import random_mlp, to_bytes
from serving.batch_policy import PendingRequest
from serving.batch_run import run_batch
from serving.engine import Engine, TensorSpec
from serving.output_summary import SAMPLE_SIZE, OutputSummary, ValueTally


def scores_label_total() -> onnx.ModelProto:
    """input [batch, 4] -> scores (the input), label (its argmax, int64 [batch]),
    total (its row sums, [batch, 1]) and positive (bool [batch, 4], not summarised)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["scores"]),
         helper.make_node("ArgMax", ["input"], ["label"], axis=1, keepdims=0),
         helper.make_node("ReduceSum", ["input", "axes"], ["total"], keepdims=1),
         helper.make_node("Greater", ["input", "zero"], ["positive"])],
        "scores_label_total",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("positive", TensorProto.BOOL, ["batch", 4])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1]), helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def spec(name: str, datatype: str, *shape) -> TensorSpec:
    return TensorSpec(name, datatype, shape)


def summarised_run(engine: Engine, summary: OutputSummary):
    """The engine's run as a batcher makes it: one request a call, summarised."""

    def run(feeds):
        (outputs,), _ = run_batch(engine.run, [PendingRequest(feeds, feeds[0].shape[0], 0.0, 1.0, None)], True, summary.add)
        return outputs

    return run


def batches(seed: int, count: int, width: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(1, 33)), width)).astype(np.float32) for _ in range(count)]


# ---- classes ------------------------------------------------------------------------------


def test_a_classifiers_batches_count_each_rows_top_class_exactly(tmp_path):
    engine = Engine(to_bytes(random_mlp([64, 32, 10], seed=3)), make_config(tmp_path), "cpu")
    summary = OutputSummary(engine.outputs)
    run = summarised_run(engine, summary)

    answered = [run((batch,))[0] for batch in batches(1, 20, 64)]

    expected = np.bincount(np.concatenate(answered).argmax(axis=1), minlength=10).tolist()
    assert summary.take() == [{"name": "probabilities", "kind": "classes", "counts": expected, "other": 0}]


def test_each_output_is_summarised_by_its_declared_kind_in_the_signatures_order_and_bool_outputs_are_not(tmp_path):
    engine = Engine(to_bytes(scores_label_total()), make_config(tmp_path), "cpu")
    summary = OutputSummary(engine.outputs)
    run = summarised_run(engine, summary)
    inputs = np.array([[0, 3, 1, 2], [5, 1, 1, 1], [0, 0, 0, 9]], np.float32)

    run((inputs,))

    (scores, label, total) = summary.take()
    assert scores == {"name": "scores", "kind": "classes", "counts": [1, 1, 0, 1], "other": 0}
    assert label == {"name": "label", "kind": "classes", "counts": [1, 1, 0, 1], "other": 0}
    assert {key: total[key] for key in ("name", "kind", "count", "sum", "non_finite")} == {
        "name": "total", "kind": "values", "count": 3, "sum": 23.0, "non_finite": 0}
    assert sorted(total["sample"]) == [6.0, 8.0, 9.0]


@pytest.mark.parametrize("shape", [(None,), (None, 1)], ids=["rows", "rows-by-one"])
@pytest.mark.parametrize("datatype", ["INT64", "INT32", "INT8", "UINT8"])
def test_integer_labels_are_counted_and_labels_outside_0_to_255_are_other(shape, datatype):
    summary = OutputSummary([spec("label", datatype, *shape)])
    labels = np.array([3, 0, 3, 250, 255, -1, 300, 3], np.int64)
    dtype = summary_dtype(datatype)
    kept = labels[(labels >= np.iinfo(dtype).min) & (labels <= np.iinfo(dtype).max)].astype(dtype)

    summary.add([kept.reshape(-1, *shape[1:])])

    expected = np.bincount(kept[(kept >= 0) & (kept < 256)].astype(np.int64)).tolist()
    assert summary.take() == [{"name": "label", "kind": "classes", "counts": expected, "other": int(((kept < 0) | (kept >= 256)).sum())}]


def summary_dtype(datatype: str) -> np.dtype:
    return spec("x", datatype, None).dtype


def test_label_counts_end_at_the_highest_label_seen():
    summary = OutputSummary([spec("label", "INT64", None)])

    summary.add([np.array([1, 1, 4], np.int64)])

    assert summary.take()[0]["counts"] == [0, 2, 0, 0, 1]


def test_a_class_score_output_needs_a_declared_width_of_2_to_256_else_its_values_are_summarised():
    declared = [spec("two", "FP32", None, 2), spec("wide", "FP32", None, 300), spec("free", "FP32", None, None),
                spec("one", "FP32", None, 1), spec("flat", "FP32", None), spec("pairs", "INT64", None, 2)]

    summary = OutputSummary(declared)
    summary.add([np.zeros((1, 2), np.float32), np.zeros((1, 300), np.float32), np.zeros((1, 5), np.float32),
                 np.zeros((1, 1), np.float32), np.zeros(1, np.float32), np.zeros((1, 2), np.int64)])

    assert [(output["name"], output["kind"]) for output in summary.take()] == [
        ("two", "classes"), ("wide", "values"), ("free", "values"), ("one", "values"), ("flat", "values"), ("pairs", "values")]


def test_string_and_bool_outputs_are_not_summarised():
    summary = OutputSummary([spec("words", "BYTES", None), spec("flags", "BOOL", None, 3), spec("score", "FP32", None)])

    summary.add([np.array(["a"], object), np.zeros((1, 3), bool), np.array([0.5], np.float32)])

    assert [output["name"] for output in summary.take()] == ["score"]


# ---- values -------------------------------------------------------------------------------


def test_values_count_and_sum_the_finite_elements_and_count_the_others():
    summary = OutputSummary([spec("embedding", "FP32", None, None)])
    first = np.array([[1.5, np.nan, 2.0], [np.inf, -4.0, 0.25]], np.float32)
    second = np.array([[-np.inf, 8.0, 1.0]], np.float32)

    summary.add([first])
    summary.add([second])

    (figures,) = summary.take()
    assert {key: figures[key] for key in ("count", "sum", "non_finite")} == {"count": 6, "sum": 8.75, "non_finite": 3}
    assert sorted(figures["sample"]) == [-4.0, 0.25, 1.0, 1.5, 2.0, 8.0]


def test_the_sample_holds_at_most_64_distinct_values_drawn_from_the_outputs():
    summary = OutputSummary([spec("value", "FP64", None, None)])
    fed = np.arange(5000, dtype=np.float64).reshape(-1, 10)

    for start in range(0, len(fed), 25):
        summary.add([fed[start:start + 25]])

    sample = summary.take()[0]["sample"]
    assert len(sample) == len(set(sample)) == SAMPLE_SIZE
    assert set(sample) <= set(fed.ravel().tolist())


def test_the_sample_is_uniform_over_the_whole_interval_and_within_each_batch():
    """Ten batches of ten values, value = 10 * batch + position: a sample biased to early or
    late batches, or to the head of each batch, moves the mean batch or position away from
    4.5 (each bound is over 10 standard deviations of its mean over 200 intervals)."""
    summary = OutputSummary([spec("value", "FP32", None)])
    batch_means, position_means = [], []
    for _ in range(200):
        for start in range(0, 100, 10):
            summary.add([np.arange(start, start + 10, dtype=np.float32)])
        sample = np.array(summary.take()[0]["sample"])
        batch_means.append(np.mean(sample // 10))
        position_means.append(np.mean(sample % 10))

    assert abs(np.mean(batch_means) - 4.5) < 0.3
    assert abs(np.mean(position_means) - 4.5) < 0.3


def test_intervals_of_more_elements_than_numpys_hypergeometric_takes_still_merge_their_samples():
    tally, rng = ValueTally("value"), np.random.default_rng(1)
    first, second = np.zeros(SAMPLE_SIZE), np.ones(SAMPLE_SIZE)

    tally.merge((2 * 10**9, 0.0, 0, first), rng)
    tally.merge((3 * 10**9, 3e9, 0, second), rng)

    assert (tally.count, tally.sum, len(tally.sample)) == (5 * 10**9, 3e9, SAMPLE_SIZE)
    assert 0 < tally.sample.sum() < SAMPLE_SIZE  # some of each side


def test_a_sum_past_a_floats_range_saturates_so_the_report_stays_finite():
    summary = OutputSummary([spec("value", "FP64", None)])

    summary.add([np.array([1e308, 1e308], np.float64)])

    assert summary.take()[0]["sum"] == sys.float_info.max


def test_integer_values_are_summed_exactly():
    summary = OutputSummary([spec("ids", "INT64", None, 2)])

    summary.add([np.array([[7, -2], [1, 10**6]], np.int64)])

    (figures,) = summary.take()
    assert {key: figures[key] for key in ("count", "sum", "non_finite")} == {"count": 4, "sum": 1_000_006.0, "non_finite": 0}


# ---- the interval -------------------------------------------------------------------------


def test_take_returns_what_came_since_the_previous_take():
    summary = OutputSummary([spec("label", "INT64", None)])
    summary.add([np.array([0, 0], np.int64)])
    summary.take()

    summary.add([np.array([1], np.int64)])

    assert summary.take() == [{"name": "label", "kind": "classes", "counts": [0, 1], "other": 0}]
    assert summary.take() == []  # no batch since


def test_a_batch_whose_outputs_do_not_have_one_row_per_input_row_is_not_counted():
    """It is not answered as run: it is split and run again, and the halves are counted."""
    summary = OutputSummary([spec("label", "INT64", None)])

    summary.add([np.array([1, 2], np.int64)], rows=3)

    assert summary.take() == []


def test_only_the_rows_of_requests_to_be_summarised_are_counted_in_a_mixed_batch():
    """A request that named its version (pinned) is answered from the same run as the
    routed ones, and its rows stay out of the summary the canary analysis reads."""
    summary = OutputSummary([spec("label", "INT64", None)])
    labels = [np.array([0, 0], np.int64), np.array([7, 7, 7], np.int64), np.array([1], np.int64)]
    requests = [PendingRequest((label,), len(label), 0.0, 1.0, None, summarised=summarised)
                for label, summarised in zip(labels, (True, False, True))]

    results, _ = run_batch(lambda feeds: [feeds[0]], requests, True, summary.add)

    assert [result[0].tolist() for result in results] == [[0, 0], [7, 7, 7], [1]]  # every request answered
    assert summary.take() == [{"name": "label", "kind": "classes", "counts": [2, 1], "other": 0}]


@pytest.mark.parametrize("is_batchable", [True, False], ids=["batched", "run-alone"])
def test_a_batch_of_requests_none_of_which_is_to_be_summarised_is_not_counted(is_batchable):
    summary = OutputSummary([spec("label", "INT64", None)])
    requests = [PendingRequest((np.array([3], np.int64),), 1, 0.0, 1.0, None, summarised=False) for _ in range(2)]

    results, _ = run_batch(lambda feeds: [feeds[0]], requests, is_batchable, summary.add)

    assert [result[0].tolist() for result in results] == [[3], [3]]
    assert summary.take() == []


def test_a_run_alone_request_to_be_summarised_is_counted_whole():
    """A version not proven batchable: its outputs are not sliced per row."""
    summary = OutputSummary([spec("total", "FP32")])

    run_batch(lambda feeds: [np.float32(feeds[0].sum())], [PendingRequest((np.ones((2, 3), np.float32),), 2, 0.0, 1.0, None)],
              False, summary.add)

    (total,) = summary.take()
    assert (total["count"], total["sum"]) == (1, 6.0)


@pytest.fixture
def frequent_thread_switches():
    """Threads switch every microsecond, so an unguarded update would lose counts."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_outputs_the_summary_cannot_read_are_skipped_and_never_fail_the_batch():
    """ONNX Runtime answers a sequence or map output (scikit-learn's ZipMap) as a list."""
    summary = OutputSummary([spec("label", "INT64", None), spec("probabilities", "seq(map(int64,tensor(float)))")])

    summary.add([np.array([1], np.int64), [{0: 0.1, 1: 0.9}]], rows=1)

    assert summary.take() == []


def test_feeding_from_many_threads_at_once_loses_no_counts(frequent_thread_switches):
    summary = OutputSummary([spec("scores", "FP32", None, 4), spec("value", "FP32", None)])
    scores = np.eye(4, dtype=np.float32)[[0, 1, 1, 2, 3, 3, 3, 3]]
    values = np.ones(8, np.float32)
    start = threading.Barrier(8)

    def feed():
        start.wait()
        for _ in range(500):
            summary.add([scores, values])

    threads = [threading.Thread(target=feed) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    classes, counted = summary.take()
    assert classes["counts"] == [4000, 8000, 4000, 16000]
    assert (counted["count"], counted["sum"], len(counted["sample"])) == (32000, 32000.0, SAMPLE_SIZE)


# ---- edges found by mutation testing (tools/mutation.py) ------------------------------------


def test_sums_that_overflow_one_way_then_the_other_read_as_0():
    """+inf meeting -inf over an interval is NaN; the contract takes finite numbers only."""
    summary = OutputSummary([spec("value", "FP64", None)])

    summary.add([np.array([1e308, 1e308], np.float64)])
    summary.add([np.array([-1e308, -1e308], np.float64)])

    assert summary.take()[0]["sum"] == 0.0


def test_a_sum_that_overflows_saturates_even_where_numpy_is_set_to_raise_on_overflow():
    summary = OutputSummary([spec("value", "FP64", None)])

    with np.errstate(over="raise"):
        summary.add([np.array([1e308, 1e308], np.float64)])

    assert summary.take()[0]["sum"] == sys.float_info.max


def test_float32_values_are_summed_in_float64_so_a_sum_past_float32s_range_is_kept():
    summary = OutputSummary([spec("value", "FP32", None)])

    summary.add([np.array([3e38, 3e38], np.float32)])

    assert summary.take()[0]["sum"] == pytest.approx(6e38, rel=1e-6)


def test_a_float_output_declared_256_wide_is_class_scores_and_257_wide_is_values():
    summary = OutputSummary([spec("widest", "FP32", None, 256), spec("wider", "FP32", None, 257)])

    summary.add([np.eye(256, dtype=np.float32)[:2], np.zeros((2, 257), np.float32)])

    widest, wider = summary.take()
    assert (widest["kind"], widest["counts"][:2], sum(widest["counts"])) == ("classes", [1, 1], 2)
    assert wider["kind"] == "values"


def test_class_and_label_counts_are_integers_as_the_report_contract_takes_them():
    summary = OutputSummary([spec("scores", "FP32", None, 3), spec("label", "INT64", None)])

    summary.add([np.eye(3, dtype=np.float32), np.array([0, 2, -1], np.int64)])

    scores, label = summary.take()
    assert [type(count) for count in scores["counts"] + label["counts"] + [label["other"]]] == [int] * 7


def test_labels_all_outside_0_to_255_report_no_counts_and_all_of_them_as_other():
    summary = OutputSummary([spec("label", "INT64", None)])

    summary.add([np.array([-1, 300, -7], np.int64)])

    assert summary.take() == [{"name": "label", "kind": "classes", "counts": [], "other": 3}]


def test_a_label_of_256_is_other_and_255_is_the_last_class():
    summary = OutputSummary([spec("label", "INT64", None)])

    summary.add([np.array([255, 256], np.int64)])

    (label,) = summary.take()
    assert (len(label["counts"]), label["counts"][255], sum(label["counts"]), label["other"]) == (256, 1, 1, 1)


def test_labels_outside_0_to_255_add_up_over_the_batches_of_an_interval():
    summary = OutputSummary([spec("label", "INT64", None)])

    summary.add([np.array([1, -1], np.int64)])
    summary.add([np.array([400], np.int64)])

    assert summary.take() == [{"name": "label", "kind": "classes", "counts": [0, 1], "other": 2}]


def test_a_label_output_not_of_its_declared_shape_is_not_counted():
    """Declared [rows, 1]; a model that answers [rows, 2] there is not read as labels."""
    summary = OutputSummary([spec("label", "INT64", None, 1)])

    summary.add([np.array([[1, 2], [3, 4]], np.int64)])

    assert summary.take() == [{"name": "label", "kind": "classes", "counts": [], "other": 0}]


def test_class_scores_not_of_their_declared_width_are_not_counted():
    summary = OutputSummary([spec("scores", "FP32", None, 4)])

    summary.add([np.eye(3, dtype=np.float32)])

    assert summary.take() == [{"name": "scores", "kind": "classes", "counts": [0, 0, 0, 0], "other": 0}]


def test_a_summary_that_fails_logs_it_once_per_version_with_its_traceback(caplog):
    summary = OutputSummary([spec("label", "INT64", None), spec("probabilities", "seq(map(int64,tensor(float)))")])

    with caplog.at_level("ERROR", logger="serving.output_summary"):
        for _ in range(3):
            summary.add([np.array([1], np.int64), [{0: 0.1, 1: 0.9}]], rows=1)

    assert [(record.getMessage(), record.exc_info is not None) for record in caplog.records] == [
        ("summarising a batch's outputs failed (logged once per version)", True)]


def test_a_keep_mask_not_of_the_batchs_rows_is_not_counted():
    """Only a [rows] boolean mask says which rows to keep; a mask of the elements is not one."""
    summary = OutputSummary([spec("embedding", "FP32", None, None)])

    summary.add([np.ones((2, 2), np.float32)], rows=2, keep=np.array([[True, False], [True, True]]))

    assert summary.take() == []


def test_a_values_output_with_no_finite_element_reports_an_empty_sample():
    summary = OutputSummary([spec("value", "FP32", None)])

    summary.add([np.array([np.nan, np.inf], np.float32)])

    assert summary.take() == [{"name": "value", "kind": "values", "count": 0, "sum": 0.0, "non_finite": 2, "sample": []}]


def test_a_values_output_keeps_its_name_in_the_next_interval():
    summary = OutputSummary([spec("value", "FP32", None)])
    summary.add([np.array([1.0], np.float32)])
    summary.take()

    summary.add([np.array([2.0], np.float32)])

    assert summary.take()[0]["name"] == "value"


def test_batches_of_one_value_each_are_all_in_the_sample():
    summary = OutputSummary([spec("value", "FP32", None)])

    for value in (1.0, 2.0, 3.0):
        summary.add([np.array([value], np.float32)])

    assert sorted(summary.take()[0]["sample"]) == [1.0, 2.0, 3.0]


def test_one_batch_of_more_values_than_the_sample_holds_offers_that_many_distinct_ones():
    summary = OutputSummary([spec("value", "FP32", None)])
    fed = np.arange(100, dtype=np.float32)

    summary.add([fed])

    sample = summary.take()[0]["sample"]
    assert len(sample) == len(set(sample)) == SAMPLE_SIZE
    assert set(sample) <= set(fed.tolist())


@pytest.mark.parametrize("interval_first", [True, False], ids=["interval-at-the-limit", "batch-at-the-limit"])
def test_a_side_of_exactly_numpys_hypergeometric_limit_still_merges(interval_first):
    tally, rng = ValueTally("value"), np.random.default_rng(2)
    at_limit, small = (10**9, 0.0, 0, np.zeros(SAMPLE_SIZE)), (5, 5.0, 0, np.ones(5))

    for part in (at_limit, small) if interval_first else (small, at_limit):
        tally.merge(part, rng)

    assert (tally.count, tally.sum, len(tally.sample)) == (10**9 + 5, 5.0, SAMPLE_SIZE)
