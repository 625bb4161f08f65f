"""The import rules of docs/architecture.md ("Layers, and who imports whom"), read from the
source by tools/import_graph.py: a rule broken here is a layer that leaks."""

from __future__ import annotations

import sys

import pytest

from tools.import_graph import ROOT, graph, imported_names, project_modules

# The worker's layers, top to bottom: none may import one above it.
WORKER_LAYERS = ("serving.endpoints", "serving.dataplane", "serving.repository", "serving.loaded_version",
                 "serving.batcher", "serving.dispatch", "serving.engine")
REGISTRY_MAY_USE_FROM_SERVING = {"serving.contract", "serving.state_signing", "serving.model_safety", "serving.jobs.formats", "serving.jobs.labels",
                                 "serving.env", "serving.spreadsheet_cells"}


def top(name: str) -> str:
    return name.split(".")[0]


def serving_core_modules() -> dict:
    return {name: path for name, path in project_modules().items()
            if top(name) == "serving" and not name.startswith("serving.management")}


def test_the_serving_core_imports_no_django_registry_or_console():
    forbidden = {"django", "rest_framework", "registry", "console"}
    leaks = {name: sorted(target for target in imported_names(path) if top(target) in forbidden)
             for name, path in serving_core_modules().items()}
    assert {name: found for name, found in leaks.items() if found} == {}


def test_the_contract_imports_only_the_standard_library():
    path = ROOT / "serving" / "contract.py"
    outside = {name for name in imported_names(path) if top(name) not in sys.stdlib_module_names and name != "__future__"}
    assert outside == set()


def test_the_registry_uses_only_the_shared_checks_of_the_serving_package():
    used = {target for name, targets in graph().items() if top(name) == "registry" for target in targets if top(target) == "serving"}
    assert used <= REGISTRY_MAY_USE_FROM_SERVING, used - REGISTRY_MAY_USE_FROM_SERVING


def test_nothing_outside_the_console_imports_it():
    importers = {name for name, targets in graph().items() if top(name) != "console" and any(top(t) == "console" for t in targets)}
    assert importers == set()


@pytest.mark.parametrize("index", range(len(WORKER_LAYERS)), ids=WORKER_LAYERS)
def test_no_worker_layer_imports_a_layer_above_it(index):
    above = set(WORKER_LAYERS[:index])
    assert graph()[WORKER_LAYERS[index]] & above == set()


def test_benchmarks_import_nothing_from_the_tests():
    paths = sorted((ROOT / "bench").glob("*.py"))
    assert paths  # a glob that finds nothing would pass
    for path in paths:
        assert {name for name in imported_names(path) if top(name) == "tests"} == set(), path.name
