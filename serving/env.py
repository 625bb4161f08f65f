"""The one way the project reads a setting from the environment (console and workers).

One rule everywhere: surrounding whitespace is stripped, and an empty value means "not
set", so the default applies (docker compose and ``.env`` files write ``NAME=`` for a
variable left unset). A value that is set but unusable raises ``SettingError``, whose
message names the variable, the value and what was expected: a typo in a deployment
stops the process at start instead of running on a default. Numbers are non-negative
unless a call says otherwise, and floats are finite. No Django here: workers import it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def settle_ort_telemetry() -> None:
    """ORT_DISABLE_TELEMETRY, read by ONNX Runtime itself when it loads: on unless set to a
    false word, written back as the 1 or 0 it reads. Empty is "not set", as for every
    setting; a value that is no true/false word is left for the settings' readers
    (console/settings.py, ServingConfig.from_env) to stop the process with, not an import."""
    try:
        os.environ["ORT_DISABLE_TELEMETRY"] = "1" if env_bool("ORT_DISABLE_TELEMETRY", True) else "0"
    except SettingError:
        pass  # stopped by the settings' readers, with the sentence


class SettingError(ValueError):
    """A variable in the environment has a value the process cannot use."""


def _raw(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def env_str(name: str, default: str = "") -> str:
    raw = _raw(name)
    return default if raw is None else raw


def env_path(name: str, default: Path) -> Path:
    """A filesystem path with a leading ``~`` or ``~user`` expanded, as a shell would
    (``default`` when unset): "~/x" was ./~/x for one process and $HOME/x for another."""
    raw = _raw(name)
    return default if raw is None else home_expanded(name, raw)


def home_expanded(name: str, value: str) -> Path:
    """``value`` with a leading ``~`` or ``~user`` expanded; one that names no home directory
    (no such user) is a SettingError naming ``name``, not pathlib's RuntimeError traceback."""
    try:
        return Path(value).expanduser()
    except RuntimeError:
        head = value.split("/", 1)[0]
        raise SettingError(f"{name}={value!r}: no home directory for {head!r}{' (no such user)' if head != '~' else ''}; "
                           "give an absolute path") from None


def env_url(name: str, default: str = "", example: str = "http://127.0.0.1:8000") -> str:
    """An http(s) URL with a host, without a trailing slash (``default`` when unset)."""
    raw = _raw(name)
    return default if raw is None else check_http_url(name, raw, example)


def check_http_url(name: str, value: str, example: str = "http://127.0.0.1:8000") -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingError(f"{name}={value!r}: expected an http:// or https:// URL with a host, e.g. {example}")
    return value.rstrip("/")


# Both of the project's Redis clients must take the URL: redis-py (the Channels layer, the
# workers' push channel) and kombu (Celery's broker). redis-py also takes unix://, which
# kombu does not ("No such transport: unix": every Celery process died at start).
REDIS_SCHEMES = ("redis", "rediss")
REDIS_EXPECTED = "expected a redis:// or rediss:// URL, e.g. redis://127.0.0.1:6379/0"


def env_redis_url(name: str) -> str:
    """A Redis URL from ``NAME_FILE`` or ``NAME`` ("" when unset). Unchecked, an http:// one
    passed until Celery's first send and redis-py's first connection, each with a traceback."""
    value = env_secret(name)
    return check_redis_url(name, value) if value else ""


def check_redis_url(name: str, value: str) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        parts.port  # raises ValueError for a port that is not a number or out of range
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in REDIS_SCHEMES:
        why = " (Celery's broker takes no unix:// socket)" if parts is not None and parts.scheme == "unix" else ""
        raise SettingError(f"{name}={shown_url(value)!r}: {REDIS_EXPECTED}{why}")
    if not re.fullmatch(r"/?[0-9]*", parts.path):  # kombu refused "/abc" where redis-py silently used database 0
        raise SettingError(f"{name}={shown_url(value)!r}: {REDIS_EXPECTED} (the path is the database number)")
    return value


def shown_url(url: str) -> str:
    """``url`` with its password, if it has one, as ``***``: fit for a message or a log line.
    Up to the last "@": a password may hold a "/" or "@" that was not percent-encoded."""
    url = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*:).*@", r"\1***@", url)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


def env_secret(name: str, default: str = "") -> str:
    """A secret from the file named by ``NAME_FILE`` (container secrets), else from ``NAME``."""
    path = _raw(f"{name}_FILE")
    if path is None:
        return env_str(name, default)
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise SettingError(f"{name}_FILE={path!r}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:  # a binary file named by mistake (a key in DER, an archive)
        raise SettingError(f"{name}_FILE={path!r}: not UTF-8 text (a secret there is one line of text)") from None
    return value or default


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(name, default).lower()
    if value not in choices:
        raise SettingError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value


def env_bool(name: str, default: bool = False) -> bool:
    raw = _raw(name)
    if raw is None:
        return default
    if raw.lower() in TRUE_WORDS:
        return True
    if raw.lower() in FALSE_WORDS:
        return False
    raise SettingError(f"{name}={raw!r}: expected true or false (one of {', '.join(TRUE_WORDS + FALSE_WORDS)})")


# Past these a number is nonsense that failed later, deep inside and with a traceback: a
# duration (a name ending in _S) past 100 years overflowed the console's datetime arithmetic
# (now - timedelta: every workers page), and an integer past 64 bits a C call (setrlimit).
MAX_SECONDS = 100 * 365 * 24 * 3600
MAX_INTEGER = 2**63 - 1


def _ceiling(name: str, maximum: float | None, otherwise: float | None) -> float | None:
    if maximum is not None:
        return maximum
    return MAX_SECONDS if name.endswith("_S") else otherwise


def env_int(name: str, default: int, *, minimum: int | None = 0, maximum: int | None = None) -> int:
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected an integer") from None
    _check_bounds(name, raw, value, minimum, _ceiling(name, maximum, MAX_INTEGER), "")
    return value


def env_float(name: str, default: float, *, minimum: float | None = 0.0, maximum: float | None = None) -> float:
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected a number") from None
    if not math.isfinite(value):
        raise SettingError(f"{name}={raw!r}: expected a finite number")
    _check_bounds(name, raw, value, minimum, _ceiling(name, maximum, None), "a finite number ")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Comma-separated; empty items are dropped."""
    raw = _raw(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def _check_bounds(name: str, raw: str, value: float, minimum: float | None, maximum: float | None, kind: str) -> None:
    if minimum is not None and value < minimum:
        raise SettingError(f"{name}={raw!r}: must be {kind}>= {minimum}")
    if maximum is not None and value > maximum:
        raise SettingError(f"{name}={raw!r}: must be {kind}<= {maximum}{' (100 years)' if maximum == MAX_SECONDS else ''}")


PORT_EXPECTED = "expected a port number from 1 to 65535"


def env_port(name: str, default: int) -> int:
    """A TCP port, 1-65535 (``default`` when unset)."""
    raw = _raw(name)
    if raw is None:
        return default
    port = _port(raw)
    if port is None:
        raise SettingError(f"{name}={raw!r}: {PORT_EXPECTED}")
    return port


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1-65535. Unchecked, 0 listened on a random port and
    70000 on 4464 (the kernel keeps 16 bits), each reported to the console as given."""
    port = _port(text)
    if port is None:
        raise argparse.ArgumentTypeError(f"{PORT_EXPECTED}, got {text!r}")
    return port


def _port(text: str) -> int | None:
    try:
        port = int(text)
    except ValueError:
        return None
    return port if 1 <= port <= 65535 else None

