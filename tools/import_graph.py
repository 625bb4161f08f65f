"""Which project module imports which, read from the source (no imports are executed).

    .venv/bin/python -m tools.import_graph                # edges between the parts
    .venv/bin/python -m tools.import_graph serving        # edges inside one package

The layering this shows is checked by tests/test_layering.py.
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("console", "registry", "serving")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, known: set[str] = frozenset()) -> set[str]:
    """Every module the file imports, lazy and type-checking imports included: for
    ``from a import b`` that is ``a.b`` when it is one of the ``known`` modules, else ``a``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module)
    return found


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules the file imports."""
    return imported_names(path, known) & known


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for part in PARTS for path in sorted((ROOT / part).rglob("*.py"))
            if "migrations" not in path.parts}


def graph() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    modules = project_modules()
    return {name: imported_modules(path, set(modules)) - {name} for name, path in modules.items()}


def collapse(name: str, depth: int) -> str:
    return ".".join(name.split(".")[:depth])


def edges(scope: str | None) -> dict[str, set[str]]:
    """Edges between parts (scope None) or between the modules of one package."""
    result: dict[str, set[str]] = defaultdict(set)
    for source, targets in graph().items():
        for target in targets:
            if scope is None:
                a, b = collapse(source, 2), collapse(target, 2)
                if a.split(".")[0] != b.split(".")[0]:
                    result[a].add(b)
            elif source.startswith(scope + ".") and target.startswith(scope + "."):
                result[source].add(target)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scope", nargs="?", help="a package (serving, registry, console); default: between the parts")
    args = parser.parse_args()
    for source, targets in sorted(edges(args.scope).items()):
        print(f"{source:40} → {', '.join(sorted(targets))}")


if __name__ == "__main__":
    main()
