"""`make run`'s stack stops whole: every child it started is gone after it exits, even
when the stop signal comes twice (Ctrl-C pressed again, or make's SIGTERM after ours)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from console.embedded_redis import free_port
from console.processes import wait_http

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def test_a_second_stop_signal_does_not_cut_the_stop_short(tmp_path):
    port, serving_port = free_port(), free_port()
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "DJANGO_SECRET_KEY"}}
    env.update(DATA_DIR=str(tmp_path / "data"), EMBEDDED_REDIS_PORT=str(free_port()))
    env.pop("REDIS_URL", None)  # the embedded server too, as `make run` starts it
    errors = tmp_path / "stderr.log"
    stack = subprocess.Popen(
        [sys.executable, "manage.py", "runstack", "--no-demo", "--port", str(port), "--serving-port", str(serving_port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errors.open("w"),
    )
    try:
        wait_http(f"http://127.0.0.1:{serving_port}/v2/health/live", stack, timeout_s=120)
        children = [child.pid for child in psutil.Process(stack.pid).children(recursive=True)]
        assert len(children) >= 4  # Redis, console, worker, Celery

        for _ in range(20):  # the later ones arrive while the first stop is under way
            if stack.poll() is not None:
                break
            stack.send_signal(signal.SIGTERM)
            time.sleep(0.02)
        stack.wait(timeout=60)

        assert "Traceback" not in errors.read_text()  # the stop ran to its end
        assert stack.returncode == 0
        deadline = time.monotonic() + 10
        while alive(children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(children) == []
    finally:
        if stack.poll() is None:
            stack.kill()
            stack.wait(timeout=10)
        for pid in alive([child.pid for child in psutil.Process(os.getpid()).children(recursive=True)]):
            os.kill(pid, signal.SIGKILL)
