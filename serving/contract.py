"""The messages between the console and its serving workers, typed once, for both sides.

The console builds desired states here and parses workers' acks and reports here; a
worker parses desired states here and builds its acks and reports here. Nothing else
spells out these shapes, the channel group, the push's message type or the batching
defaults. Standard library only: the worker imports it without Django.

Versioning: every message carries ``contract`` (CONTRACT_VERSION), and the console
covers it by the state's digest and signature. A receiver refuses a message of another
version, or of none, whole, naming both versions: fields are never guessed across
versions. Any change to a shape here bumps CONTRACT_VERSION, except a new optional field
whose absence means what it meant before (a report's ``state``): both sides of a rolling
upgrade then still understand each other, since unknown fields are ignored. A worker that refuses a
state says so in its ack and keeps serving what it has; the console answers an ack or a
report of another version with a 400.

Parsing is strict, raises only ContractError, and names the offending field by its
path (``models.iris.routes[1].sha256: must be 64 lowercase hex characters``). Unknown
fields are ignored. A report's figures have limits (``MAX_*``): a list or object past
its limit is refused by its length, before any item of it is read. The worker's own
checks (artifact URLs on the console's origin) stay with the worker, in
``serving/repository.py``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

CONTRACT_VERSION = 2  # 2: a report's version figures are parsed strictly, with outputs and shadow deltas
SERVING_GROUP = "serving"  # the channel-layer group desired states are pushed to
WORKER_KEY_HEADER = "X-Worker-Key"  # a worker's own key, with each report and ack (registry/fleet/worker_keys.py)
APPLY_MESSAGE = "serving.apply"  # a push: {"type": APPLY_MESSAGE, "state": <signed desired state>}

# Batching when neither the model nor the settings (SERVING_MAX_*) say otherwise.
DEFAULT_MAX_BATCH_SIZE = 32
# The most a model's own max_batch_size may be (registry/models.py), and so the default's:
# a worker runs every size up to it before a version is routed.
MAX_BATCH_SIZE = 1024
DEFAULT_MAX_QUEUE_DELAY_S = 0.002
# The longest a model's own max_queue_delay_s may be (registry/models.py), and so the
# default's: a batch that waits longer for company leaves its first request little of
# its deadline, and with the default timeout (10 s) a delay past it timed every one out.
MAX_QUEUE_DELAY_S = 1.0
DEFAULT_MAX_QUEUE_SIZE = 4096

HEX64 = re.compile(r"[0-9a-f]{64}")
# A report's ``state``: serving; draining (stopping gracefully: not ready, still answering
# what it accepted); stopped (its last report: it answered everything and exits).
WORKER_STATES = ("serving", "draining", "stopped")
SHOWN_CHARS = 40

# A report's figures are read by the console's canary analysis, and a worker's report may
# be hostile or wrong: every list and object in them has a limit, checked before it is walked.
MAX_REPORTED_VERSIONS = 64  # version entries per report
MAX_REPORTED_OUTPUTS = 16  # output summaries per version entry
MAX_BUCKETS = 32  # entries of a histogram (latency, batch size)
MAX_CLASSES = 256  # counts of a classes summary
MAX_SAMPLE = 256  # values in a values summary's sample
MAX_NAME_CHARS = 200  # a model or output name
MAX_MODEL_DIGESTS = 1024  # model digests in a report
# Versions a report says are loaded: per model its routed ones, its warm rollback target
# and its shadows. Unbounded, 66,000 entries took the console 3.8 s a report.
MAX_LOADED = 4 * MAX_MODEL_DIGESTS
MODEL_NAME = re.compile(r"[-a-zA-Z0-9_]{1,100}")
MAX_COUNT = 2**63 - 1  # any count: what the console's 64-bit columns hold
BUCKET_BOUND = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
# A histogram bound's size: seconds of latency or rows of a batch, both far below it. A
# bound of 9e307 seconds read as Infinity once in milliseconds: the charts' API answered
# 500 and every rollout verdict failed to save, jamming the analysis.
MAX_BUCKET_BOUND = 1e6


def is_hex64(value: object) -> bool:
    """A sha256 as the contract writes it: exactly 64 lowercase hex characters."""
    return isinstance(value, str) and HEX64.fullmatch(value) is not None


class ContractError(ValueError):
    """A message that does not follow this contract; ``path`` names the field."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def check_version(message: Mapping, path: str = "contract") -> None:
    """Checked before any other field: a message of another version may have any shape."""
    found = message.get("contract")
    if found is None:
        raise ContractError(path, f"missing: this side speaks contract {CONTRACT_VERSION}, the message names none")
    if type(found) is not int or found != CONTRACT_VERSION:
        raise ContractError(path, f"the message speaks contract {_shown(found)}, this side speaks contract {CONTRACT_VERSION}")


def _shown(value: object) -> str:
    """The sender's value, quoted short: an error never echoes much of what it refuses."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


# ---- field readers: each checks one value and names its path when it refuses ----------


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _object(value: object, path: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ContractError(path or "message", "must be an object")
    return value


def _list(value: object, path: str) -> list:
    if not isinstance(value, list):
        raise ContractError(path, "must be a list")
    return value


def _int(value: object, path: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if type(value) is not int:  # bool is an int to Python, never to the contract
        raise ContractError(path, "must be an integer")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise ContractError(path, f"must be an integer {bounds}")
    return value


def _number(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _is_finite(value):
        raise ContractError(path, "must be a finite number")
    return value  # kept as sent (an int stays an int), so a re-encoding digests the same


def _is_finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past a float's range (JSON has no limit on digits)
        return False


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ContractError(path, "must be a string")
    if not value.isascii() and not _encodable(value):
        # JSON may escape a lone surrogate; PostgreSQL refused the row (a 500) and SQLite
        # stored one that failed every later answer naming it.
        raise ContractError(path, "must be text (no lone surrogates)")
    return value


# Shown on the Workers, Drills and model pages: ESC sequences and directional overrides
# (U+202E) from a worker token's holder were stored and shown as sent.
UNSEEN_RANGES = ((0x00, 0x08), (0x0B, 0x1F), (0x7F, 0x9F), (0x2028, 0x202E), (0x2066, 0x2069))  # tab and line feed left out
NOT_IN_A_LINE_RANGES = (*UNSEEN_RANGES, (0x09, 0x0A))  # and a tab or a line feed: one line a person reads
UNSEEN_CHARACTERS = re.compile("[" + "".join(f"{chr(low)}-{chr(high)}" for low, high in UNSEEN_RANGES) + "]")
NOT_IN_A_LINE = re.compile("[" + "".join(f"{chr(low)}-{chr(high)}" for low, high in NOT_IN_A_LINE_RANGES) + "]")


def _line(value: object, path: str) -> str:
    """One line a person reads (a host, a device, a URL): no control character, line
    separator or directional override; a tab or a line break neither."""
    if NOT_IN_A_LINE.search(_str(value, path)):
        raise ContractError(path, "must be one line of text without control characters or directional overrides")
    return value


def _shown_text(value: object, path: str) -> str:
    """A worker's own words (an error, of several lines): what a page would not show as
    sent becomes U+FFFD; lines and tabs stay (ONNX Runtime's messages have them)."""
    return UNSEEN_CHARACTERS.sub("\ufffd", _str(value, path))


def _encodable(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _worker_state(value: object, path: str) -> str:
    if value not in WORKER_STATES:
        raise ContractError(path, f"must be one of {', '.join(WORKER_STATES)}")
    return value


def _name(value: object, path: str) -> str:
    if not _line(value, path):
        raise ContractError(path, "must not be empty")
    return value


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ContractError(path, "must be true or false")
    return value


def _hex64(value: object, path: str) -> str:
    if not is_hex64(value):
        raise ContractError(path, "must be 64 lowercase hex characters")
    return value


def _required(message: Mapping, key: str, path: str, read: Callable[[object, str], Any]) -> Any:
    if key not in message:
        raise ContractError(_at(path, key), "missing")
    return read(message[key], _at(path, key))


def _optional(message: Mapping, key: str, path: str, read: Callable[[object, str], Any], default: Any = None) -> Any:
    """An absent or null field is ``default``."""
    value = message.get(key)
    return default if value is None else read(value, _at(path, key))


def _model_name(value: object, path: str) -> str:
    if not is_model_name(value):
        raise ContractError(path, "must be a model name (1 to 100 letters, digits, - or _)")
    return value


def is_model_name(value: object) -> bool:
    """A name the console can register (a slug, as ``registry.models.RegisteredModel.name``)."""
    return isinstance(value, str) and MODEL_NAME.fullmatch(value) is not None


def _model_digests(value: object, path: str) -> dict[str, str]:
    """model name → the digest of its entry as served (``serving.state_signing.model_digests``)."""
    digests = _object(value, path)
    if len(digests) > MAX_MODEL_DIGESTS:
        raise ContractError(path, f"at most {MAX_MODEL_DIGESTS} models")
    for name, digest in digests.items():
        if not is_model_name(name):
            raise ContractError(f"{path}[{_shown(name)}]", "must be a model name (letters, digits, - or _; at most 100)")
        _hex64(digest, _at(path, name))
    return dict(digests)


def _without_none(fields: dict) -> dict:
    return {key: value for key, value in fields.items() if value is not None}


# ---- the desired state -----------------------------------------------------------------


# The datatypes a worker decodes a request's input as (serving/engine.py, V2_TO_NUMPY).
# A model with an input of any other (BYTES, BF16) could never be served, and a worker
# cannot even warm it: it is refused at upload (registry/artifacts/inspection.py).
SERVABLE_INPUT_DATATYPES = frozenset({"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                                      "FP16", "FP32", "FP64"})
# The datatypes no worker answers: ONNX Runtime hands outputs over as NumPy arrays, and
# NumPy has no bfloat16 ("No corresponding Numpy type"). Refused at upload as well.
UNSERVABLE_OUTPUT_DATATYPES = frozenset({"BF16"})

@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How a version's requests are batched; the console sends one per model."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_queue_delay_s: float = DEFAULT_MAX_QUEUE_DELAY_S
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    latency_target_s: float | None = None  # per-model target; None = only the deadline

    def to_dict(self) -> dict:
        return {"max_batch_size": self.max_batch_size, "max_queue_delay_s": self.max_queue_delay_s,
                "max_queue_size": self.max_queue_size, "latency_target_s": self.latency_target_s}

    @classmethod
    def parse(cls, value: object, path: str = "batching", defaults: BatchPolicy | None = None) -> BatchPolicy:
        """A field left out (or null) takes ``defaults``' value: the receiving worker's
        own settings, so a hand-written state may give no batching at all."""
        batching, defaults = _object(value, path), defaults or cls()
        policy = cls(
            max_batch_size=_optional(batching, "max_batch_size", path, _int, defaults.max_batch_size),
            max_queue_delay_s=_optional(batching, "max_queue_delay_s", path, _number, defaults.max_queue_delay_s),
            max_queue_size=_optional(batching, "max_queue_size", path, _int, defaults.max_queue_size),
            latency_target_s=_optional(batching, "latency_target_s", path, _number),
        )
        if policy.max_batch_size < 1:
            raise ContractError(_at(path, "max_batch_size"), "must be at least 1")
        if policy.max_queue_size < 1:
            raise ContractError(_at(path, "max_queue_size"), "must be at least 1")
        if policy.max_queue_delay_s < 0:
            raise ContractError(_at(path, "max_queue_delay_s"), "must not be negative")
        if policy.latency_target_s is not None and policy.latency_target_s <= 0:
            raise ContractError(_at(path, "latency_target_s"), "must be positive (or null: no target)")
        return policy


def _signature(value: object, path: str) -> dict:
    return dict(_object(value, path))


def _fraction(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ContractError(path, "must be a fraction in (0, 1]")
    return value


@dataclass(frozen=True, slots=True)
class Route:
    """A version taking ``weight`` percent of the model's traffic, or, with ``shadow``,
    a fraction of it mirrored after the answer."""

    version: int
    weight: int
    sha256: str
    artifact_url: str
    signature: dict = field(default_factory=dict)  # the version's signature (contract 0 in docs/architecture.md)
    shadow: float | None = None

    def to_dict(self) -> dict:
        return _without_none({"version": self.version, "weight": self.weight, "shadow": self.shadow, "sha256": self.sha256,
                              "artifact_url": self.artifact_url, "signature": self.signature})

    @classmethod
    def parse(cls, value: object, path: str) -> Route:
        route = _object(value, path)
        return cls(
            version=_required(route, "version", path, lambda v, p: _int(v, p, minimum=1)),
            weight=_required(route, "weight", path, lambda v, p: _int(v, p, minimum=0, maximum=100)),
            sha256=_required(route, "sha256", path, _hex64),
            artifact_url=_required(route, "artifact_url", path, _name),
            signature=_optional(route, "signature", path, _signature, {}),
            shadow=_optional(route, "shadow", path, _fraction),
        )


@dataclass(frozen=True, slots=True)
class WarmVersion:
    """A version kept loaded but unrouted (the rollback target), so a rollback is only a
    swap. A hand-written state may give just its number (no ``sha256``): kept if this
    worker has it loaded, never fetched."""

    version: int
    sha256: str | None = None
    artifact_url: str | None = None
    signature: dict = field(default_factory=dict)

    @property
    def is_fetchable(self) -> bool:
        return self.sha256 is not None

    def to_dict(self) -> dict | int:
        if not self.is_fetchable:
            return self.version
        return {"version": self.version, "sha256": self.sha256, "artifact_url": self.artifact_url, "signature": self.signature}

    @classmethod
    def parse(cls, value: object, path: str) -> WarmVersion:
        if type(value) is int:
            return cls(_int(value, path, minimum=1))
        if not isinstance(value, Mapping):
            raise ContractError(path, "must be a version number or a version object")
        return cls(
            version=_required(value, "version", path, lambda v, p: _int(v, p, minimum=1)),
            sha256=_required(value, "sha256", path, _hex64),
            artifact_url=_required(value, "artifact_url", path, _name),
            signature=_optional(value, "signature", path, _signature, {}),
        )


@dataclass(frozen=True, slots=True)
class ModelState:
    """One model's part of the desired state."""

    routes: tuple[Route, ...]
    warm: tuple[WarmVersion, ...] = ()
    # None (left out): the receiving worker's own settings. The console always sends
    # one; a parsed state always has one.
    batching: BatchPolicy | None = None
    generation: int | None = None  # the generation of the release it comes from

    def to_dict(self) -> dict:
        return _without_none({"generation": self.generation, "routes": [route.to_dict() for route in self.routes],
                              "warm": [entry.to_dict() for entry in self.warm],
                              "batching": None if self.batching is None else self.batching.to_dict()})

    @classmethod
    def parse(cls, value: object, path: str, batching_defaults: BatchPolicy | None = None) -> ModelState:
        model = _object(value, path)
        routes = tuple(Route.parse(item, f"{path}.routes[{index}]")
                       for index, item in enumerate(_required(model, "routes", path, _list)))
        seen: set[int] = set()
        for index, route in enumerate(routes):
            if route.version in seen:
                raise ContractError(f"{path}.routes[{index}].version", f"version {route.version} is routed twice")
            seen.add(route.version)
        warm = tuple(WarmVersion.parse(item, f"{path}.warm[{index}]")
                     for index, item in enumerate(_optional(model, "warm", path, _list, [])))
        return cls(
            routes=routes,
            warm=warm,
            batching=_optional(model, "batching", path, lambda v, p: BatchPolicy.parse(v, p, batching_defaults),
                               batching_defaults or BatchPolicy()),
            generation=_optional(model, "generation", path, lambda v, p: _int(v, p, minimum=0)),
        )


@dataclass(frozen=True, slots=True)
class DesiredState:
    """The whole serving state at a generation, never a diff.

    ``digest`` is the sha256 of ``content()`` (``serving.state_signing``); a pushed
    state also carries ``signature``, which is the transport's, not the state's."""

    generation: int
    models: Mapping[str, ModelState]
    epoch: str | None = None  # the console database's; None in a hand-written state file
    digest: str | None = None
    contract: int = CONTRACT_VERSION

    def content(self) -> dict:
        """What the digest and the signature cover: everything but the digest."""
        return _without_none({"contract": self.contract, "generation": self.generation, "epoch": self.epoch,
                              "models": {name: model.to_dict() for name, model in self.models.items()}})

    def to_dict(self) -> dict:
        return _without_none({**self.content(), "digest": self.digest})

    @classmethod
    def parse(cls, value: object, *, batching_defaults: BatchPolicy | None = None) -> DesiredState:
        """``batching_defaults``: what a model's absent batching fields take (the worker's settings)."""
        state = _object(value, "state")
        check_version(state)
        generation = _required(state, "generation", "", lambda v, p: _int(v, p, minimum=0))
        epoch, digest = _optional(state, "epoch", "", _str), _optional(state, "digest", "", _hex64)
        models = {}
        for name, model in _required(state, "models", "", _object).items():
            if not isinstance(name, str) or not name:
                raise ContractError("models", "model names must be non-empty strings")
            models[name] = ModelState.parse(model, f"models.{name[:SHOWN_CHARS]}", batching_defaults)
        return cls(generation, models, epoch, digest, state["contract"])


# ---- what workers send back ------------------------------------------------------------

# How an ack's error begins when the state applied but for some models, each named before
# " (" (serving/repository.py): "applied but for a (keeps ...), b (...): <their errors>".
PARTLY_APPLIED = "applied but for "
_FAILING_MODEL = re.compile(r"([^\s,()]+) \(")


def models_not_applied(error: str) -> list[str] | None:
    """The models an ack's ``error`` names as not applied when the rest of the state was;
    None when the state did not apply (or the error is not of that form)."""
    if not error.startswith(PARTLY_APPLIED) or "): " not in error:
        return None
    return _FAILING_MODEL.findall(error[len(PARTLY_APPLIED):error.index("): ") + 1])


@dataclass(frozen=True, slots=True)
class Ack:
    """A worker applied a desired state (``ok``) or failed to (``error`` says why)."""

    worker: str
    generation: int
    digest: str  # of the state it applied or tried to
    ok: bool
    epoch: str | None = None
    error: str | None = None
    load_ms: float = 0.0
    contract: int = CONTRACT_VERSION

    def to_dict(self) -> dict:
        return _without_none({"worker": self.worker, "generation": self.generation, "digest": self.digest, "epoch": self.epoch,
                              "ok": self.ok, "error": self.error, "load_ms": self.load_ms, "contract": self.contract})

    @classmethod
    def parse(cls, value: object) -> Ack:
        ack = _object(value, "ack")
        check_version(ack)
        return cls(
            worker=_required(ack, "worker", "", _name),
            generation=_required(ack, "generation", "", lambda v, p: _int(v, p, minimum=0)),
            digest=_required(ack, "digest", "", _hex64),
            ok=_required(ack, "ok", "", _bool),
            epoch=_optional(ack, "epoch", "", _str),
            error=_optional(ack, "error", "", _shown_text),
            load_ms=_optional(ack, "load_ms", "", _number, 0.0),
            contract=ack["contract"],
        )


# The longest worker id the console keeps (registry.models.Worker.worker_id); a report or
# an ack under a longer one is refused (400).
MAX_WORKER_ID_CHARS = 100


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    id: str
    host: str = ""
    pid: int | None = None
    url: str = ""  # where it says it serves; the console shows it and never fetches it
    device: str = ""

    def to_dict(self) -> dict:
        return {"id": self.id, "host": self.host, "pid": self.pid, "url": self.url, "device": self.device}

    @classmethod
    def parse(cls, value: object, path: str = "worker") -> WorkerIdentity:
        identity = _object(value, path)
        return cls(
            id=_required(identity, "id", path, _name),
            host=_optional(identity, "host", path, _line, ""),
            pid=_optional(identity, "pid", path, lambda v, p: _int(v, p, minimum=0)),
            url=_optional(identity, "url", path, _line, ""),
            device=_optional(identity, "device", path, _line, ""),
        )


@dataclass(frozen=True, slots=True)
class LoadedEntry:
    """A version a worker has loaded: ``routed`` takes traffic, else warm or shadow."""

    model: str
    version: int
    routed: bool = False
    ready: bool = True

    def to_dict(self) -> dict:
        return {"model": self.model, "version": self.version, "routed": self.routed, "ready": self.ready}

    @classmethod
    def parse(cls, value: object, path: str) -> LoadedEntry:
        entry = _object(value, path)
        return cls(
            model=_required(entry, "model", path, _model_name),
            version=_required(entry, "version", path, lambda v, p: _int(v, p, minimum=1)),
            routed=_optional(entry, "routed", path, _bool, False),
            ready=_optional(entry, "ready", path, _bool, True),
        )


def _objects(value: object, path: str) -> tuple[dict, ...]:
    return tuple(dict(_object(item, f"{path}[{index}]")) for index, item in enumerate(_list(value, path)))


# ---- a report's figures per version ----------------------------------------------------


def _count(value: object, path: str) -> int:
    _int(value, path, minimum=0)
    if value > MAX_COUNT:
        raise ContractError(path, f"must be at most {MAX_COUNT}")
    return value


def _non_negative(value: object, path: str) -> float:
    if _number(value, path) < 0:
        raise ContractError(path, "must be a finite number >= 0")
    return value


def _short_name(value: object, path: str) -> str:
    if len(_name(value, path)) > MAX_NAME_CHARS:
        raise ContractError(path, f"must be at most {MAX_NAME_CHARS} characters")
    return value


def _bounded(value: object, path: str, limit: int) -> list:
    """A list of at most ``limit`` items, refused by its length before any item is read."""
    if len(_list(value, path)) > limit:
        raise ContractError(path, f"must have at most {limit} items")
    return value


def _buckets(value: object, path: str) -> dict[str, int]:
    """A histogram: at most MAX_BUCKETS bounds (decimal numbers, or "+Inf") to counts."""
    buckets = _object(value, path)
    if len(buckets) > MAX_BUCKETS:
        raise ContractError(path, f"must have at most {MAX_BUCKETS} entries")
    parsed = {}
    for bound, count in buckets.items():
        where = f"{path}[{_shown(bound)}]"
        if not (bound == "+Inf" or _is_bound(bound)):
            raise ContractError(where, 'a bound must be a finite decimal number or "+Inf"')
        if bound != "+Inf" and abs(float(bound)) > MAX_BUCKET_BOUND:
            raise ContractError(where, f"a bound must be within ±{MAX_BUCKET_BOUND:.0f}")
        parsed[bound] = _count(count, where)
    return parsed


def _is_bound(key: object) -> bool:
    return isinstance(key, str) and len(key) <= SHOWN_CHARS and BUCKET_BOUND.fullmatch(key) is not None and math.isfinite(float(key))


def _output_summary(value: object, path: str) -> dict:
    output = _object(value, path)
    name, kind = _required(output, "name", path, _short_name), _required(output, "kind", path, _str)
    if kind == "classes":
        counts = _required(output, "counts", path, lambda v, p: _bounded(v, p, MAX_CLASSES))
        return {"name": name, "kind": kind, "counts": [_count(item, f"{path}.counts[{index}]") for index, item in enumerate(counts)],
                "other": _optional(output, "other", path, _count, 0)}
    if kind == "values":
        count = _required(output, "count", path, _count)
        sample = _optional(output, "sample", path, lambda v, p: _bounded(v, p, MAX_SAMPLE), [])
        if len(sample) > count:
            raise ContractError(_at(path, "sample"), f"holds {len(sample)} values, more than the {count} counted")
        return {"name": name, "kind": kind, "count": count, "sum": _required(output, "sum", path, _number),
                "non_finite": _optional(output, "non_finite", path, _count, 0),
                "sample": [_number(item, f"{path}.sample[{index}]") for index, item in enumerate(sample)]}
    raise ContractError(_at(path, "kind"), 'must be "classes" or "values"')


def _output_summaries(value: object, path: str) -> list[dict]:
    outputs = [_output_summary(item, f"{path}[{index}]") for index, item in enumerate(_bounded(value, path, MAX_REPORTED_OUTPUTS))]
    seen: set[str] = set()
    for index, output in enumerate(outputs):
        if output["name"] in seen:
            raise ContractError(f"{path}[{index}].name", f"output {_shown(output['name'])} is summarised twice")
        seen.add(output["name"])
    return outputs


def _shadow_totals(value: object, path: str) -> tuple[dict, ...]:
    """A report's top-level shadow list: per mirrored version its cumulative counts, and
    nothing else (kept as sent, 64 entries of 38 kB each made one worker's row 2.4 MB)."""
    return tuple({"model": _required(entry, "model", f"{path}[{index}]", _model_name),
                  "version": _required(entry, "version", f"{path}[{index}]", lambda v, p: _int(v, p, minimum=1)),
                  **_shadow_delta(entry, f"{path}[{index}]")}
                 for index, entry in enumerate(_bounded(value, path, MAX_REPORTED_VERSIONS)))


def _shadow_delta(value: object, path: str) -> dict:
    shadow = _object(value, path)
    figures = {key: _required(shadow, key, path, _count) for key in ("compared", "agreed", "errors", "dropped")}
    if figures["agreed"] > figures["compared"]:
        raise ContractError(_at(path, "agreed"), "must not exceed compared")
    return figures


# The optional figures of a version entry: absent (or null) ones are left out, except
# the quantiles, whose null (no request in the interval) is kept. Any other key is ignored.
OPTIONAL_FIGURES: dict[str, Callable[[object, str], Any]] = {
    "ok": _count, "requests_per_s": _non_negative, "latency_sum_s": _non_negative, "latency_buckets": _buckets,
    "batch_size_buckets": _buckets, "p50_ms": _non_negative, "p99_ms": _non_negative, "queue_depth": _count,
    "outputs": _output_summaries, "shadow": _shadow_delta,
}
NULLABLE_FIGURES = {"p50_ms", "p99_ms"}


def _version_figures(value: object, path: str) -> dict:
    entry = _object(value, path)
    figures = {
        "model": _required(entry, "model", path, _short_name),
        "version": _required(entry, "version", path, lambda v, p: _int(v, p, minimum=1)),
        "requests": _required(entry, "requests", path, _count),
        "errors": _optional(entry, "errors", path, _count, 0),
        "client_errors": _optional(entry, "client_errors", path, _count, 0),
    }
    answered = figures["requests"] - figures["errors"] - figures["client_errors"]
    if answered < 0:
        raise ContractError(_at(path, "errors"), "errors and client_errors must not exceed requests")
    for key, read in OPTIONAL_FIGURES.items():
        if entry.get(key) is not None:
            figures[key] = read(entry[key], _at(path, key))
        elif key in NULLABLE_FIGURES and key in entry:
            figures[key] = None
    if figures.get("ok", 0) > answered:
        raise ContractError(_at(path, "ok"), "ok, errors and client_errors must not exceed requests")
    return figures


def _version_entries(value: object, path: str) -> tuple[dict, ...]:
    entries = []
    seen: set[tuple[str, int]] = set()
    for index, item in enumerate(_bounded(value, path, MAX_REPORTED_VERSIONS)):
        figures = _version_figures(item, f"{path}[{index}]")
        key = (figures["model"], figures["version"])
        if key in seen:
            raise ContractError(f"{path}[{index}]", f"model {_shown(key[0])} version {key[1]} is reported twice")
        seen.add(key)
        entries.append(figures)
    return tuple(entries)


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """About once a second: who the worker is, what it serves (``generation``, ``digest``
    and ``epoch`` of the state applied; null before any), what it has loaded, and its
    figures since the previous report.

    ``versions`` (at most MAX_REPORTED_VERSIONS, one per (model, version)) are parsed
    strictly, since the console's canary analysis reads them, and hold the validated
    values only (other keys are ignored). Each entry, all figures since the previous
    report:

    - ``model`` (a name), ``version`` (>= 1), ``requests`` answered; ``errors`` (5xx)
      and ``client_errors`` (4xx), 0 when absent, together at most ``requests``; ``ok``
      (2xx/3xx), at most what is left.
    - ``requests_per_s``, ``latency_sum_s`` (finite, >= 0), ``p50_ms``/``p99_ms``
      (finite >= 0, or null: no request), ``queue_depth`` (now, not a delta).
    - ``latency_buckets``, ``batch_size_buckets``: Prometheus histogram deltas, at most
      MAX_BUCKETS bounds (decimal strings within ±MAX_BUCKET_BOUND, or "+Inf") to counts.
    - ``outputs`` (at most MAX_REPORTED_OUTPUTS, names unique; empty or absent: no batch
      ran): what the version answered (``serving.output_summary``), either
      ``{name, kind: "classes", counts: [count of class i], other}`` (at most
      MAX_CLASSES counts; ``other``: labels outside them) or ``{name, kind: "values",
      count, sum, non_finite, sample}`` (``count``/``sum`` over finite elements,
      ``sample`` a uniform sample of at most MAX_SAMPLE of them).
    - ``shadow``, on the entry of a version mirrored to now (or compared since the
      previous report): ``{compared, agreed, errors, dropped}`` since the previous
      report, ``agreed`` at most ``compared``.

    Every count is an integer 0..MAX_COUNT, ``requests_failed_total`` and
    ``device_memory_bytes`` too (unbounded, a total of 10**20 was kept on SQLite as
    7766279631452241920 and a drill counted that). The top-level ``shadow`` list (per
    shadow version: compared, agreed, errors, dropped since the worker started) is kept
    as sent. ``state`` is one of WORKER_STATES; absent (a worker before it), "serving".
    ``models`` (at most MAX_MODEL_DIGESTS): each model's digest as served
    (``serving.state_signing.model_digests``), so a state served but for some models
    proves the others; absent or null (a worker before it): nothing proved by model."""

    worker: WorkerIdentity
    generation: int | None = None
    digest: str | None = None
    epoch: str | None = None
    models: Mapping[str, str] | None = None
    loaded: tuple[LoadedEntry, ...] = ()
    interval_s: float | None = None
    versions: tuple[dict, ...] = ()
    # 5xx answers since the worker started, and connections refused with a 503 before a
    # request was read (drills count them; older workers counted the answers alone).
    requests_failed_total: int | None = None
    shadow: tuple[dict, ...] = ()
    device_memory_bytes: int | None = None
    state: str = "serving"
    contract: int = CONTRACT_VERSION

    def to_dict(self) -> dict:
        return {"worker": self.worker.to_dict(), "generation": self.generation, "digest": self.digest, "epoch": self.epoch,
                "models": None if self.models is None else dict(self.models), "loaded": [entry.to_dict() for entry in self.loaded],
                "interval_s": self.interval_s, "versions": list(self.versions),
                "requests_failed_total": self.requests_failed_total, "shadow": list(self.shadow),
                "device_memory_bytes": self.device_memory_bytes, "state": self.state, "contract": self.contract}

    @classmethod
    def parse(cls, value: object) -> WorkerReport:
        report = _object(value, "report")
        check_version(report)
        return cls(
            worker=_required(report, "worker", "", WorkerIdentity.parse),
            generation=_optional(report, "generation", "", lambda v, p: _int(v, p, minimum=0)),
            digest=_optional(report, "digest", "", _hex64),
            epoch=_optional(report, "epoch", "", _str),
            models=_optional(report, "models", "", _model_digests),
            loaded=tuple(LoadedEntry.parse(item, f"loaded[{index}]")
                         for index, item in enumerate(_optional(report, "loaded", "", lambda v, p: _bounded(v, p, MAX_LOADED), []))),
            interval_s=_optional(report, "interval_s", "", _number),
            versions=_optional(report, "versions", "", _version_entries, ()),
            requests_failed_total=_optional(report, "requests_failed_total", "", _count),
            shadow=_optional(report, "shadow", "", _shadow_totals, ()),
            device_memory_bytes=_optional(report, "device_memory_bytes", "", _count),
            state=_optional(report, "state", "", _worker_state, "serving"),
            contract=report["contract"],
        )


def quantile_ms(cumulative: Mapping[str, float], q: float) -> float | None:
    """Quantile ``q`` (ms) of a report's cumulative latency histogram (bounds in seconds as
    strings, ``"+Inf"`` last): how a worker's report states its p50/p99 and how the
    console's charts restate them from the stored buckets, so a chart and a live table
    agree. Read inside its bucket (``histogram_quantile``): the bucket's upper bound alone
    made a p99 that moved from 4.1 to 4.2 ms read as a step from 4 to 8 ms."""
    seconds = histogram_quantile(cumulative, q)
    return None if seconds is None else round(seconds * 1000, 3)


def histogram_quantile(cumulative: Mapping[str, float], q: float) -> float | None:
    """Quantile ``q`` of a cumulative histogram ``{"<upper bound>": count ≤ bound, …}``, in
    the bounds' unit, read as Prometheus' ``histogram_quantile`` reads one: the bucket
    holding rank ``q`` × total, linearly inside it (the first from 0); in the +Inf bucket,
    the highest finite bound. Counts that dip (reports summed unevenly) are raised to their
    running maximum first, as Prometheus does. None when nothing was counted."""
    ordered = sorted((float(bound), count) for bound, count in cumulative.items())
    counts = list(itertools.accumulate((count for _, count in ordered), max))
    total = counts[-1] if counts else 0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0
    for (bound, _), count in zip(ordered, counts):
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below or bound <= 0:  # an empty bucket holds nothing to spread over; none lies below 0
                return lower if count == below else bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return None
    rank, lower, below = q * total, 0.0, 0
    for (bound, _), count in zip(ordered, counts):
        if count >= rank:
            if math.isinf(bound):
                return round(lower * 1000, 3)
            inside = count - below
            share = (rank - below) / inside if inside > 0 else 1.0
            return round((lower + (bound - lower) * share) * 1000, 3)
        lower, below = bound, count
    return None
