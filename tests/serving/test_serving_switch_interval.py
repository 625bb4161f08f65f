"""SERVING_SWITCH_INTERVAL_S is applied by both ways of starting a worker: `manage.py serve`
(how `make run` and compose start workers) and `python -m serving.worker`.

Each runs in a child process up to the point where it would start serving; there the
child prints its ``sys.getswitchinterval()`` and exits instead of listening."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from serving_testkit import REPO_ROOT, state as desired_state, write_state

STOP_BEFORE_SERVING = "import sys; import serving.worker as w; w.Worker.serve = lambda self, host, port: print('interval', sys.getswitchinterval())"
ENTRY_POINTS = {
    "manage.py serve": "import django; django.setup(); from django.core.management import call_command; call_command('serve', '--state-file', {state!r})",
    "python -m serving.worker": "w.main(['--state-file', {state!r}])",
}


@pytest.mark.parametrize("entry_point", sorted(ENTRY_POINTS))
def test_the_switch_interval_setting_is_applied_by_each_entry_point(tmp_path, entry_point):
    state = write_state(tmp_path / "state.json", desired_state(1, {}))
    environment = {name: value for name, value in os.environ.items() if name not in {"DATABASE_URL", "DJANGO_SECRET_KEY"}}
    environment.update(DJANGO_SETTINGS_MODULE="console.settings", DATA_DIR=str(tmp_path / "data"), SERVING_DEVICE="cpu",
                       SERVING_CACHE_DIR=str(tmp_path / "cache"), SERVING_SWITCH_INTERVAL_S="0.0123")
    script = STOP_BEFORE_SERVING + "; " + ENTRY_POINTS[entry_point].format(state=str(state))

    finished = subprocess.run([sys.executable, "-c", script], check=False, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120)

    assert finished.returncode == 0, finished.stderr
    assert f"interval {0.0123}" in finished.stdout.splitlines()
