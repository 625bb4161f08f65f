"""Labels an evaluation can score, judged when a data set is uploaded.

A data set is evaluated on every ready version, in a child process, long after its
upload was answered 201: a label the evaluation refuses (1.5 or NaN as a class, a string
or Infinity as a regression target, a target of 3 values for a model that answers 10)
failed every evaluation of it. ``LabelRule`` is what the upload knows: the task, and for
regression how many values a row of the checked version's first output holds, when its
signature fixes them. ``serving.jobs.formats`` reads the file and asks these functions.

Memory and time stay bounded whatever the file claims: only float labels are read (other
dtypes are judged by their header), in chunks of at most ``CHECK_BYTES`` (one row at least:
a row of more than ``MAX_LABEL_VALUES`` values is refused from its header), and labels of
more than ``MAX_LABEL_BYTES`` in all are refused from it too (a compressed row of zeros a
gigabyte wide fits in a small upload, and its inflating runs inside the upload's request).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from serving.contract import NOT_IN_A_LINE, NOT_IN_A_LINE_RANGES

CLASSIFICATION_LABEL = "a classification label is an integer or a string"
MAX_CLASS_CHARS = 200
# A class is a row and a column heading on the version page: 5,000-character labels and
# ESC sequences or U+202E in them were stored and shown as sent.
CLASS_TEXT = (f"a class label of text is one line of at most {MAX_CLASS_CHARS} characters, without control characters or "
              "directional overrides")
REGRESSION_LABEL = "a regression label is a finite number or a list of finite numbers"
MAX_LABEL_VALUES = 1 << 20  # values in one row's label
MAX_LABEL_BYTES = 1 << 30  # a data set's labels in all, as stored (about 3 s to check on this box)
CHECK_BYTES = 16 << 20  # labels read at a time
MAX_CHECK_ROWS = 65_536


@dataclass(frozen=True)
class LabelRule:
    task: str | None = None  # "classification", "regression", or None (the format alone is checked)
    width: int | None = None  # regression: the values a row of the model's first output holds, when known
    width_of: str = "a row of the model's first output"  # what ``width`` is, as a refusal names it

    def after(self, value: object) -> LabelRule:
        """The rule for the rows after a .jsonl row whose label was ``value``: without a
        width from the model, every regression label must be as wide as the first (the
        evaluation compares each with the same output)."""
        if self.task != "regression" or self.width is not None:
            return self
        return replace(self, width=len(value) if isinstance(value, list) else 1, width_of="the first row's label")


def regression_width(signature: object) -> int | None:
    """The values per row of the first output in a version's signature (what the
    evaluation compares a regression label with), when every non-batch dimension is fixed."""
    outputs = signature.get("outputs") if isinstance(signature, dict) else None
    shape = outputs[0].get("shape") if isinstance(outputs, list) and outputs and isinstance(outputs[0], dict) else None
    if not isinstance(shape, list) or not shape:
        return None
    rest = shape[1:]
    if not all(isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in rest):
        return None
    return math.prod(rest)


def value_problem(value: object, rule: LabelRule) -> str | None:
    """Why a .jsonl row's label (already known to be a number, a string or a list of
    numbers) cannot be scored under ``rule``, or None."""
    if rule.task == "classification":
        if isinstance(value, str):
            return CLASS_TEXT if _text_problem(value) else None
        integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        return None if integral else CLASSIFICATION_LABEL
    if rule.task == "regression":
        values = value if isinstance(value, list) else [value]
        if not all(not isinstance(item, str) and _finite(item) for item in values):
            return REGRESSION_LABEL
        return _width_problem(len(values), rule)
    return None


def header_problem(dtype: np.dtype, row_shape: tuple[int, ...], rule: LabelRule, data_bytes: int = 0) -> str | None:
    """Why an .npz labels array of ``dtype``, rows of ``row_shape`` and ``data_bytes`` in
    all cannot be scored, or None."""
    values = math.prod(row_shape)
    if values > MAX_LABEL_VALUES:
        return f"a label row holds {values} values; at most {MAX_LABEL_VALUES} are read"
    if data_bytes > MAX_LABEL_BYTES:
        return f"the labels hold {data_bytes} bytes; at most {MAX_LABEL_BYTES} are read"
    if rule.task == "classification" and (dtype.kind == "b" or row_shape != ()):
        return f"{CLASSIFICATION_LABEL}, one per row"
    if rule.task == "classification" and dtype.kind == "U" and dtype.itemsize // 4 > MAX_CLASS_CHARS:
        return f"the labels are text of up to {dtype.itemsize // 4} characters; {CLASS_TEXT}"
    if rule.task == "regression":
        return REGRESSION_LABEL if dtype.kind in "bU" else _width_problem(values, rule)
    return None


def rows_per_check(row_bytes: int) -> int:
    """How many label rows to read at a time: at most CHECK_BYTES of them."""
    return max(1, min(MAX_CHECK_ROWS, CHECK_BYTES // max(1, row_bytes)))


def reads_rows(dtype: np.dtype, rule: LabelRule) -> bool:
    """Whether labels of ``dtype`` are read at all: only floats can hold a value no task
    scores (NaN, 1.5 as a class), and text a class no page should show as stored (ESC,
    U+202E, a line break); other dtypes are judged by their header alone."""
    floats = rule.task in ("classification", "regression") and dtype.kind == "f"
    return floats or (rule.task == "classification" and dtype.kind == "U")


def chunk_problem(labels: np.ndarray, rule: LabelRule) -> tuple[int, str] | None:
    """(index in ``labels``, why) of the first row that cannot be scored, or None."""
    if not reads_rows(labels.dtype, rule):
        return None
    if labels.dtype.kind == "U":
        index = _first_unshown_text(labels.reshape(len(labels)))
        return None if index is None else (index, CLASS_TEXT)
    values = labels.reshape(len(labels), -1)
    usable = np.isfinite(values).all(axis=1)
    if rule.task == "classification":
        usable &= (values == np.floor(values)).all(axis=1)
    if usable.all():
        return None
    return int(np.argmin(usable)), CLASSIFICATION_LABEL if rule.task == "classification" else REGRESSION_LABEL


def shown_class(text: str) -> str:
    """A class the model answered as text, as a page may show it: at most MAX_CLASS_CHARS,
    hidden characters as U+FFFD (a data set's own labels are refused instead)."""
    return NOT_IN_A_LINE.sub("\ufffd", text[:MAX_CLASS_CHARS])


def _text_problem(text: str) -> bool:
    return len(text) > MAX_CLASS_CHARS or NOT_IN_A_LINE.search(text) is not None


def _first_unshown_text(labels: np.ndarray) -> int | None:
    """The first row of text labels a page could not show as stored, judged by their code
    points at once (NUL is the array's padding, not read). Their width was judged by the
    header (an .npz of bytes is refused by formats.py)."""
    codes = labels.view(np.uint32).reshape(len(labels), -1)
    bad = np.zeros(codes.shape, np.bool_)
    for low, high in NOT_IN_A_LINE_RANGES:
        bad |= (codes >= max(low, 1)) & (codes <= high)
    rows = bad.any(axis=1)
    return int(np.argmax(rows)) if rows.any() else None


def _width_problem(values: int, rule: LabelRule) -> str | None:
    if values == 0:
        return "a regression label holds no value"
    if rule.width is not None and values != rule.width:
        return f"the label has {values} values; {rule.width_of} has {rule.width}"
    return None


def _finite(number: int | float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int past float's range
        return False
