"""`make mutation`: mutmut on each core module with that module's own tests only.

Coverage says a line ran; mutation testing says whether a test would notice the line
changing. Each module is mutated with only its own tests selected, so a module cannot
borrow strength from tests of other layers, and in a private copy of the tree, because
mutmut writes a `mutants/` folder and runs pytest inside it. Prints each module's score
and every surviving mutant with its diff; exits 1 when a module is under its target.

Too slow for CI (minutes per module); run it before closing a change to these modules.
The surviving mutants judged equivalent or harmless are listed in docs/testing.md.

    python tools/mutation.py                      # every module
    python tools/mutation.py serving/traffic_split.py    # one module
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    module: str
    tests: tuple[str, ...]
    target_percent: float


BATCHING_TESTS = ("tests/serving/test_serving_batcher.py", "tests/serving/test_serving_policy.py",
                  "tests/serving/test_serving_queue_pace.py")
TARGETS = (
    Target(
        "registry/actions/releases.py",
        (
            "tests/registry/test_api_releases.py", "tests/registry/test_releases_spec.py",
            "tests/registry/test_expected_generation.py", "tests/registry/test_concurrency.py",
        ),
        95.0,
    ),
    # The canary analysis: the statistics and the judge are pure, and judged by their own tests.
    Target("registry/domain/distribution_tests.py", ("tests/registry/test_distribution_tests.py",), 90.0),
    Target("registry/domain/canary_analysis.py", ("tests/registry/test_canary_analysis.py",), 90.0),
    Target("registry/actions/rollouts.py", ("tests/registry/test_rollouts.py", "tests/registry/test_api_rollouts.py"), 85.0),
    # Who may speak for a worker id (#9): the console's claim rule and the worker's own key.
    Target("registry/fleet/worker_keys.py", ("tests/registry/test_worker_keys.py",), 95.0),
    Target("serving/worker_key.py", ("tests/serving/test_serving_worker_key.py",), 80.0),
    # The worker's control plane: reconcile by digest, acks of what was applied (#9). Its Redis
    # listener, start/stop and report loops run only in the integration tests (real Redis and
    # console processes, not selectable here), so about half its mutants are out of reach.
    Target("serving/control.py", ("tests/serving/test_serving_control_recovery.py", "tests/serving/test_serving_control_security.py",
                                  "tests/serving/test_serving_control_timeout.py"), 50.0),
    # The state a worker persisted beside its artifacts and serves at start when the console cannot answer (#9).
    Target("serving/state_store.py", ("tests/serving/test_serving_state_store.py",), 85.0),
    Target("serving/traffic_split.py", ("tests/serving/test_serving_router.py", "tests/serving/test_serving_router_stickiness.py", "tests/serving/test_serving_pinning.py"), 95.0),
    # The batching path, one module at a time, each with the batching tests (which were
    # written against serving/batcher.py before it was split by responsibility).
    *(Target(module, BATCHING_TESTS, 85.0)
      for module in ("serving/batch_policy.py", "serving/batch_observer.py", "serving/batcher.py", "serving/dispatch.py")),
    # ... and batch_run.py with its own tests too: the run, the split and the output summary hook.
    Target("serving/batch_run.py", (*BATCHING_TESTS, "tests/serving/test_batch_run.py"), 85.0),
    # What a version answered, summarised for the canary analysis (fed by batch_run's hook);
    # its 22 survivors are equivalent (docs/testing.md), so 93 % is its ceiling.
    Target("serving/output_summary.py", ("tests/serving/test_output_summary.py",), 90.0),
)
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
NOT_COUNTED = {"skipped"}  # `# pragma: no mutate` lines
COPY_IGNORED = (".venv", "var", ".git", "mutants", "__pycache__", ".pytest_cache", "test-artifacts", "node_modules")


@dataclass(frozen=True)
class Score:
    module: str
    statuses: dict[str, str]  # mutant name -> mutmut status

    @property
    def counted(self) -> int:
        return sum(status not in NOT_COUNTED for status in self.statuses.values())

    @property
    def killed(self) -> int:
        return sum(status in KILLED for status in self.statuses.values())

    @property
    def percent(self) -> float:
        return 100.0 * self.killed / self.counted if self.counted else 100.0

    def survivors(self) -> list[str]:
        return sorted(name for name, status in self.statuses.items() if status not in KILLED | NOT_COUNTED)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help="modules to mutate (default: all of them)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "modelops-mutation")
    parser.add_argument("--max-children", type=int, default=max((os.cpu_count() or 2) - 1, 1))
    args = parser.parse_args(argv)
    targets = [target for target in TARGETS if not args.modules or target.module in args.modules]
    unknown = set(args.modules) - {target.module for target in targets}
    if unknown:
        parser.error(f"no mutation target for {', '.join(sorted(unknown))}; known: {', '.join(t.module for t in TARGETS)}")
    scores = [run_target(target, args.workdir / _slug(target.module), args.max_children) for target in targets]
    return report(targets, scores)


def run_target(target: Target, workdir: Path, max_children: int) -> Score:
    """A fresh copy of the tree, mutmut configured for this module, run, results read."""
    print(f"== {target.module}: mutating with {', '.join(target.tests)}", flush=True)
    _fresh_copy(workdir)
    _write_config(workdir, target)
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    if not Path(mutmut).is_file():  # run with another Python than the project's: a FileNotFoundError traceback
        raise SystemExit(f"mutmut is not installed beside {sys.executable}: run `make mutation`, or .venv/bin/python tools/mutation.py "
                         "after `make test` installed the test tools")
    environment = _environment(workdir)
    run = subprocess.run([mutmut, "run", "--max-children", str(max_children)], cwd=workdir, env=environment, check=False)
    if run.returncode != 0:
        raise SystemExit(f"mutmut run failed for {target.module} (exit {run.returncode}); see the output above")
    listing = subprocess.run([mutmut, "results", "--all", "true"], cwd=workdir, env=environment, capture_output=True, text=True, check=True)
    score = Score(target.module, parse_results(listing.stdout))
    for name in score.survivors():
        diff = subprocess.run([mutmut, "show", name], cwd=workdir, env=environment, capture_output=True, text=True, check=False)
        print(diff.stdout.rstrip(), flush=True)
    return score


def parse_results(text: str) -> dict[str, str]:
    """`mutmut results --all true` lines (`    name: status`) -> {name: status}."""
    statuses = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*(\S+): (.+)", line)
        if match:
            statuses[match.group(1)] = match.group(2).strip()
    return statuses


def report(targets: list[Target], scores: list[Score]) -> int:
    print("\nmodule                     score    killed/counted  target  survivors")
    failed = False
    for target, score in zip(targets, scores):
        below = score.percent < target.target_percent
        failed |= below
        print(f"{score.module:<26} {score.percent:6.1f}%  {score.killed:>6}/{score.counted:<7}  {target.target_percent:5.1f}%  {len(score.survivors())}{'  BELOW TARGET' if below else ''}")
        for name in score.survivors():
            print(f"    {name}: {score.statuses[name]}")
    return 1 if failed else 0


def _fresh_copy(workdir: Path) -> None:
    if workdir.exists():
        shutil.rmtree(workdir)
    shutil.copytree(REPO_ROOT, workdir, ignore=shutil.ignore_patterns(*COPY_IGNORED), symlinks=True)


def _write_config(workdir: Path, target: Target) -> None:
    """The repository's [tool.mutmut], narrowed to this module and its own tests."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    tests = [test for test in target.tests if (workdir / test).exists()]
    for missing in sorted(set(target.tests) - set(tests)):
        print(f"   warning: {missing} does not exist; mutating without it", flush=True)
    config.update(only_mutate=[target.module], pytest_add_cli_args_test_selection=tests)
    lines = ["[tool.mutmut]"] + [f"{key} = {_toml(value)}" for key, value in config.items()]
    (workdir / "pyproject.toml").write_text("\n".join(lines) + "\n")


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def _environment(workdir: Path) -> dict[str, str]:
    """SQLite and the in-memory channel layer: the unit tests need no services, and a
    run must not write into the developer's data directory."""
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL", "ARTIFACT_ROOT"}}
    environment["DATA_DIR"] = str(workdir / "data")
    return environment


def _slug(module: str) -> str:
    return module.replace("/", "_").removesuffix(".py")


if __name__ == "__main__":
    sys.exit(main())
