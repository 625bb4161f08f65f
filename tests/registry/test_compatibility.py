"""Signature compatibility: which candidate inputs refuse requests the stable version takes."""

from __future__ import annotations

from registry.domain.compatibility import (
    compatibility_report,
    input_differences,
    output_notes,
)


def tensor(name: str, shape: list, datatype: str = "FP32") -> dict:
    return {"name": name, "datatype": datatype, "shape": shape}


def signature(inputs: list[dict], outputs: list[dict] | None = None, *, batchable: bool = True) -> dict:
    outputs = [tensor("probabilities", ["batch", 10])] if outputs is None else outputs
    return {"inputs": inputs, "outputs": outputs, "opset": 17, "producer": "tests", "batchable": batchable}


STABLE = signature([tensor("input", ["batch", 64])])


def test_the_same_signature_has_no_differences():
    assert input_differences(STABLE, signature([tensor("input", ["batch", 64])])) == []


def test_a_renamed_input_is_missing_under_its_old_name_and_new_under_its_new_one():
    differences = input_differences(STABLE, signature([tensor("pixels", ["batch", 64])]), stable_version=3)

    assert differences == ["input 'input' of v3 is missing here", "input 'pixels' is new here (v3 has no such input)"]


def test_an_added_input_is_a_difference():
    candidate = signature([tensor("input", ["batch", 64]), tensor("mask", ["batch", 64], "BOOL")])

    assert input_differences(STABLE, candidate, stable_version=3) == ["input 'mask' is new here (v3 has no such input)"]


def test_a_changed_datatype_names_both():
    candidate = signature([tensor("input", ["batch", 64], "INT64")])

    assert input_differences(STABLE, candidate, stable_version=3) == ["input 'input': FP32 on v3, INT64 here"]


def test_a_changed_feature_dimension_names_the_axis_and_both_sizes():
    candidate = signature([tensor("input", ["batch", 60])])

    assert input_differences(STABLE, candidate, stable_version=3) == ["input 'input' dimension 1: 64 on v3, 60 here"]


def test_a_changed_rank_is_one_difference():
    candidate = signature([tensor("input", ["batch", 8, 8])])

    assert input_differences(STABLE, candidate, stable_version=3) == ["input 'input': rank 2 on v3, rank 3 here"]


def test_without_a_version_number_the_sentences_say_stable():
    candidate = signature([tensor("input", ["batch", 60])])

    assert input_differences(STABLE, candidate) == ["input 'input' dimension 1: 64 on stable, 60 here"]


def test_differently_named_batch_axes_agree():
    candidate = signature([tensor("input", ["N", 64])], [tensor("probabilities", ["N", 10])])

    assert input_differences(STABLE, candidate) == []


def test_a_batch_axis_agrees_with_a_fixed_first_axis():
    one_row_at_a_time = signature([tensor("input", [1, 64])], batchable=False)

    assert input_differences(STABLE, one_row_at_a_time) == []


def test_fixed_first_axes_of_versions_that_do_not_batch_are_compared():
    stable = signature([tensor("input", [2, 64])], batchable=False)
    candidate = signature([tensor("input", [3, 64])], batchable=False)

    assert input_differences(stable, candidate, stable_version=1) == ["input 'input' dimension 0: 2 on v1, 3 here"]


def test_a_symbolic_dimension_agrees_with_a_fixed_one():
    stable = signature([tensor("tokens", ["batch", "sequence"])])
    candidate = signature([tensor("tokens", ["batch", 128])])

    assert input_differences(stable, candidate) == []
    assert input_differences(candidate, stable) == []


def test_an_unknown_dimension_agrees_with_a_fixed_one():
    stable = signature([tensor("tokens", ["batch", None])])

    assert input_differences(stable, signature([tensor("tokens", ["batch", 128])])) == []


def test_the_order_of_inputs_does_not_matter():
    stable = signature([tensor("a", ["batch", 4]), tensor("b", ["batch", 2])])
    candidate = signature([tensor("b", ["batch", 2]), tensor("a", ["batch", 4])])

    assert input_differences(stable, candidate) == []


def test_an_added_output_is_compatible_and_not_noted():
    candidate = signature([tensor("input", ["batch", 64])], [tensor("probabilities", ["batch", 10]), tensor("logits", ["batch", 10])])

    report = compatibility_report(3, STABLE, candidate)

    assert report == {"stable_version": 3, "compatible": True, "differences": [], "notes": []}


def test_a_removed_output_is_compatible_but_noted():
    candidate = signature([tensor("input", ["batch", 64])], [tensor("logits", ["batch", 10])])

    report = compatibility_report(3, STABLE, candidate)

    assert report["compatible"] is True
    assert report["notes"] == ["output 'probabilities' of v3 is missing here"]


def test_losing_batching_is_noted():
    candidate = signature([tensor("input", ["batch", 64])], batchable=False)

    assert output_notes(STABLE, candidate, stable_version=3) == [
        "v3 is batchable and this version is not: a single row sent without its batch axis is refused here"
    ]


def test_a_report_with_differences_is_incompatible_and_lists_them():
    candidate = signature([tensor("input", ["batch", 60])])

    report = compatibility_report(3, STABLE, candidate)

    assert report == {
        "stable_version": 3, "compatible": False, "differences": ["input 'input' dimension 1: 64 on v3, 60 here"], "notes": [],
    }


def test_a_first_version_has_no_stable_and_is_compatible():
    assert compatibility_report(None, None, STABLE) == {"stable_version": None, "compatible": True, "differences": [], "notes": []}
