"""A report's per-version figures under the contract (serving/contract.py): the console's
canary analysis reads them, so each is parsed strictly, each refusal names its field, and
every list and object is refused by its length before it is walked."""

from __future__ import annotations

import copy

import pytest

from serving.contract import (
    CONTRACT_VERSION,
    MAX_BUCKETS,
    MAX_CLASSES,
    MAX_COUNT,
    MAX_REPORTED_OUTPUTS,
    MAX_REPORTED_VERSIONS,
    MAX_SAMPLE,
    ContractError,
    WorkerReport,
    quantile_ms,
)

STABLE = {"model": "iris", "version": 1, "requests": 5, "errors": 1, "client_errors": 1, "ok": 3, "requests_per_s": 5.0,
          "latency_sum_s": 0.01, "latency_buckets": {"0.0005": 1, "0.001": 4, "+Inf": 5}, "batch_size_buckets": {"1.0": 5, "+Inf": 5},
          "p50_ms": 1.0, "p99_ms": 1.0, "queue_depth": 0,
          "outputs": [{"name": "probabilities", "kind": "classes", "counts": [2, 1, 0], "other": 0},
                      {"name": "score", "kind": "values", "count": 3, "sum": -1.5, "non_finite": 2, "sample": [0.5, -2, 0.0]}]}
SHADOW = {"model": "iris", "version": 2, "requests": 0, "outputs": [], "shadow": {"compared": 3, "agreed": 2, "errors": 1, "dropped": 0}}


def report(*versions: dict) -> dict:
    return {"worker": {"id": "w-1"}, "versions": list(versions or (STABLE, SHADOW)), "contract": CONTRACT_VERSION}


def changed(path: str, value: object) -> dict:
    """``report()`` with the field at ``path`` (dots and [index], from ``versions``) set to
    ``value``, or removed if ``...``."""
    document = copy.deepcopy(report())
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    target = document
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    key = int(last) if isinstance(target, list) else last
    if value is ...:
        del target[key]
    else:
        target[key] = value
    return document


def refusal(document: dict) -> str:
    with pytest.raises(ContractError) as refused:
        WorkerReport.parse(document)
    return str(refused.value)


# ---- what parses ---------------------------------------------------------------------------


def test_good_figures_parse_to_the_same_values():
    assert WorkerReport.parse(report()).versions == (STABLE, {**SHADOW, "errors": 0, "client_errors": 0})


def test_absent_errors_count_zero_and_absent_optional_figures_stay_absent():
    assert WorkerReport.parse(report({"model": "iris", "version": 1, "requests": 2})).versions == (
        {"model": "iris", "version": 1, "requests": 2, "errors": 0, "client_errors": 0},)


def test_a_null_quantile_means_no_request_and_is_kept():
    parsed = WorkerReport.parse(report({**STABLE, "p50_ms": None, "p99_ms": None})).versions[0]

    assert (parsed["p50_ms"], parsed["p99_ms"]) == (None, None)


@pytest.mark.parametrize("q, expected_ms", [(0.5, 1.75), (0.99, 3.94), (1.0, 4.0)])
def test_a_quantile_is_read_inside_its_latency_bucket_as_prometheus_reads_it(q, expected_ms):
    # The bucket's upper bound alone made a p99 that moved from 4.1 to 4.2 ms read as a
    # step from 4 to 8 ms on the live table and its chart.
    assert quantile_ms({"0.001": 0, "0.002": 40, "0.004": 60, "+Inf": 60}, q) == expected_ms


def test_a_quantile_in_the_infinite_bucket_is_the_highest_finite_bound():
    assert quantile_ms({"0.001": 0, "0.002": 40, "+Inf": 60}, 0.99) == 2.0


def test_counts_that_dip_are_raised_to_their_running_maximum_as_prometheus_does():
    # An uneven sum of reports: 50 at or under 2 ms, yet 40 in all.
    assert quantile_ms({"0.001": 0, "0.002": 50, "+Inf": 40}, 1.0) == 2.0


def test_a_quantile_of_no_requests_is_none():
    assert quantile_ms({"0.001": 0, "+Inf": 0}, 0.99) is None


def test_keys_the_contract_does_not_name_are_left_out_of_the_parsed_figures():
    parsed = WorkerReport.parse(report({**STABLE, "p999_ms": 3.0, "note": {"deep": [1, 2]}})).versions[0]

    assert parsed == STABLE


def test_figures_at_every_limit_parse():
    classes = {"name": "c", "kind": "classes", "counts": [1] * MAX_CLASSES, "other": 0}
    values = {"name": "v", "kind": "values", "count": MAX_SAMPLE, "sum": 0.0, "sample": [0.0] * MAX_SAMPLE}
    outputs = [classes, values] + [{**values, "name": f"v{index}"} for index in range(MAX_REPORTED_OUTPUTS - 2)]
    buckets = {f"{index}.5": index for index in range(MAX_BUCKETS - 1)} | {"+Inf": MAX_COUNT}
    versions = [{"model": "m", "version": number, "requests": MAX_COUNT, "latency_buckets": buckets, "outputs": outputs}
                for number in range(1, MAX_REPORTED_VERSIONS + 1)]

    assert len(WorkerReport.parse(report(*versions)).versions) == MAX_REPORTED_VERSIONS


# ---- each bad field is refused with its path -------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("versions", {"iris": STABLE}, "versions: must be a list"),
        ("versions[0]", 7, "versions[0]: must be an object"),
        ("versions[0].model", ..., "versions[0].model: missing"),
        ("versions[0].model", "", "versions[0].model: must not be empty"),
        ("versions[0].model", "m" * 201, "versions[0].model: must be at most 200 characters"),
        ("versions[0].version", 0, "versions[0].version: must be an integer >= 1"),
        ("versions[0].version", "1", "versions[0].version: must be an integer"),
        ("versions[0].requests", ..., "versions[0].requests: missing"),
        ("versions[0].requests", -1, "versions[0].requests: must be an integer >= 0"),
        ("versions[0].requests", 5.0, "versions[0].requests: must be an integer"),
        ("versions[0].requests", True, "versions[0].requests: must be an integer"),
        ("versions[0].requests", MAX_COUNT + 1, f"versions[0].requests: must be at most {MAX_COUNT}"),
        # Unbounded, 10**20 was kept on SQLite as 7766279631452241920, and a drill counted that.
        ("requests_failed_total", MAX_COUNT + 1, f"requests_failed_total: must be at most {MAX_COUNT}"),
        ("device_memory_bytes", MAX_COUNT + 1, f"device_memory_bytes: must be at most {MAX_COUNT}"),
        ("versions[0].errors", -1, "versions[0].errors: must be an integer >= 0"),
        ("versions[0].errors", 5, "versions[0].errors: errors and client_errors must not exceed requests"),
        ("versions[0].client_errors", 5, "versions[0].errors: errors and client_errors must not exceed requests"),
        ("versions[0].ok", 4, "versions[0].ok: ok, errors and client_errors must not exceed requests"),
        ("versions[0].requests_per_s", -1.0, "versions[0].requests_per_s: must be a finite number >= 0"),
        ("versions[0].latency_sum_s", -0.5, "versions[0].latency_sum_s: must be a finite number >= 0"),
        ("versions[0].latency_sum_s", "0.1", "versions[0].latency_sum_s: must be a finite number"),
        ("versions[0].latency_sum_s", 10**400, "versions[0].latency_sum_s: must be a finite number"),
        ("versions[0].p99_ms", float("inf"), "versions[0].p99_ms: must be a finite number"),
        ("versions[0].queue_depth", -3, "versions[0].queue_depth: must be an integer >= 0"),
        ("versions[0].latency_buckets", [1, 2], "versions[0].latency_buckets: must be an object"),
        ("versions[0].latency_buckets", {"fast": 1}, "versions[0].latency_buckets['fast']: a bound must be a finite decimal number or \"+Inf\""),
        ("versions[0].latency_buckets", {"inf": 1}, "versions[0].latency_buckets['inf']: a bound must be a finite decimal number or \"+Inf\""),
        ("versions[0].latency_buckets", {"1e999": 1}, "versions[0].latency_buckets['1e999']: a bound must be a finite decimal number or \"+Inf\""),
        ("versions[0].latency_buckets", {" 1": 1}, "versions[0].latency_buckets[' 1']: a bound must be a finite decimal number or \"+Inf\""),
        ("versions[0].latency_buckets", {"9e307": 1}, "versions[0].latency_buckets['9e307']: a bound must be within ±1000000"),
        ("versions[0].batch_size_buckets", {"-1000001": 1}, "versions[0].batch_size_buckets['-1000001']: a bound must be within ±1000000"),
        ("versions[0].latency_buckets.+Inf", -1, "versions[0].latency_buckets['+Inf']: must be an integer >= 0"),
        ("versions[0].batch_size_buckets.+Inf", 5.5, "versions[0].batch_size_buckets['+Inf']: must be an integer"),
        ("versions[0].outputs", {"name": "x"}, "versions[0].outputs: must be a list"),
        ("versions[0].outputs[0]", "probabilities", "versions[0].outputs[0]: must be an object"),
        ("versions[0].outputs[0].name", ..., "versions[0].outputs[0].name: missing"),
        ("versions[0].outputs[0].name", "o" * 201, "versions[0].outputs[0].name: must be at most 200 characters"),
        ("versions[0].outputs[0].kind", "mean", "versions[0].outputs[0].kind: must be \"classes\" or \"values\""),
        ("versions[0].outputs[0].counts", ..., "versions[0].outputs[0].counts: missing"),
        ("versions[0].outputs[0].counts", {"0": 2}, "versions[0].outputs[0].counts: must be a list"),
        ("versions[0].outputs[0].counts[1]", -1, "versions[0].outputs[0].counts[1]: must be an integer >= 0"),
        ("versions[0].outputs[0].counts[2]", 0.5, "versions[0].outputs[0].counts[2]: must be an integer"),
        ("versions[0].outputs[0].other", -2, "versions[0].outputs[0].other: must be an integer >= 0"),
        ("versions[0].outputs[1].count", -1, "versions[0].outputs[1].count: must be an integer >= 0"),
        ("versions[0].outputs[1].sum", ..., "versions[0].outputs[1].sum: missing"),
        ("versions[0].outputs[1].sum", float("nan"), "versions[0].outputs[1].sum: must be a finite number"),
        ("versions[0].outputs[1].non_finite", -1, "versions[0].outputs[1].non_finite: must be an integer >= 0"),
        ("versions[0].outputs[1].sample", 0.5, "versions[0].outputs[1].sample: must be a list"),
        ("versions[0].outputs[1].sample[2]", "0", "versions[0].outputs[1].sample[2]: must be a finite number"),
        ("versions[0].outputs[1].sample[0]", float("-inf"), "versions[0].outputs[1].sample[0]: must be a finite number"),
        ("versions[0].outputs[1].sample", [0.0] * 4, "versions[0].outputs[1].sample: holds 4 values, more than the 3 counted"),
        ("versions[0].outputs[1].name", "probabilities", "versions[0].outputs[1].name: output 'probabilities' is summarised twice"),
        ("versions[1].shadow", [3, 2], "versions[1].shadow: must be an object"),
        ("versions[1].shadow.dropped", ..., "versions[1].shadow.dropped: missing"),
        ("versions[1].shadow.errors", -1, "versions[1].shadow.errors: must be an integer >= 0"),
        ("versions[1].shadow.agreed", 4, "versions[1].shadow.agreed: must not exceed compared"),
        ("versions[1].version", 1, "versions[1]: model 'iris' version 1 is reported twice"),
    ],
)
def test_a_bad_figure_is_refused_naming_its_path(path, value, message):
    assert refusal(changed(path, value)) == message


# ---- oversized lists and objects are refused by their length, unread -------------------------

UNREADABLE = object()  # what no reader takes: an item read before the length is checked names itself


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("versions", [UNREADABLE] * (MAX_REPORTED_VERSIONS + 1), f"versions: must have at most {MAX_REPORTED_VERSIONS} items"),
        ("versions[0].outputs", [UNREADABLE] * (MAX_REPORTED_OUTPUTS + 1),
         f"versions[0].outputs: must have at most {MAX_REPORTED_OUTPUTS} items"),
        ("versions[0].outputs[0].counts", [UNREADABLE] * (MAX_CLASSES + 1), f"versions[0].outputs[0].counts: must have at most {MAX_CLASSES} items"),
        ("versions[0].outputs[1].sample", [UNREADABLE] * (MAX_SAMPLE + 1), f"versions[0].outputs[1].sample: must have at most {MAX_SAMPLE} items"),
        ("versions[0].latency_buckets", {f"bad{index}": UNREADABLE for index in range(MAX_BUCKETS + 1)},
         f"versions[0].latency_buckets: must have at most {MAX_BUCKETS} entries"),
        ("versions[0].batch_size_buckets", {f"bad{index}": UNREADABLE for index in range(MAX_BUCKETS + 1)},
         f"versions[0].batch_size_buckets: must have at most {MAX_BUCKETS} entries"),
    ],
)
def test_a_list_or_object_past_its_limit_is_refused_before_any_item_is_read(path, value, message):
    assert refusal(changed(path, value)) == message


def test_a_report_without_a_state_is_one_of_a_serving_worker():
    """Workers from before the field say nothing: they serve, and the console takes them so."""
    assert WorkerReport.parse(report()).state == "serving"


@pytest.mark.parametrize("state", ["draining", "stopped"])
def test_a_report_names_the_workers_stop_state(state):
    assert WorkerReport.parse({**report(), "state": state}).state == state


@pytest.mark.parametrize("state", ["gone", "", 1, ["stopped"]])
def test_a_report_with_an_unknown_state_is_refused_naming_the_field(state):
    with pytest.raises(ContractError, match="^state: must be one of serving, draining, stopped$"):
        WorkerReport.parse({**report(), "state": state})
