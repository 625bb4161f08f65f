"""serving/env.py, the one reader of settings for the console and the workers: whitespace
is ignored, an empty value means "not set", and a bad value is refused with a message
naming the variable, the value and what is expected."""

from __future__ import annotations

import pytest

from serving.config import ConfigError, ServingConfig
from serving.env import SettingError, env_bool, env_choice, env_float, env_int, env_list, env_secret, env_str


@pytest.mark.parametrize("empty", ["", "   "])
def test_an_empty_value_means_not_set_so_the_default_applies(monkeypatch, empty):
    for name in ("A_STR", "A_INT", "A_FLOAT", "A_BOOL", "A_CHOICE", "A_LIST", "A_SECRET"):
        monkeypatch.setenv(name, empty)

    assert env_str("A_STR", "d") == "d"
    assert env_int("A_INT", 7) == 7
    assert env_float("A_FLOAT", 0.5) == 0.5
    assert env_bool("A_BOOL", True) is True
    assert env_choice("A_CHOICE", "b", ("a", "b")) == "b"
    assert env_list("A_LIST", ["x"]) == ["x"]
    assert env_secret("A_SECRET", "s") == "s"


def test_an_empty_value_in_the_worker_environment_leaves_the_default(monkeypatch):
    monkeypatch.setenv("SERVING_MAX_BATCH_SIZE", "")
    monkeypatch.setenv("SERVING_MEMORY_PATTERN", "")
    monkeypatch.setenv("SERVING_DEVICE", "")

    config = ServingConfig.from_env()

    assert (config.max_batch_size, config.memory_pattern, config.device) == (32, True, "auto")


def test_surrounding_whitespace_is_ignored(monkeypatch):
    monkeypatch.setenv("A_INT", " 8\n")
    monkeypatch.setenv("A_CHOICE", " CPU ")
    monkeypatch.setenv("A_LIST", " a , b ,, ")

    assert (env_int("A_INT", 1), env_choice("A_CHOICE", "auto", ("auto", "cpu")), env_list("A_LIST", [])) == (8, "cpu", ["a", "b"])


@pytest.mark.parametrize(
    ("read", "value", "message"),
    [
        (lambda: env_int("X", 1), "many", "X='many': expected an integer"),
        (lambda: env_int("X", 1, minimum=1), "0", "X='0': must be >= 1"),
        (lambda: env_int("X", 1, maximum=65535), "70000", "X='70000': must be <= 65535"),
        (lambda: env_int("X", 1), "-3", "X='-3': must be >= 0"),
        (lambda: env_float("X", 1.0), "fast", "X='fast': expected a number"),
        (lambda: env_float("X", 1.0), "inf", "X='inf': expected a finite number"),
        (lambda: env_float("X", 1.0, minimum=None), "nan", "X='nan': expected a finite number"),
        (lambda: env_float("X", 1.0, minimum=0.1), "0.01", "X='0.01': must be a finite number >= 0.1"),
        (lambda: env_bool("X"), "maybe", "X='maybe': expected true or false (one of 1, true, yes, on, 0, false, no, off)"),
        (lambda: env_choice("X", "a", ("a", "b")), "c", "X='c': expected one of a, b"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_the_value_and_what_is_expected(monkeypatch, read, value, message):
    monkeypatch.setenv("X", value)

    with pytest.raises(SettingError) as refused:
        read()

    assert str(refused.value) == message
    assert isinstance(refused.value, ValueError)


def test_the_workers_config_error_is_the_same_error():
    assert ConfigError is SettingError


def test_a_secret_file_wins_over_the_variable(monkeypatch, tmp_path):
    (tmp_path / "secret").write_text("from-file\n")
    monkeypatch.setenv("A_SECRET", "from-variable")
    monkeypatch.setenv("A_SECRET_FILE", str(tmp_path / "secret"))

    assert env_secret("A_SECRET") == "from-file"


def test_an_unreadable_secret_file_is_refused_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv("A_SECRET_FILE", str(tmp_path / "missing"))

    with pytest.raises(SettingError, match=r"A_SECRET_FILE='.*missing': cannot read it \(No such file or directory\)"):
        env_secret("A_SECRET")


@pytest.mark.parametrize("value", ["127.0.0.1:8000", "ftp://console:21", "http://", "http://console:port", "console.example"])
def test_a_console_url_that_is_not_an_http_url_with_a_host_is_refused_naming_it(monkeypatch, value):
    monkeypatch.setenv("CONSOLE_URL", value)

    with pytest.raises(SettingError, match=r"CONSOLE_URL=.*expected an http:// or https:// URL with a host"):
        ServingConfig.from_env()


def test_a_console_url_loses_its_trailing_slash(monkeypatch):
    monkeypatch.setenv("CONSOLE_URL", "https://console.example:8443/")

    assert ServingConfig.from_env().console_url == "https://console.example:8443"


def test_a_worker_started_with_a_bad_setting_exits_with_one_log_line_naming_it(tmp_path):
    import json
    import subprocess
    import sys

    from serving_testkit import REPO_ROOT

    finished = subprocess.run([sys.executable, "-m", "serving.worker", "--port", "9"], cwd=REPO_ROOT, capture_output=True, timeout=60,
                              check=False,
                              env={"PATH": "/usr/bin:/bin", "SERVING_MAX_BATCH_SIZE": "abc", "SERVING_CACHE_DIR": str(tmp_path)})

    assert finished.returncode == 2
    lines = finished.stderr.decode().splitlines()
    assert len(lines) == 1, finished.stderr.decode()
    assert json.loads(lines[0])["reason"] == "SERVING_MAX_BATCH_SIZE='abc': expected an integer"


def test_a_connection_cap_past_the_open_file_ceiling_is_refused_at_start_not_in_a_traceback(monkeypatch):
    monkeypatch.setenv("SERVING_MAX_CONNECTIONS", "3000000000")  # overflowed uvloop's listen backlog at start

    with pytest.raises(SettingError, match="SERVING_MAX_CONNECTIONS='3000000000'"):
        ServingConfig.from_env()


@pytest.mark.parametrize("port", ["0", "70000", "-1", "eighty"])
def test_a_worker_given_a_port_out_of_range_exits_2_naming_it(tmp_path, port):
    import subprocess
    import sys

    from serving_testkit import REPO_ROOT

    finished = subprocess.run([sys.executable, "-m", "serving.worker", "--port", port], cwd=REPO_ROOT, capture_output=True, timeout=60,
                              check=False, env={"PATH": "/usr/bin:/bin", "SERVING_CACHE_DIR": str(tmp_path)})

    assert finished.returncode == 2
    assert f"expected a port number from 1 to 65535, got {port!r}" in finished.stderr.decode()
    assert b"Traceback" not in finished.stderr


def test_a_worker_given_a_taken_port_exits_2_naming_it_before_loading_anything(tmp_path):
    import json
    import socket
    import subprocess
    import sys

    from serving_testkit import REPO_ROOT

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        finished = subprocess.run([sys.executable, "-m", "serving.worker", "--port", str(port)], cwd=REPO_ROOT, capture_output=True,
                                  timeout=60, check=False, env={"PATH": "/usr/bin:/bin", "SERVING_CACHE_DIR": str(tmp_path / "cache")})

    assert finished.returncode == 2
    lines = finished.stderr.decode().splitlines()
    assert len(lines) == 1, finished.stderr.decode()
    assert json.loads(lines[0])["event"] == "cannot_listen" and f"127.0.0.1:{port} is not free" in lines[0]
    assert not (tmp_path / "cache").exists()


def test_a_worker_given_a_state_file_it_cannot_read_exits_2_with_one_line_naming_it(tmp_path):
    import json
    import subprocess
    import sys

    from serving_testkit import REPO_ROOT

    missing = tmp_path / "no-such-state.json"
    finished = subprocess.run([sys.executable, "-m", "serving.worker", "--port", "9", "--state-file", str(missing)], cwd=REPO_ROOT,
                              capture_output=True, timeout=60, check=False, env={"PATH": "/usr/bin:/bin", "SERVING_CACHE_DIR": str(tmp_path)})

    assert finished.returncode == 2
    lines = finished.stderr.decode().splitlines()
    assert len(lines) == 1, finished.stderr.decode()
    assert json.loads(lines[0])["event"] == "bad_state_file" and str(missing) in lines[0]


def test_a_compute_nice_past_the_lowest_priority_is_refused_not_quietly_capped(monkeypatch):
    monkeypatch.setenv("SERVING_COMPUTE_NICE", "100")  # ran at 19, as if 100 had been honoured

    with pytest.raises(SettingError, match="SERVING_COMPUTE_NICE='100'"):
        ServingConfig.from_env()


def test_a_worker_asked_for_a_device_this_machine_lacks_exits_with_one_log_line_naming_it(tmp_path):
    import json
    import subprocess
    import sys

    from serving_testkit import REPO_ROOT

    finished = subprocess.run([sys.executable, "-m", "serving.worker", "--port", "9"], cwd=REPO_ROOT, capture_output=True, timeout=60,
                              check=False, env={"PATH": "/usr/bin:/bin", "SERVING_DEVICE": "cuda", "SERVING_CACHE_DIR": str(tmp_path),
                                                "SERVING_CUDA_DEVICE_ID": "99"})  # no machine has it: no skip where a GPU is

    assert finished.returncode == 2, finished.stderr.decode()
    lines = finished.stderr.decode().splitlines()
    assert len(lines) == 1, finished.stderr.decode()
    assert json.loads(lines[0])["reason"].startswith("SERVING_DEVICE=cuda")
