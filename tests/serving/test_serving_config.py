"""Settings come from the environment and bad values fail loudly at start."""

from __future__ import annotations

import pytest

from serving.config import ConfigError, ServingConfig


def test_defaults_without_environment(monkeypatch):
    for name in ("SERVING_MAX_BATCH_SIZE", "SERVING_DEVICE", "CONSOLE_URL"):
        monkeypatch.delenv(name, raising=False)

    config = ServingConfig.from_env()

    assert (config.device, config.max_batch_size, config.console_url) == ("auto", 32, "http://127.0.0.1:8000")


def test_values_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("SERVING_MAX_QUEUE_DELAY_S", "0.005")
    monkeypatch.setenv("SERVING_MEMORY_PATTERN", "off")
    monkeypatch.setenv("CONSOLE_URL", "http://console:8000/")

    config = ServingConfig.from_env()

    assert (config.max_queue_delay_s, config.memory_pattern, config.console_url) == (0.005, False, "http://console:8000")


def test_the_send_timeout_is_30_s_unless_set(monkeypatch):
    monkeypatch.delenv("SERVING_SEND_TIMEOUT_S", raising=False)
    assert ServingConfig.from_env().send_timeout_s == 30.0

    monkeypatch.setenv("SERVING_SEND_TIMEOUT_S", "2.5")
    assert ServingConfig.from_env().send_timeout_s == 2.5


def test_the_unsent_answers_are_bounded_at_256_mib_unless_set(monkeypatch):
    monkeypatch.delenv("SERVING_MAX_UNSENT_BYTES", raising=False)
    assert ServingConfig.from_env().max_unsent_bytes == 256 * 1024 * 1024

    monkeypatch.setenv("SERVING_MAX_UNSENT_BYTES", "0")
    assert ServingConfig.from_env().max_unsent_bytes == 0


def test_worker_token_can_come_from_a_file(monkeypatch, tmp_path):
    (tmp_path / "token").write_text("abc\n")
    monkeypatch.setenv("SERVING_WORKER_TOKEN_FILE", str(tmp_path / "token"))

    assert ServingConfig.from_env().worker_token == "abc"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SERVING_MAX_BATCH_SIZE", "0", "must be >= 1"),
        ("SERVING_MAX_BATCH_SIZE", "many", "expected an integer"),
        ("SERVING_MAX_BATCH_SIZE", "1025", "must be <= 1024"),
        ("SERVING_DEVICE", "tpu", "expected one of auto, cpu, cuda"),
        ("SERVING_MAX_QUEUE_DELAY_S", "-1", "must be a finite number >= 0"),
        ("SERVING_MAX_QUEUE_DELAY_S", "60", "must be a finite number <= 1.0"),  # a model's own bound; 60 timed out every request
        ("SERVING_MEMORY_PATTERN", "maybe", "expected true or false"),
        ("SERVING_SEND_TIMEOUT_S", "0", "must be a finite number >= 0.01"),
        ("SERVING_SEND_TIMEOUT_S", "soon", "expected a number"),
        ("SERVING_MAX_UNSENT_BYTES", "-1", "must be >= 0"),
        ("SERVING_MAX_UNSENT_BYTES", "lots", "expected an integer"),
        # Accepted, each failed later without naming the setting: ONNX Runtime's TypeError at
        # every load, a datetime overflow, a C call's OverflowError.
        ("SERVING_INTRA_OP_THREADS", "99999999999", r"must be <= 4096"),
        ("SERVING_CUDA_DEVICE_ID", "99999999999", r"must be <= 1023"),
        ("SERVING_SEND_TIMEOUT_S", "1e11", r"must be a finite number <= 3153600000 \(100 years\)"),
        ("SERVING_GPU_MEM_LIMIT_BYTES", "1" + "0" * 30, r"must be <= 18446744073709551615"),
        # In MiB: 2**44 is 2**64 bytes, ONNX Runtime's arena TypeError at every load.
        ("SERVING_RUN_MEMORY_MB", str(2**44), r"must be <= 8796093022207"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)

    with pytest.raises(ConfigError, match=f"{name}.*{message}"):
        ServingConfig.from_env()


def test_a_worker_id_longer_than_the_console_keeps_is_refused_at_start(monkeypatch):
    # Accepted, the worker served while the console refused each of its reports and acks (400).
    monkeypatch.setenv("SERVING_WORKER_ID", "w" * 101)

    with pytest.raises(ConfigError, match=r"SERVING_WORKER_ID='w{101}': at most 100 characters"):
        ServingConfig.from_env()


def test_a_cache_dir_starting_with_a_tilde_is_the_home_directorys(monkeypatch, tmp_path):
    # Taken as written, the worker cached artifacts in ./~/cache, wherever it was started.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SERVING_CACHE_DIR", "~/cache")

    assert ServingConfig.from_env().cache_dir == str(tmp_path / "cache")


def test_onnx_runtimes_own_no_limit_is_accepted_as_the_gpu_memory_limit(monkeypatch):
    # SIZE_MAX, as ONNX Runtime's documentation writes "no limit": the 64-bit ceiling of
    # every other integer setting refused it.
    monkeypatch.setenv("SERVING_GPU_MEM_LIMIT_BYTES", str(2**64 - 1))

    assert ServingConfig.from_env().gpu_mem_limit_bytes == 2**64 - 1
