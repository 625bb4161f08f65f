"""`manage.py serve` follows the console it is told about, never whichever console answers
on the default port: CONSOLE_URL, else the console's CONSOLE_URL setting, else it refuses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.management.base import CommandError

from serving.management.commands.serve import console_url
from serving_testkit import REPO_ROOT, free_port


def test_serve_without_a_console_url_refuses_to_start_and_says_what_to_set(tmp_path):
    environment = {name: value for name, value in os.environ.items() if name != "CONSOLE_URL"}
    environment.update(DATA_DIR=str(tmp_path / "data"), SERVING_DEVICE="cpu", SERVING_CACHE_DIR=str(tmp_path / "cache"))

    finished = subprocess.run([sys.executable, "manage.py", "serve", "--port", str(free_port())], cwd=REPO_ROOT, env=environment,
                              capture_output=True, timeout=60, check=False)

    assert finished.returncode == 1
    assert b"CONSOLE_URL is not set" in finished.stderr
    assert not (tmp_path / "cache").exists()  # refused before anything was loaded or written


def test_console_url_comes_from_the_environment_first(monkeypatch, settings):
    monkeypatch.setenv("CONSOLE_URL", "http://console.example:8000/")
    settings.CONSOLE_URL = "http://elsewhere:9000"

    assert console_url() == "http://console.example:8000"


def test_console_url_falls_back_to_the_consoles_setting(monkeypatch, settings):
    monkeypatch.delenv("CONSOLE_URL", raising=False)
    settings.CONSOLE_URL = "http://127.0.0.1:8123"

    assert console_url() == "http://127.0.0.1:8123"


def test_console_url_refuses_when_neither_names_a_console(monkeypatch, settings):
    monkeypatch.delenv("CONSOLE_URL", raising=False)
    settings.CONSOLE_URL = ""

    with pytest.raises(CommandError, match="CONSOLE_URL is not set"):
        console_url()


def test_a_console_url_without_a_scheme_is_refused_at_start(monkeypatch, settings):
    monkeypatch.setenv("CONSOLE_URL", "127.0.0.1:8000")

    with pytest.raises(CommandError, match="expected an http:// or https:// URL with a host"):
        console_url()


def test_a_console_setting_that_is_not_an_http_url_is_refused_too(monkeypatch, settings):
    monkeypatch.delenv("CONSOLE_URL", raising=False)
    settings.CONSOLE_URL = "console:8000"

    with pytest.raises(CommandError, match="expected an http:// or https:// URL with a host"):
        console_url()
