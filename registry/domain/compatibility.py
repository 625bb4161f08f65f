"""Whether a version takes the same requests as the model's stable version.

A client written against the stable version sends its inputs: by name, in its
datatypes, in its shapes. A candidate is *incompatible* when some of those requests can
no longer be accepted, i.e. when an input is missing or added, changes datatype,
changes rank, or has a dimension that no request could satisfy on both versions.

The rule for dimensions, which follows what a worker checks (``serving.protocol``
refuses only a fixed dimension of another size):

- A symbolic (``"seq"``) or unknown (``None``) dimension accepts every size, so it
  agrees with any fixed size and with any other symbol. Only two different fixed sizes
  cannot agree. A candidate that fixes a dimension the stable left open therefore stays
  compatible: some requests fit both.
- So the batch axis never counts: it is the first axis when a version is batchable
  (inspection proves that only for a symbolic first axis) or when both first axes are
  symbolic, and a symbolic axis agrees with anything. Two fixed first axes (neither
  version batches) are compared like any other dimension.

Outputs never make a version incompatible (a new output is fine), but an output the
stable had and the candidate lacks, or a candidate that loses batching, is listed as a
note: clients may still notice.

Signatures are the dicts inspection builds (``registry.artifacts.inspection``):
``{"inputs": [{"name", "datatype", "shape"}], "outputs": [...], "batchable", ...}``.
"""

from __future__ import annotations


def input_differences(stable_signature: dict, candidate_signature: dict, *, stable_version: int | None = None) -> list[str]:
    """Each way the candidate's inputs refuse requests the stable's accept, as a sentence.

    An empty list means compatible. ``stable_version`` only words the sentences
    ("on v3"); without it they say "on stable".
    """
    there = _label(stable_version)
    stable, candidate = _inputs(stable_signature), _inputs(candidate_signature)
    differences = [f"input '{name}' of {there} is missing here" for name in stable if name not in candidate]
    differences += [f"input '{name}' is new here ({there} has no such input)" for name in candidate if name not in stable]
    for name in (name for name in stable if name in candidate):
        differences += _spec_differences(stable[name], candidate[name], there)
    return differences


def output_notes(stable_signature: dict, candidate_signature: dict, *, stable_version: int | None = None) -> list[str]:
    """What clients may notice that does not refuse their requests."""
    there = _label(stable_version)
    candidate_outputs = {spec["name"] for spec in candidate_signature.get("outputs") or []}
    notes = [f"output '{spec['name']}' of {there} is missing here"
             for spec in stable_signature.get("outputs") or [] if spec["name"] not in candidate_outputs]
    if _batchable(stable_signature) and not _batchable(candidate_signature):
        notes.append(f"{there} is batchable and this version is not: a single row sent without its batch axis is refused here")
    return notes


def compatibility_report(stable_version_number: int | None, stable_signature: dict | None, candidate_signature: dict) -> dict:
    """The ``validation_report["compatibility"]`` entry; no stable (a model's first version) is compatible."""
    if stable_version_number is None or stable_signature is None:
        return {"stable_version": None, "compatible": True, "differences": [], "notes": []}
    differences = input_differences(stable_signature, candidate_signature, stable_version=stable_version_number)
    return {
        "stable_version": stable_version_number,
        "compatible": not differences,
        "differences": differences,
        "notes": output_notes(stable_signature, candidate_signature, stable_version=stable_version_number),
    }


def _label(stable_version: int | None) -> str:
    return "stable" if stable_version is None else f"v{stable_version}"


def _inputs(signature: dict) -> dict[str, dict]:
    return {spec["name"]: spec for spec in signature.get("inputs") or []}


def _batchable(signature: dict) -> bool:
    return signature.get("batchable") is True


def _spec_differences(stable: dict, candidate: dict, there: str) -> list[str]:
    name = stable["name"]
    differences = []
    if stable["datatype"] != candidate["datatype"]:
        differences.append(f"input '{name}': {stable['datatype']} on {there}, {candidate['datatype']} here")
    old, new = list(stable["shape"]), list(candidate["shape"])
    if len(old) != len(new):
        differences.append(f"input '{name}': rank {len(old)} on {there}, rank {len(new)} here")
        return differences
    for axis, (was, now) in enumerate(zip(old, new)):
        if not _agree(was, now):
            differences.append(f"input '{name}' dimension {axis}: {was} on {there}, {now} here")
    return differences


def _is_open(dimension) -> bool:
    """Symbolic or unknown: any size fits."""
    return not isinstance(dimension, int)


def _agree(stable, candidate) -> bool:
    return _is_open(stable) or _is_open(candidate) or stable == candidate
