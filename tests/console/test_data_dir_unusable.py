"""A DATA_DIR that cannot be a directory (a file is there, or a part of its path is a
file) stops every manage.py command with one line naming DATA_DIR, the path and why,
like any other bad setting; it was a traceback from the settings module's mkdir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def manage_check(data_dir: Path) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL", "CI", "DJANGO_SECRET_KEY"}}
    environment["DATA_DIR"] = str(data_dir)
    return subprocess.run([sys.executable, "manage.py", "check"], check=False, cwd=REPO_ROOT, env=environment, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(("where", "why"), [("file", "not a directory"), ("file/data", "cannot create it")],
                         ids=["a file is there", "a file is in its path"])
def test_a_data_dir_that_cannot_be_a_directory_stops_manage_py_with_one_line_naming_it(tmp_path, where, why):
    (tmp_path / "file").write_text("not a directory\n")
    data_dir = tmp_path / where

    finished = manage_check(data_dir)

    assert finished.returncode == 1, finished.stderr
    assert finished.stderr.startswith(f"manage.py: DATA_DIR='{data_dir}': {why}"), finished.stderr
    assert len(finished.stderr.splitlines()) == 1 and "Traceback" not in finished.stderr
