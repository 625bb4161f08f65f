"""The README's settings tables and the code agree: every variable the code reads is
documented, and every documented variable is read by something.

The code is read, not run: every call that reads the environment by a literal name
(``env_*("NAME", …)``, ``_secret("NAME", …)``, ``os.environ.get("NAME")``,
``os.environ["NAME"]``, ``os.getenv("NAME")``, ``"NAME" in os.environ``) in console/,
serving/, registry/ and manage.py. A read by a computed name is allowed only where it
is listed below, with the names it can read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import serving.env as serving_env

REPO_ROOT = Path(__file__).resolve().parents[1]
SCANNED = [REPO_ROOT / "console", REPO_ROOT / "serving", REPO_ROOT / "registry", REPO_ROOT / "manage.py"]

# Helpers whose first argument is the name of the variable they read: every env_* of
# serving/env.py, found there (env_url, missed from a list written here, hid CONSOLE_URL).
NAME_READERS = {name for name in vars(serving_env) if name.startswith("env_")} | {"_secret"}
ENVIRON_METHODS = {"get", "setdefault", "pop"}

# Reads by a computed name: the file, and the names it can read.
COMPUTED_NAME_READS = {
    "serving/env.py": set(),  # the helpers themselves: NAME and NAME_FILE of their caller's literal name
    "console/settings.py": set(),  # _secret(name, …) hands its caller's literal name (collected above) to env_secret
    "registry/artifacts/inspection.py": {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "TZ"},  # CHILD_INHERITED_VARIABLES
    # INHERITED, and every SERVING_* setting (documented with the worker's) but the token
    "registry/jobs/child.py": {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "TZ", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"},
}

# Read by the code but not settings of this project, each with why.
NOT_SETTINGS = {
    "DJANGO_SETTINGS_MODULE": "Django's own switch; manage.py, asgi.py, wsgi.py and celery.py default it to console.settings",
    "PATH": "passed through unchanged to the upload-inspection child so it can run",
    "LANG": "locale, passed through unchanged to the upload-inspection child",
    "LC_ALL": "locale, passed through unchanged to the upload-inspection child",
    "LC_CTYPE": "locale, passed through unchanged to the upload-inspection child",
    "LD_LIBRARY_PATH": "library search path, passed through unchanged to the upload-inspection child",
    "TZ": "time zone, passed through unchanged to the upload-inspection child",
    "CUDA_VISIBLE_DEVICES": "CUDA's own device selection, passed through unchanged to a job's child process",
    "NVIDIA_VISIBLE_DEVICES": "the NVIDIA container runtime's device selection, passed through unchanged to a job's child process",
}

# Documented settings read by code outside the scanned directories, and the file that reads them.
READ_ELSEWHERE = {"AUDIT_REQUIRED": "tools/audit_requirements.py"}

ROW = re.compile(r"^\|\s*`([A-Z][A-Z0-9_]*)`\s*\|")


def documented_names() -> set[str]:
    """First-column names of every table row in the README's "## Settings" section."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    return {match.group(1) for line in section.splitlines() if (match := ROW.match(line))}


def _is_os_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _read_name(node: ast.AST) -> tuple[bool, ast.AST | None]:
    """(whether ``node`` reads the environment by name, the expression naming the variable)."""
    if isinstance(node, ast.Call):
        func = node.func
        first = node.args[0] if node.args else None
        if isinstance(func, ast.Name) and func.id in NAME_READERS:
            return True, first
        if isinstance(func, ast.Attribute) and func.attr in ENVIRON_METHODS and _is_os_environ(func.value):
            return True, first
        if isinstance(func, ast.Attribute) and func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os":
            return True, first
    if isinstance(node, ast.Subscript) and _is_os_environ(node.value):
        return True, node.slice
    if isinstance(node, ast.Compare) and any(_is_os_environ(c) for c in node.comparators) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
        return True, node.left
    return False, None


def _python_files():
    for root in SCANNED:
        yield from ([root] if root.is_file() else sorted(root.rglob("*.py")))


def code_reads() -> tuple[set[str], dict[str, int]]:
    """(names read by literal, {file: count of reads by a computed name})."""
    names: set[str] = set()
    computed: dict[str, int] = {}
    for path in _python_files():
        relative = path.relative_to(REPO_ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=relative)):
            is_read, name_node = _read_name(node)
            if not is_read:
                continue
            name = _literal(name_node)
            if name is None:
                computed[relative] = computed.get(relative, 0) + 1
            else:
                names.add(name)
    for relative in computed:
        names |= COMPUTED_NAME_READS.get(relative, set())
    return names, computed


def test_environment_reads_by_a_computed_name_happen_only_where_listed():
    _, computed = code_reads()

    assert set(computed) <= set(COMPUTED_NAME_READS), f"reads by a computed name outside the listed files: {sorted(set(computed) - set(COMPUTED_NAME_READS))}"


def test_every_setting_the_code_reads_is_documented_and_every_documented_one_is_read():
    read, _ = code_reads()
    documented = documented_names()
    settings_read = (read - set(NOT_SETTINGS)) | set(READ_ELSEWHERE)

    undocumented = sorted(settings_read - documented)
    never_read = sorted(documented - settings_read)
    assert (undocumented, never_read) == ([], []), f"read but not in the README's settings tables: {undocumented}; documented but never read: {never_read}"


def test_settings_read_outside_the_scanned_code_are_really_read_there():
    for name, relative in READ_ELSEWHERE.items():
        assert f'"{name}"' in (REPO_ROOT / relative).read_text(), f"{name} is not read by {relative}"


def test_names_listed_as_not_settings_are_read_and_not_documented():
    read, _ = code_reads()

    assert set(NOT_SETTINGS) <= read, f"listed as read but nothing reads: {sorted(set(NOT_SETTINGS) - read)}"
    assert not set(NOT_SETTINGS) & documented_names()
