"""What deployment files may name, read from the project itself.

Shared by the Compose checks here and the Kubernetes checks: a deployment file is right
only where it names what the code has (commands, settings, metrics), so these helpers
answer from the code, never from a list kept beside it.

- ``settings_read()``: every environment variable the project's code reads.
- ``command_problems(argv)``: why a container's command would not run here ([] if it would).
- ``metric_names(text)``: the family and sample names of a Prometheus exposition.
- ``promql_metric_names(expr)``: the metric names a PromQL expression selects.
- ``takes_console_http_options(argv)``: whether a console's command passes what ``make run`` passes."""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.test_settings_documented import READ_ELSEWHERE, code_reads

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHONS = {"python", "python3", "python3.11"}
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash"}
# Celery's default queue: a task with no route goes there, so it needs no route.
CELERY_DEFAULT_QUEUE = "celery"


def settings_read() -> set[str]:
    """Every environment variable name the project's code reads (settings or not)."""
    names, _ = code_reads()
    return names | set(READ_ELSEWHERE)


def command_problems(argv: list[str]) -> list[str]:
    """One string per reason ``argv`` would not run in this project's image; [] when it would.

    Knows the shapes deployment files use: ``sh -c "a && b"`` (each part checked),
    ``python manage.py CMD …`` (a command Django knows, its options parsed by the command's
    own parser), ``python -m MODULE …``, ``python -c CODE``, ``uvicorn`` / ``python -m
    uvicorn`` (its options parsed by uvicorn, the app importable) and ``celery -A APP …``
    (the app importable, its subcommand real, every queue it consumes routed in settings)."""
    if not argv:
        return ["empty command"]
    program, args = Path(argv[0]).name if argv[0].startswith("/") else argv[0], list(argv[1:])
    if program == "exec":
        return command_problems(args)
    if program in SHELLS:
        return _shell_problems(args)
    if program in PYTHONS:
        return _python_problems(args)
    if program == "uvicorn":
        return _uvicorn_problems(args)
    if program == "celery":
        return _celery_problems(args)
    return [f"{argv[0]!r} is not a program this project runs"]


def _shell_problems(args: list[str]) -> list[str]:
    if len(args) != 2 or args[0] != "-c":
        return [f"a shell is run only as sh -c 'SCRIPT', got {args!r}"]
    problems = []
    for part in re.split(r"&&|;|\|\|", args[1]):
        words = shlex.split(part)
        if not words:
            problems.append(f"an empty step in {args[1]!r}")
            continue
        problems += command_problems(words)
    return problems


def _python_problems(args: list[str]) -> list[str]:
    if not args:
        return ["python with no script: an interactive interpreter"]
    if args[0] == "manage.py":
        return _manage_problems(args[1:])
    if args[0] == "-m" and len(args) > 1:
        if args[1] == "uvicorn":
            return _uvicorn_problems(args[2:])
        if args[1] == "celery":
            return _celery_problems(args[2:])
        return [] if _module_exists(args[1]) else [f"no module {args[1]!r} to run with python -m"]
    if args[0] == "-c" and len(args) > 1:
        try:
            compile(args[1], "<python -c>", "exec")
        except SyntaxError as error:
            return [f"python -c code does not compile: {error}"]
        return []
    return [] if (REPO_ROOT / args[0]).is_file() else [f"no script {args[0]!r} in the project"]


def _manage_problems(args: list[str]) -> list[str]:
    from django.core.management import get_commands, load_command_class
    from django.core.management.base import CommandError

    if not args:
        return ["manage.py with no command"]
    commands = get_commands()
    name = args[0]
    if name not in commands:
        return [f"manage.py has no command {name!r}"]
    parser = load_command_class(commands[name], name).create_parser("manage.py", name)
    try:
        parser.parse_args(args[1:])
    except (CommandError, SystemExit) as error:
        return [f"manage.py {name} refuses its arguments {args[1:]!r}: {error}"]
    return []


def _uvicorn_problems(args: list[str]) -> list[str]:
    import click
    from uvicorn.main import main as uvicorn_command

    try:
        context = uvicorn_command.make_context("uvicorn", list(args), resilient_parsing=False)
    except click.ClickException as error:
        return [f"uvicorn refuses its arguments {args!r}: {error.format_message()}"]
    return _attribute_problems(context.params["app"])


def _attribute_problems(reference: str) -> list[str]:
    """``module:attribute`` names a module of the project that assigns that attribute."""
    module, _, attribute = reference.partition(":")
    spec = importlib.util.find_spec(module) if _module_exists(module) else None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return [f"no module {module!r} for {reference!r}"]
    tree = ast.parse(Path(spec.origin).read_text())
    assigned = {target.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(target, ast.Name)}
    assigned |= {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return [] if attribute in assigned else [f"{module} defines no {attribute!r}"]


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _celery_problems(args: list[str]) -> list[str]:
    app_name, rest = _option_value(args, "-A", "--app")
    if app_name is None:
        return ["celery without -A/--app: it would run the default, empty app"]
    problems = []
    module, _, attribute = app_name.partition(":")
    if not _module_exists(module):
        problems.append(f"no module {module!r} for celery -A {app_name}")
    elif not _module_exists(f"{module}.celery") and not attribute:
        problems.append(f"{module} has no celery module for celery -A {app_name}")
    if not rest or rest[0] not in {"worker", "beat"}:
        return [*problems, f"celery runs worker or beat here, got {rest[:1]!r}"]
    problems += _celery_options_problems(rest)
    queues, _ = _option_value(rest[1:], "-Q", "--queues")
    for queue in (queues or CELERY_DEFAULT_QUEUE).split(","):
        if queue not in routed_queues():
            problems.append(f"celery consumes queue {queue!r}, which no task is routed to (routed: {sorted(routed_queues())})")
    return problems


def _celery_options_problems(rest: list[str]) -> list[str]:
    import click
    from celery.bin.celery import celery as celery_command

    subcommand = celery_command.get_command(click.Context(celery_command), rest[0])
    try:
        subcommand.make_context(rest[0], list(rest[1:]), resilient_parsing=True)
    except click.ClickException as error:
        return [f"celery {rest[0]} refuses its arguments: {error.format_message()}"]
    known = {name for param in subcommand.params for name in (*param.opts, *param.secondary_opts)}
    unknown = [word.split("=", 1)[0] for word in rest[1:] if word.startswith("-") and word.split("=", 1)[0] not in known]
    return [f"celery {rest[0]} has no option {word}" for word in unknown]


def routed_queues() -> set[str]:
    """The default queue and every queue a task is routed to in the settings."""
    from django.conf import settings

    routes = getattr(settings, "CELERY_TASK_ROUTES", {}) or {}
    return {CELERY_DEFAULT_QUEUE} | {route["queue"] for route in routes.values() if "queue" in route}


def _option_value(args: list[str], *names: str) -> tuple[str | None, list[str]]:
    """(the value of the first of ``names`` in args, args without it)."""
    for index, word in enumerate(args):
        for name in names:
            if word == name and index + 1 < len(args):
                return args[index + 1], args[:index] + args[index + 2:]
            if word.startswith(f"{name}="):
                return word.split("=", 1)[1], args[:index] + args[index + 1:]
    return None, list(args)


def metric_names(exposition_text: str) -> set[str]:
    """Family names and sample names (``_total``, ``_bucket``, ``_sum``, ``_count``,
    ``_created``…) of a Prometheus text exposition."""
    names = set()
    for family in text_string_to_metric_families(exposition_text):
        names.add(family.name)
        names |= {sample.name for sample in family.samples}
    return names


# PromQL words that look like identifiers but name no metric.
PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
    "inf", "nan", "start", "end", "atan2",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-zA-Z_$]+")
_TEMPLATE_VARIABLE = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_:])(?:0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)")
_IDENTIFIER = re.compile(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects: identifiers that are neither functions nor
    aggregations (followed by ``(``), keywords, label names or values (inside ``{}`` or a
    ``by (…)`` list), durations or Grafana template variables (``$model``, ``$__rate_interval``)."""
    text = _STRING.sub(" ", expr)
    text = _TEMPLATE_VARIABLE.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name, is_call = match.group(1), match.group(2)
        if not is_call and name.lower() not in PROMQL_KEYWORDS:
            names.add(name)
    return names


# ---------------------------------------------------------------- Compose files

class MissingVariable(ValueError):
    """``${NAME:?message}`` (or ``${NAME?message}``) with NAME unset: compose refuses to start."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.name = name


_INTERPOLATION = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?+])?(?P<arg>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value, environment: dict[str, str]):
    """``value`` (a loaded YAML tree) with ``${…}`` replaced as Compose does: ``$$`` is a
    literal ``$``; ``${V:-d}`` / ``${V-d}`` default when unset (``:`` also when empty);
    ``${V:?m}`` / ``${V?m}`` raise MissingVariable; ``${V:+a}`` / ``${V+a}`` alternate.
    Mapping keys are left alone, as Compose leaves them."""
    if isinstance(value, dict):
        return {key: interpolate(item, environment) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, environment) for item in value]
    if not isinstance(value, str):
        return value
    return _INTERPOLATION.sub(lambda match: _substitute(match, environment), value)


def _substitute(match: re.Match, environment: dict[str, str]) -> str:
    if match.group("escaped"):
        return "$"
    if match.group("named"):
        return environment.get(match.group("named"), "")
    name, op, arg = match.group("braced"), match.group("op") or "", match.group("arg")
    current = environment.get(name)
    is_set = current is not None and (current != "" or not op.startswith(":"))
    if op.endswith("-"):
        return current if is_set else arg
    if op.endswith("?"):
        if not is_set:
            raise MissingVariable(name, arg or "required")
        return current
    if op.endswith("+"):
        return arg if is_set else ""
    return current or ""


def required_variables(text: str) -> set[str]:
    """Names compose refuses to start without (``${NAME:?…}`` / ``${NAME?…}``) in ``text``."""
    return {match.group("braced") for match in _INTERPOLATION.finditer(text) if (match.group("op") or "").endswith("?")}


def service_command(service: dict) -> list[str]:
    """A service's command as argv (a string is split the way Compose splits it)."""
    command = service.get("command")
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(word) for word in command]


def service_environment(service: dict) -> dict[str, str]:
    """A service's environment as a mapping (Compose accepts a list of NAME=value too)."""
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in environment)
    return {name: "" if value is None else str(value) for name, value in environment.items()}


def takes_console_http_options(argv: list[str]) -> bool:
    """Whether ``argv`` passes console.processes.CONSOLE_HTTP_OPTIONS, in a row, as make run does."""
    from console.processes import CONSOLE_HTTP_OPTIONS

    run = list(CONSOLE_HTTP_OPTIONS)
    if argv[:1] and argv[0] in SHELLS and "-c" in argv:  # a shell's script: its words
        argv = shlex.split(argv[argv.index("-c") + 1])
    return any(argv[start:start + len(run)] == run for start in range(len(argv)))
