"""KServe V2 (Open Inference Protocol) and /predict codecs, validated against the model.

Decoding turns a body into NumPy arrays in the model's input order, or raises
BadRequest naming the input and the problem. Binary tensors (the `binary_tensor_data`
extension, tritonclient's default) are zero-copy views over the request body.

JSON tensor data is strict: numbers of the declared type only (ints are fine in float
data; no strings, nulls, booleans or objects; booleans only, in BOOL data; integers in
range, in integer data), because NumPy would otherwise convert "0.5" or "NaN" silently.
JSON has no NaN or infinity: a non-finite output element is written as the string
"NaN", "Infinity" or "-Infinity" (the words Triton writes bare), which keeps the answer
valid JSON and reads back as the same float with `np.array(data, dtype)`; binary outputs
carry the IEEE bits unchanged. A BYTES (string) output is a list of strings in JSON and,
in binary, Triton's length-prefixed elements (`bytes_tensor`). BYTES inputs are never
decoded: a model with one is refused at load.
"""

from __future__ import annotations

import codecs
import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import orjson

from serving.engine import TensorSpec, c_ordered
from serving.errors import BadRequest, PayloadTooLarge, clip

NUMPY_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


@dataclass(frozen=True, slots=True)
class ModelIO:
    """What the codec needs to know about a loaded version."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    is_batchable: bool
    max_elements: int
    # Derived once per version, so the request path does not rebuild them.
    specs: dict = field(init=False, repr=False, compare=False)
    default_outputs: tuple = field(init=False, repr=False, compare=False)
    json_outputs: tuple = field(init=False, repr=False, compare=False)
    output_index: dict = field(init=False, repr=False, compare=False)
    shared_dims: tuple = field(init=False, repr=False, compare=False)  # see _shared_dims

    def __post_init__(self) -> None:
        object.__setattr__(self, "specs", {spec.name: spec for spec in self.inputs})
        object.__setattr__(self, "shared_dims", _shared_dims(self.inputs))
        object.__setattr__(self, "output_index", {spec.name: index for index, spec in enumerate(self.outputs)})
        object.__setattr__(self, "json_outputs", tuple((index, False) for index in range(len(self.outputs))))
        object.__setattr__(self, "default_outputs", {
            False: self.json_outputs, True: tuple((index, True) for index in range(len(self.outputs))),
        })


def _shared_dims(inputs: Sequence[TensorSpec]) -> tuple[tuple[str, tuple[tuple[int, int], ...]], ...]:
    """(name, ((input index, axis), ...)) for each symbolic dimension named more than once,
    found once per version: a model with none costs a request one empty-tuple test."""
    places: dict[str, list[tuple[int, int]]] = {}
    for index, spec in enumerate(inputs):
        for axis, (dim, name) in enumerate(zip(spec.shape, spec.dim_names)):
            if dim is None and name is not None:
                places.setdefault(name, []).append((index, axis))
    return tuple((name, tuple(where)) for name, where in places.items() if len(where) > 1)


# A V2 body carries no more than its elements take, plus names, ids and parameters. 64
# bytes an element covers the longest number text ("-1.7976931348623157e+308", 24), its
# separator, the brackets of nested data and pretty-printed indentation; a binary element
# is at most 8 bytes (BYTES inputs are refused at load).
JSON_BYTES_PER_ELEMENT = 64
BODY_ALLOWANCE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class BodyLimit:
    """The most bytes a request body may have, and why when it is less than
    SERVING_MAX_BODY_BYTES: parsing JSON builds a Python object per element (a 60 MB body
    of zeros took 2 s of the event loop and 770 MB), so a body is refused (413) before it
    is read, or as soon as it (or its inflated form) passes what the model can take."""

    max_bytes: int
    reason: str | None = None

    def too_large(self, what: str) -> PayloadTooLarge:
        if self.reason is None:
            return PayloadTooLarge(f"{what} exceeds the limit of {self.max_bytes} bytes")
        return PayloadTooLarge(f"{what} is too large: {self.reason}")


def v2_body_limit(model_name: str, version: int, io: ModelIO, max_rows: int, max_body_bytes: int) -> BodyLimit:
    """What a V2 request to this version can take: when every non-batch dimension is fixed,
    `max_rows` (max_batch_size; a version that does not batch has a fixed first dimension
    instead) times the elements of a row, summed over inputs. A dynamic dimension leaves
    SERVING_MAX_BODY_BYTES, as does a bound above it."""
    per_row = 0
    for spec in io.inputs:
        dims = spec.shape[1:] if io.is_batchable else spec.shape
        if None in dims:
            return BodyLimit(max_body_bytes)
        per_row += math.prod(dims)
    rows = max_rows if io.is_batchable else 1
    max_bytes = rows * per_row * JSON_BYTES_PER_ELEMENT + BODY_ALLOWANCE_BYTES
    if max_bytes >= max_body_bytes:
        return BodyLimit(max_body_bytes)
    takes = f"{rows} rows of {per_row} elements" if io.is_batchable else f"{per_row} elements (its inputs' fixed shapes)"
    return BodyLimit(max_bytes, f"version {version} of '{clip(model_name)}' takes at most {max_bytes} bytes: {takes}, "
                                f"at {JSON_BYTES_PER_ELEMENT} bytes an element plus {BODY_ALLOWANCE_BYTES}")


@dataclass(slots=True)
class Decoded:
    """A validated request: arrays in model input order, and how to answer it."""

    tensors: tuple[np.ndarray, ...]
    rows: int
    outputs: tuple[tuple[int, bool], ...] = ()  # (output index, as binary)
    id: str | None = None
    timeout_s: float | None = None
    is_single_row: bool = False

    @property
    def shape_key(self) -> tuple:
        """Requests batch together only when every non-batch dimension matches."""
        return tuple(tensor.shape[1:] for tensor in self.tensors)


def _json_default(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError


def dumps(document) -> bytes:
    return orjson.dumps(document, default=_json_default, option=NUMPY_OPTIONS)


class BodyNotJson(BadRequest):
    """A body (or its JSON part) that does not parse as JSON."""

    def __init__(self, what: str, reason: str):
        super().__init__(f"{what} is not valid JSON: {clip(reason)}")
        self.reason = reason

    def blame_missing_header(self, given_as_zero: bool = False) -> None:
        """Say what such a body most likely lacks: binary tensors sent without the header
        that says where the JSON ends read as "not valid UTF-8", which names nothing useful.
        ``given_as_zero``: the header came, as 0 (all JSON), which is what is wrong."""
        needs = ("Inference-Header-Content-Length 0 says the body is all JSON; binary tensor data needs it to be"
                 if given_as_zero else "binary tensor data needs the Inference-Header-Content-Length header,")
        self.message = f"request body is not valid JSON ({clip(self.reason)}): {needs} the length in bytes of the JSON part before it"


def load_object(body: bytes | memoryview, what: str = "request body") -> dict:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BodyNotJson(what, exc.msg) from None
    if not isinstance(document, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return document


# ---- validation shared by both codecs -------------------------------------------------


def check_shape(spec: TensorSpec, shape: Sequence[int], io: ModelIO) -> int:
    """Validate `shape` against the spec; return its element count."""
    if len(shape) != len(spec.shape):
        raise BadRequest(f"input '{spec.name}': expected rank {len(spec.shape)}, got shape {clip(list(shape))}")
    for axis, (got, want) in enumerate(zip(shape, spec.shape)):
        if want is not None and got != want:
            raise BadRequest(f"input '{spec.name}': dimension {axis} must be {want}, got {got}")
        if got < 1:
            raise BadRequest(f"input '{spec.name}': dimension {axis} must be at least 1, got {got}")
    count = math.prod(shape)
    if count > io.max_elements:
        raise BadRequest(f"input '{spec.name}': {count} elements exceed the limit of {io.max_elements}")
    return count


def check_shared_dims(tensors: Sequence[np.ndarray], io: ModelIO) -> None:
    """Inputs that name the same dimension (input_ids and attention_mask: [N, S]) must agree
    on its size. ONNX Runtime checks no such thing before the run: a Mul or MatMul of the
    two then fails as the model's failure (500), which any client could put on a canary."""
    for name, places in io.shared_dims:
        first_index, first_axis = places[0]
        size = tensors[first_index].shape[first_axis]
        for index, axis in places[1:]:
            if tensors[index].shape[axis] != size:
                raise BadRequest(f"inputs '{io.inputs[first_index].name}' and '{io.inputs[index].name}' must agree on "
                                 f"dimension '{clip(name)}': {size} in '{io.inputs[first_index].name}' (axis {first_axis}), "
                                 f"{tensors[index].shape[axis]} in '{io.inputs[index].name}' (axis {axis})")


def spec_dtype(spec: TensorSpec) -> np.dtype:
    dtype = spec.dtype
    if dtype is None:
        raise BadRequest(f"input '{spec.name}': datatype {spec.datatype} is not supported by this server")
    return dtype


# The JSON value types each NumPy kind accepts (bool is not an int here, though Python says so).
_JSON_TYPES = {"f": frozenset((int, float)), "i": frozenset((int,)), "u": frozenset((int,)), "b": frozenset((bool,))}
_JSON_WORDS = {"f": "numbers", "i": "integers", "u": "integers", "b": "booleans (true/false)"}
_TYPE_WORDS = {str: "a string", type(None): "null", bool: "a boolean", float: "a non-integer number", dict: "an object",
               list: "a nested list where a value belongs", int: "an integer"}
_LISTS = frozenset((list,))


# A longer list is checked and converted a slice at a time. Each slice is one C call that
# holds the GIL for a few milliseconds; between them, a large body decoded in a thread
# (serving/dataplane.py) lets the event loop answer other clients. In one call, 10 million
# elements held it for a quarter of a second.
SLICE_ITEMS = 1 << 17


def array_from_list(spec: TensorSpec, data: object) -> np.ndarray:
    if not isinstance(data, list):
        raise BadRequest(f"input '{spec.name}': data must be a list")
    dtype = spec_dtype(spec)
    if len(data) > SLICE_ITEMS:
        return _array_by_slices(spec, dtype, data)
    _check_json_types(spec, dtype, data)
    return _array(spec, dtype, data)


def _array_by_slices(spec: TensorSpec, dtype: np.dtype, data: list) -> np.ndarray:
    array = None
    for start in range(0, len(data), SLICE_ITEMS):
        part = data[start:start + SLICE_ITEMS]
        _check_json_types(spec, dtype, part)
        converted = _array(spec, dtype, part)
        if array is None:
            array = np.empty((len(data), *converted.shape[1:]), dtype)
        elif converted.shape[1:] != array.shape[1:]:  # rows of another length than the first slice's
            raise BadRequest(f"input '{spec.name}': data is not a rectangular array of {spec.datatype} values")
        array[start:start + len(part)] = converted
    return array


def _array(spec: TensorSpec, dtype: np.dtype, data: list) -> np.ndarray:
    try:
        with np.errstate(over="raise"):  # a float beyond FP32/FP16 range would become inf
            return np.array(data, dtype=dtype)
    except (OverflowError, FloatingPointError):
        raise BadRequest(f"input '{spec.name}': a value is out of range for {spec.datatype}") from None
    except (ValueError, TypeError):
        raise BadRequest(f"input '{spec.name}': data is not a rectangular array of {spec.datatype} values") from None


def _check_json_types(spec: TensorSpec, dtype: np.dtype, data: list) -> None:
    """One C-speed pass per nesting level: the set of element types must fit the dtype."""
    level, types = data, set(map(type, data))
    allowed = _JSON_TYPES[dtype.kind]
    if types <= allowed:  # flat data of the right type: the common case
        return
    while types == _LISTS:  # rows of rows: look one level down
        level = list(chain.from_iterable(level))
        types = set(map(type, level))
    wrong = types - allowed
    if wrong:
        found = _TYPE_WORDS.get(min(wrong, key=lambda kind: kind.__name__), "a value of another type")
        if list in wrong:
            raise BadRequest(f"input '{spec.name}': data is not a rectangular array of {spec.datatype} values")
        if float in wrong and dtype.kind in "iu" and any(type(value) is float and abs(value) >= 2**63 for value in level):
            # orjson reads an integer past 64 bits as a float: say what it was, not "non-integer"
            raise BadRequest(f"input '{spec.name}': a value is out of range for {spec.datatype}")
        raise BadRequest(f"input '{spec.name}': {spec.datatype} data must hold {_JSON_WORDS[dtype.kind]}, found {found}")


def rows_of(tensors: Sequence[np.ndarray], io: ModelIO) -> int:
    if not io.is_batchable:
        return 1
    rows = tensors[0].shape[0]
    if len(tensors) == 1:
        return rows
    for spec, tensor in zip(io.inputs, tensors):
        if tensor.shape[0] != rows:
            raise BadRequest(f"input '{spec.name}': batch dimension {tensor.shape[0]} differs from {rows}")
    return rows


# ---- KServe V2 request ----------------------------------------------------------------


def split_binary(body: bytes, header_length: int | None) -> tuple[memoryview, memoryview]:
    """(JSON part, binary part) per the Inference-Header-Content-Length header; 0 says the
    whole body is JSON, as Triton reads it."""
    view = memoryview(body)
    if not header_length:
        return view, view[:0]
    if not 0 < header_length <= len(body):
        raise BadRequest(f"Inference-Header-Content-Length {clip(str(header_length))} is outside the body of {len(body)} bytes")
    return view[:header_length], view[header_length:]


_NO_BINARY = memoryview(b"")


def decode_v2(body: bytes, header_length: int | None, io: ModelIO) -> Decoded:
    if not header_length:  # all JSON (no header, or 0 as Triton sends it): parse the bytes as they are
        try:
            document, binary = load_object(body), _NO_BINARY
        except BodyNotJson as exc:
            if _is_json_then_bytes(body, exc.reason):
                exc.blame_missing_header(given_as_zero=header_length == 0)
            raise
    else:
        json_part, binary = split_binary(body, header_length)
        document = load_object(json_part, f"the JSON part of the body (its first {header_length} bytes, Inference-Header-Content-Length)")
    items = document.get("inputs")
    if not isinstance(items, list) or not items:
        raise BadRequest("'inputs' must be a non-empty list")
    by_name = _v2_tensors(items, binary, io)
    if len(io.inputs) == 1:
        tensors = (_required(by_name, io.inputs[0]),)
    else:
        tensors = tuple(_required(by_name, spec) for spec in io.inputs)
    rows = rows_of(tensors, io)
    if io.shared_dims:
        check_shared_dims(tensors, io)
    parameters = document.get("parameters")
    request_id = document.get("id")
    return Decoded(
        tensors,
        rows,
        _requested_outputs(document, io, parameters),
        None if request_id is None else _request_id(request_id),
        None if parameters is None else _timeout_s(parameters),
    )


_OPENS_OBJECT = re.compile(rb"[ \t\r\n]*\{")
_AFTER_DOCUMENT = ("unexpected content after document", "trailing characters")  # orjson's words, newer and older


def _is_json_then_bytes(body: bytes, reason: str) -> bool:
    """Whether a body that failed to parse is a JSON object followed by other bytes: the
    shape of a binary tensor request whose Inference-Header-Content-Length is missing.
    Only on the error path; the second parse stops where the bytes stop being UTF-8."""
    if not _OPENS_OBJECT.match(body):
        return False
    if reason.startswith("str is not valid UTF-8"):
        try:
            codecs.utf_8_decode(body, "strict", True)
            return False  # valid UTF-8 after all (a bad escape in a string): not binary data
        except UnicodeDecodeError as exc:
            end = exc.start
        try:
            return isinstance(orjson.loads(memoryview(body)[:end]), dict)
        except orjson.JSONDecodeError as exc:
            reason = exc.msg
    return reason.startswith(_AFTER_DOCUMENT)


def _v2_tensors(items: list, binary: memoryview, io: ModelIO) -> dict[str, np.ndarray]:
    specs = io.specs
    by_name, offset = {}, 0
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest("each entry of 'inputs' must be an object")
        spec = _input_spec(item.get("name"), specs, by_name)
        shape = _v2_shape(spec, item)
        count = check_shape(spec, shape, io)
        array, offset = _v2_array(spec, item, shape, count, binary, offset)
        by_name[spec.name] = array
    if offset != len(binary):
        raise BadRequest(f"binary data has {len(binary) - offset} bytes not claimed by any input")
    return by_name


def _input_spec(name: object, specs: dict[str, TensorSpec], seen: dict) -> TensorSpec:
    if not isinstance(name, str):
        raise BadRequest("each input needs a string 'name'")
    spec = specs.get(name)
    if spec is None:
        raise BadRequest(f"input '{clip(name)}': the model has no such input (expected {clip(', '.join(specs))})")
    if name in seen:
        raise BadRequest(f"input '{clip(name)}': given twice")
    return spec


def _v2_shape(spec: TensorSpec, item: dict) -> list[int]:
    datatype, shape = item.get("datatype"), item.get("shape")
    if datatype != spec.datatype:
        raise BadRequest(f"input '{spec.name}': datatype must be {spec.datatype}, got {clip(repr(datatype))}")
    if not isinstance(shape, list) or not all(type(dim) is int for dim in shape):
        raise BadRequest(f"input '{spec.name}': shape must be a list of integers")
    return shape


def _v2_array(spec, item, shape, count, binary: memoryview, offset: int) -> tuple[np.ndarray, int]:
    size = _binary_size(spec, item.get("parameters"))
    if size is None:
        data = item.get("data")
        _refuse_too_many(spec, data, shape, count)
        array = array_from_list(spec, data)
        if array.size != count:
            raise BadRequest(f"input '{spec.name}': data has {array.size} elements, shape {shape} needs {count}")
        return array.reshape(shape), offset
    if "data" in item:  # which of the two is the tensor? Neither is guessed
        raise BadRequest(f"input '{spec.name}': give its values as 'data' or as binary data (parameters.binary_data_size), not both")
    dtype = spec_dtype(spec)
    if size != count * dtype.itemsize or offset + size > len(binary):
        raise BadRequest(
            f"input '{spec.name}': binary_data_size {size} does not match shape {shape} of {spec.datatype} "
            f"({count * dtype.itemsize} bytes) or the {len(binary) - offset} bytes left"
        )
    array = np.frombuffer(binary, dtype=dtype, count=count, offset=offset).reshape(shape)
    if dtype == np.bool_ and array.view(np.uint8).max(initial=0) > 1:
        # NumPy takes any byte as a bool: 2 reached the model as a true that Not kept true,
        # and a Cast answered 2 and 255, where the same values as JSON answered otherwise.
        raise BadRequest(f"input '{spec.name}': BOOL binary data must be bytes 0 or 1")
    return array, offset + size


def _refuse_too_many(spec: TensorSpec, data: object, shape: list[int], count: int) -> None:
    """A list with more elements than its shape has, refused before the conversion, which
    made it an array whole first (16 million values declared as one: 1 GB a request). Its
    top level and, when nested, the level below are counted (a list one level deeper
    passed a count of its top level alone); deeper ones the conversion counts."""
    if type(data) is not list:
        return
    if data and type(data[0]) is list:
        seen = sum(len(row) if type(row) is list else 1 for row in data)
        many = f"over {count}" if seen > count else ""
    else:
        seen, many = len(data), f"{len(data)}"
    if seen > count:
        raise BadRequest(f"input '{spec.name}': data has {many} elements, shape {shape} needs {count}")


def _binary_size(spec: TensorSpec, parameters: object) -> int | None:
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise BadRequest(f"input '{spec.name}': parameters must be an object")
    _refuse_shared_memory(parameters, f"input '{spec.name}'")
    size = parameters.get("binary_data_size")
    if size is not None and (type(size) is not int or size < 0):
        raise BadRequest(f"input '{spec.name}': binary_data_size must be a non-negative integer")
    return size


def _required(by_name: dict[str, np.ndarray], spec: TensorSpec) -> np.ndarray:
    array = by_name.get(spec.name)
    if array is None:
        raise BadRequest(f"input '{spec.name}': missing")
    return array


def _requested_outputs(document: dict, io: ModelIO, parameters: object = None) -> tuple[tuple[int, bool], ...]:
    requested = document.get("outputs")
    if parameters is None and requested is None:  # the common case: every output, as JSON
        return io.json_outputs
    parameters = {} if parameters is None else parameters  # [], 0, false are no object either
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object")
    default_binary = _flag(parameters, "binary_data_output", False, "parameters")
    if requested is None:
        return io.default_outputs[default_binary]
    if not isinstance(requested, list):
        raise BadRequest("'outputs' must be a list")
    if not requested:  # an empty selection selects nothing out: every output, as Triton answers it
        return io.default_outputs[default_binary]
    if len(requested) > len(io.outputs):  # some name repeats or is unknown: find it cheaply
        requested = requested[:len(io.outputs) + 1]
    chosen, seen = [], set()
    for item in requested:
        index, is_binary = _output_choice(item, io, default_binary)
        if index in seen:  # each copy would be encoded again: a small request, a huge answer
            raise BadRequest(f"output '{io.outputs[index].name}': requested more than once")
        seen.add(index)
        chosen.append((index, is_binary))
    return tuple(chosen)


def _output_choice(item: object, io: ModelIO, default_binary: bool) -> tuple[int, bool]:
    name = item.get("name") if isinstance(item, dict) else None
    if not isinstance(name, str):
        got = f"a {type(item).__name__}" if not isinstance(item, dict) else "no name" if name is None else f"name {clip(repr(name))}"
        raise BadRequest(f"each entry of 'outputs' needs a 'name', a string naming one of the model's outputs; got {got}")
    index = io.output_index.get(name)
    if index is None:
        raise BadRequest(f"output {clip(repr(name))}: the model has no such output")
    parameters = item.get("parameters", {})
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise BadRequest(f"output '{name}': parameters must be an object")
    if "classification" in parameters:
        # tritonclient's class_count: ignoring it would answer the full tensor where the
        # client asked for the top classes. Other unknown parameters change nothing: ignored.
        raise BadRequest(f"output '{name}': parameter \"classification\" is not supported (this server does not "
                         "implement Triton's classification extension)")
    _refuse_shared_memory(parameters, f"output '{name}'")
    return index, _flag(parameters, "binary_data", default_binary, f"output '{name}'")


def _refuse_shared_memory(parameters: dict, where: str) -> None:
    # An input naming a region has no data (it was refused as "data must be a list"), and
    # an output naming one was answered in the body as if no region had been asked for.
    if "shared_memory_region" in parameters:
        raise BadRequest(f"{where}: parameter \"shared_memory_region\" is not supported (this server does not "
                         "implement the shared-memory extension: send the tensor in the body)")


def _flag(parameters: dict, key: str, default: bool, where: str) -> bool:
    """A boolean parameter: "false" or 1 is refused rather than read as its truthiness."""
    value = parameters.get(key, default)
    if not isinstance(value, bool):
        raise BadRequest(f"{where}: {key} must be true or false, got {clip(repr(value))}")
    return value


def _request_id(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 256:
        raise BadRequest("'id' must be a string of at most 256 characters")
    return value


def _timeout_s(parameters: object) -> float | None:
    """V2 `parameters.timeout` is in microseconds, as tritonclient sends it."""
    if not isinstance(parameters, dict) or parameters.get("timeout") is None:
        return None
    timeout_us = parameters["timeout"]
    if type(timeout_us) not in (int, float) or not timeout_us > 0:
        raise BadRequest("parameters.timeout must be a positive number of microseconds")
    return timeout_us / 1e6


# ---- KServe V2 response ---------------------------------------------------------------

# What an output element takes in a JSON answer, at most for the usual numbers: a float32
# ("-0.12345679") about 12 bytes with its comma, a float64 up to 25. Used only to decide,
# before encoding, whether an answer is large enough to encode off the event loop.
ENCODED_BYTES_PER_ELEMENT = 24


def v2_answer_bytes(decoded: Decoded, outputs: Sequence[np.ndarray], io: ModelIO) -> int:
    """The estimated size of a V2 answer, from its outputs' element counts (binary ones
    at their bytes), without encoding it."""
    return sum(outputs[index].nbytes if is_binary else outputs[index].size * ENCODED_BYTES_PER_ELEMENT
               for index, is_binary in decoded.outputs)


def predict_answer_bytes(outputs: Sequence[np.ndarray]) -> int:
    """The estimated size of a /predict answer (every output as JSON)."""
    return sum(array.size for array in outputs) * ENCODED_BYTES_PER_ELEMENT


# What an output element takes at least: in JSON a character and its comma; in binary its
# bytes (a BYTES element its 4-byte length, while its array holds 8-byte object pointers).
LEAST_JSON_BYTES_PER_ELEMENT = 2
LEAST_BINARY_BYTES_PER_STRING = 4


def v2_answer_least_bytes(decoded: Decoded, outputs: Sequence[np.ndarray], io: ModelIO) -> int:
    """The fewest bytes a V2 answer's data can take, without encoding it: an answer past
    what the worker sends (SERVING_MAX_UNSENT_BYTES) by this count alone is refused unbuilt."""
    least = 0
    for index, is_binary in decoded.outputs:
        array = outputs[index]
        if not is_binary:
            least += array.size * LEAST_JSON_BYTES_PER_ELEMENT
        elif io.outputs[index].datatype == "BYTES":
            least += array.size * LEAST_BINARY_BYTES_PER_STRING
        else:
            least += array.nbytes
    return least


def predict_answer_least_bytes(decoded: Decoded, outputs: Sequence[np.ndarray]) -> int:
    """The same for a /predict answer: every output as JSON, a single row's first row only."""
    return sum((array[0].size if decoded.is_single_row else array.size) for array in outputs) * LEAST_JSON_BYTES_PER_ELEMENT



def encode_v2(model_name: str, version: int, decoded: Decoded, outputs: Sequence[np.ndarray], io: ModelIO) -> tuple[bytes, int | None]:
    """(body, JSON header length if any tensor went binary, else None)."""
    entries, blobs = [], []
    for index, is_binary in decoded.outputs:
        spec, array = io.outputs[index], c_ordered(outputs[index])
        entry = {"name": spec.name, "datatype": spec.datatype, "shape": array.shape}
        if is_binary:
            blob = array.data if spec.datatype != "BYTES" else bytes_tensor(array)
            entry["parameters"] = {"binary_data_size": blob.nbytes}
            blobs.append(blob)
        else:
            entry["data"] = json_data(array)
        entries.append(entry)
    document = {"model_name": model_name, "model_version": str(version), "outputs": entries}
    if decoded.id is not None:
        document["id"] = decoded.id
    header = dumps(document)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


_ELEMENT_LENGTH = struct.Struct("<I")


def bytes_tensor(array: np.ndarray) -> memoryview:
    """Triton's binary BYTES layout: for each element in row-major order, its length as a
    4-byte little-endian unsigned integer, then its bytes (a str as UTF-8). The array
    itself holds object pointers, which must never leave the process."""
    parts = []
    for element in array.reshape(-1).tolist():
        data = element if isinstance(element, bytes) else str(element).encode()
        parts += (_ELEMENT_LENGTH.pack(len(data)), data)
    return memoryview(b"".join(parts))


_NON_FINITE_WORDS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def json_data(array: np.ndarray) -> np.ndarray | list | orjson.Fragment:
    """Flat output data for JSON; a non-finite float becomes "NaN", "Infinity" or "-Infinity"
    (JSON has no such numbers: orjson would write null and lose the value)."""
    flat = array.reshape(-1)
    if flat.size > SLICE_ITEMS:
        return orjson.Fragment(_sliced_json(flat))
    return _finite_or_words(flat)


def _finite_or_words(array: np.ndarray) -> np.ndarray | list:
    if array.dtype.kind != "f" or np.isfinite(array).all():
        return array
    return _with_non_finite_words(array)


def _sliced_json(array: np.ndarray) -> bytes:
    """A large array's JSON, written SLICE_ITEMS elements (or whole rows) per orjson call.
    One call holds the GIL throughout (a 159 MB answer: 1.3 s), so an answer encoded in a
    thread (serving/dataplane.py) still stalled the event loop; between slices it runs."""
    if array.ndim == 0 or array.size <= SLICE_ITEMS:
        return dumps(_finite_or_words(array))
    row_size = array.size // len(array)
    if array.ndim > 1 and row_size > SLICE_ITEMS:  # rows larger than a slice: sliced within each row
        parts = [_sliced_json(row) for row in array]
    else:
        step = max(1, SLICE_ITEMS // row_size)
        parts = [dumps(_finite_or_words(array[start:start + step]))[1:-1] for start in range(0, len(array), step)]
    return b"[" + b",".join(parts) + b"]"


def _with_non_finite_words(array: np.ndarray) -> list:
    values = array.tolist()
    finite = np.isfinite(array).reshape(-1)
    for index in np.flatnonzero(~finite).tolist():
        _set_word(values, np.unravel_index(index, array.shape) if array.ndim > 1 else (index,))
    return values


def _set_word(values: list, position: tuple) -> None:
    holder = values
    for axis in position[:-1]:
        holder = holder[axis]
    holder[position[-1]] = _NON_FINITE_WORDS[str(holder[position[-1]])]


# ---- /predict -------------------------------------------------------------------------


PREDICT_KEYS = frozenset({"model_name", "version", "inputs"})


def predict_target(document: dict) -> tuple[str, int | None]:
    """(model_name, version or None) of a /predict body. A key it does not take is refused:
    a misspelt "verison" was ignored, and the split answered a request meant as pinned."""
    if not PREDICT_KEYS.issuperset(document):
        unknown = sorted(key for key in document if key not in PREDICT_KEYS)
        raise BadRequest(f"'{clip(unknown[0])}' is not a /predict key: it takes 'model_name', 'inputs' and, to pin a version, 'version'")
    model_name, version = document.get("model_name"), document.get("version")
    if not isinstance(model_name, str) or not model_name:
        raise BadRequest("'model_name' must be a non-empty string")
    if version is not None and (type(version) is not int or version < 1):
        raise BadRequest(f"'version' must be a positive integer (a version number), not {_shown(version)}")
    return model_name, version


def _shown(value: object) -> str:
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "an object"
    return clip(orjson.dumps(value).decode())  # a scalar: 1e+23 for a number too large to be an integer here


def _predict_value(array: np.ndarray) -> np.ndarray | list | float | int | bool | str:
    """An output as /predict writes it; one of no dimensions as its value (orjson writes
    no 0-d array)."""
    if array.ndim:
        return _finite_or_words(array)
    value = _finite_or_words(array.reshape(1))
    return value[0] if isinstance(value, list) else value.tolist()[0]


def _is_scalar(value: object) -> bool:
    return isinstance(value, int | float | str)  # bool is an int


def decode_predict(document: dict, io: ModelIO) -> Decoded:
    """`inputs`: one row or a list of rows (single-input model), else a dict by input name;
    an input of no dimensions is its value."""
    given = document.get("inputs")
    if len(io.inputs) == 1 and (isinstance(given, list) or (io.inputs[0].shape == () and _is_scalar(given))):
        given = {io.inputs[0].name: given}
    if not isinstance(given, dict):
        raise BadRequest("'inputs' must be a list of rows (single-input model) or an object by input name")
    unknown = [name for name in given if name not in io.specs]
    if unknown:
        raise BadRequest(f"input '{clip(sorted(unknown)[0])}': the model has no such input")
    arrays = [_predict_array(spec, given.get(spec.name), io) for spec in io.inputs]
    single = {is_single for _, is_single in arrays}
    if len(single) != 1:
        raise BadRequest("inputs mix a single row with lists of rows")
    tensors = tuple(array for array, _ in arrays)
    rows = rows_of(tensors, io)
    if io.shared_dims:
        check_shared_dims(tensors, io)
    return Decoded(tensors, rows, io.json_outputs, is_single_row=single.pop())


def _predict_array(spec: TensorSpec, data: object, io: ModelIO) -> tuple[np.ndarray, bool]:
    if data is None:
        raise BadRequest(f"input '{spec.name}': missing")
    if data == []:  # read as one row of no values, it was refused for the row's width
        raise BadRequest(f"input '{spec.name}': no rows (an empty list)")
    if spec.shape == () and _is_scalar(data):
        return array_from_list(spec, [data]).reshape(()), False
    array = array_from_list(spec, data)
    is_single_row = io.is_batchable and array.ndim == len(spec.shape) - 1
    if is_single_row:
        array = array[np.newaxis]
    check_shape(spec, array.shape, io)
    return array, is_single_row


def encode_predict(request_id: str, model_name: str, version: int, decoded: Decoded, outputs, io: ModelIO, latency_ms: float) -> bytes:
    by_name = {}
    for spec, array in zip(io.outputs, outputs):
        array = c_ordered(array[0] if decoded.is_single_row else array)
        by_name[spec.name] = orjson.Fragment(_sliced_json(array)) if array.size > SLICE_ITEMS else _predict_value(array)
    return dumps({
        "request_id": request_id, "model_name": model_name, "model_version": version,
        "outputs": by_name, "latency_ms": round(latency_ms, 3),
    })
