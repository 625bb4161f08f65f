"""The evaluate command: how well a model answers a labelled dataset, streamed in batches.

Classification: the predicted class is the argmax of the first output that is
[batch, classes] floats (classes >= 2), or the value of the first [batch] / [batch, 1]
integer or string output, whichever comes first in the model's output order. Labels
are integers or strings; when either side has a string, classes compare as text.
A precision or recall with nothing to divide by (a class never predicted, or never
true) is null, not 0. Regression: the first output, flattened per row, against the
label (a number or a list of numbers per row): mean absolute and mean squared error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from serving.config import ServingConfig
from serving.engine import Engine, TensorSpec
from serving.jobs.formats import (
    LABELS_MEMBER,
    ArrayFile,
    FormatError,
    count_lines,
    group_rows,
    jsonl_rows,
    require_numeric_inputs,
    short,
    stack_feeds,
)
from serving.jobs.labels import shown_class
from serving.jobs.model import (
    BATCH_BUDGET_BYTES,
    RunError,
    input_layouts,
    load_engine,
    rows_per_batch,
    run_rows,
)
from serving.jobs.protocol import Progress

EVALUATION_BATCH_SIZE = 256


def run(model: Path | bytes, dataset: Path, file_format: str, task: str) -> dict:
    engine = load_engine(model, ServingConfig.from_env())
    score = Classification(engine.outputs) if task == "classification" else Regression(engine.outputs)
    batches, total = _batches(engine, dataset, file_format)
    progress = Progress(total)
    done = 0
    for arrays, labels in batches:
        try:
            outputs = run_rows(engine, input_layouts(engine), arrays)
        except RunError as error:
            raise FormatError(f"rows {done}-{done + len(labels) - 1}: the model failed on them: {error.reason}") from None
        score.add(outputs, labels, first_row=done)
        done += len(labels)
        progress.tick(done)
        del arrays, outputs  # else they live on while the next batch is read
    if done == 0:
        raise FormatError("the dataset has no rows")
    progress.finish(done)
    return {"task": task, "samples": done, **score.result()}


def _batches(engine: Engine, dataset: Path, file_format: str) -> tuple[Iterator, int | None]:
    layouts = input_layouts(engine)
    batch_size = EVALUATION_BATCH_SIZE if engine.is_batchable else 1
    if file_format == "npz":
        arrays = ArrayFile(dataset, "npz", label_member=LABELS_MEMBER, inputs=layouts)
        return _npz_batches(arrays, layouts, batch_size), arrays.rows
    require_numeric_inputs(layouts)
    return _jsonl_batches(dataset, layouts, batch_size), count_lines(dataset)


def _npz_batches(arrays: ArrayFile, layouts, batch_size: int) -> Iterator[tuple[list[np.ndarray], list]]:
    with arrays:
        members = arrays.match_inputs(layouts, extra=(LABELS_MEMBER,))
        row_bytes = sum(arrays.header(member).row_bytes for member in members)
        size = rows_per_batch(batch_size, row_bytes)
        dtypes = [layout.dtype for layout in layouts] + [None]
        for _start, chunk in arrays.chunks([*members, LABELS_MEMBER], dtypes, size):
            yield chunk[:-1], list(chunk[-1])


def _jsonl_batches(dataset: Path, layouts, batch_size: int) -> Iterator[tuple[list[np.ndarray], list]]:
    for batch in group_rows(jsonl_rows(dataset, layouts, with_label=True), batch_size, BATCH_BUDGET_BYTES):
        if batch[0].feeds is None:
            raise FormatError(batch[0].error)
        yield stack_feeds(batch), [row.label for row in batch]


# ---------------------------------------------------------------- classification


def class_output(outputs: Sequence[np.ndarray], specs: Sequence[TensorSpec]) -> tuple[int, bool]:
    """(position, is_scores) of the output that gives the predicted class."""
    for position, output in enumerate(outputs):
        if output.dtype.kind == "f" and output.ndim == 2 and output.shape[1] >= 2:
            return position, True
        if output.dtype.kind in "iuUO" and (output.ndim == 1 or (output.ndim == 2 and output.shape[1] == 1)):
            return position, False
    described = ", ".join(f"'{short(spec.name)}' {output.dtype}{list(output.shape)}" for spec, output in zip(specs, outputs))
    raise FormatError("no output of the model gives a class: classification needs [batch, classes] scores "
                      f"or [batch] labels (outputs: {described})")


def class_label(value: object, row: int) -> int | str:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.floating):  # a longdouble's item() is itself, not a float
        value = float(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return shown_class(value)  # a model's text answer may be anything; a data set's labels were checked
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise FormatError(f"row {row}: a classification label is an integer or a string, not '{short(value)}'")


# A data set of 540 classes made a version page of 294,338 cells (6.5 MB, 6 s to render),
# and 1,500 a result line past what the job's runner reads: the matrix is kept up to
# MAX_MATRIX_CLASSES classes, the per-class figures for the MAX_PER_CLASS most supported.
MAX_MATRIX_CLASSES = 64
MAX_PER_CLASS = 256


class Classification:
    def __init__(self, specs: Sequence[TensorSpec]):
        self._specs = specs
        self._chosen: tuple[int, bool] | None = None
        self._pairs: Counter = Counter()  # (true class, predicted class) -> rows

    def add(self, outputs: Sequence[np.ndarray], labels: Sequence[object], *, first_row: int) -> None:
        if self._chosen is None:
            self._chosen = class_output(outputs, self._specs)
        position, is_scores = self._chosen
        output = outputs[position]
        predicted = output.argmax(axis=1) if is_scores else output.reshape(len(output))
        for offset, (label, guess) in enumerate(zip(labels, predicted.tolist())):
            self._pairs[class_label(label, first_row + offset), class_label(guess, first_row + offset)] += 1

    def result(self) -> dict:
        pairs = self._pairs
        if any(isinstance(cls, str) for pair in pairs for cls in pair):
            pairs = Counter()
            for (true, guess), count in self._pairs.items():
                pairs[str(true), str(guess)] += count
        classes = sorted({cls for pair in pairs for cls in pair})
        samples = sum(pairs.values())
        correct = sum(count for (true, guess), count in pairs.items() if true == guess)
        per_class = _per_class(classes, pairs)
        result = {"accuracy": correct / samples, "classes_count": len(classes)}
        if len(classes) > MAX_MATRIX_CLASSES:
            # The most supported classes, in class order; no matrix (it grows with the square).
            kept = set(sorted(classes, key=lambda cls: -per_class[cls]["support"])[:MAX_PER_CLASS])
            shown = [cls for cls in classes if cls in kept]
            return {**result, "classes": shown, "per_class": {str(cls): per_class[cls] for cls in shown}, "confusion_matrix": None}
        matrix = [[pairs.get((true, guess), 0) for guess in classes] for true in classes]
        return {**result, "classes": classes, "per_class": {str(cls): per_class[cls] for cls in classes}, "confusion_matrix": matrix}


def _per_class(classes: list, pairs: Counter) -> dict:
    support, predicted = Counter(), Counter()
    for (true, guess), count in pairs.items():
        support[true] += count
        predicted[guess] += count
    per_class = {}
    for cls in classes:
        hits = pairs.get((cls, cls), 0)
        per_class[cls] = {"precision": hits / predicted[cls] if predicted[cls] else None,
                          "recall": hits / support[cls] if support[cls] else None, "support": support[cls]}
    return per_class


# ---------------------------------------------------------------- regression


class Regression:
    def __init__(self, specs: Sequence[TensorSpec]):
        self._name = specs[0].name
        self._abs_error = 0.0
        self._squared_error = 0.0
        self._values = 0

    def add(self, outputs: Sequence[np.ndarray], labels: Sequence[object], *, first_row: int) -> None:
        predicted = outputs[0].reshape(len(outputs[0]), -1).astype(np.float64)
        truth = self._truth(labels, predicted.shape[1], first_row)
        difference = predicted - truth
        self._abs_error += float(np.abs(difference).sum())
        self._squared_error += float(np.square(difference).sum())
        self._values += difference.size

    def _truth(self, labels: Sequence[object], width: int, first_row: int) -> np.ndarray:
        rows = []
        for offset, label in enumerate(labels):
            try:
                values = np.asarray(label, dtype=np.float64).reshape(-1)
            except (ValueError, TypeError):
                raise FormatError(f"row {first_row + offset}: a regression label is a number or a list of numbers, "
                                  f"not '{short(label)}'") from None
            if values.size != width:
                raise FormatError(f"row {first_row + offset}: the label has {values.size} values; output "
                                  f"'{short(self._name)}' has {width} per row")
            rows.append(values)
        return np.stack(rows)

    def result(self) -> dict:
        return {"mae": self._abs_error / self._values, "mse": self._squared_error / self._values}
