"""The console reads its settings by the workers' rule (serving/env.py): an empty value
means "not set", whitespace is ignored, and a bad value stops it at start naming the
variable, the value and what is expected. Each case imports the settings in a fresh process."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
READ = "settings.SERVING_DEFAULT_MAX_BATCH_SIZE, settings.ALLOWED_HOSTS, settings.DEBUG, settings.LOGGING['root']['level']"


def _settings(tmp_path, expression: str, **env) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "DJANGO_SECRET_KEY", "DJANGO_DEBUG", "ALLOWED_HOSTS"}}
    environment.update({"DJANGO_SETTINGS_MODULE": "console.settings", "DATA_DIR": str(tmp_path / "data"), **env})
    script = f"import django; django.setup(); from django.conf import settings; print({expression})"
    return subprocess.run([sys.executable, "-c", script], check=False, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120)


def test_empty_values_leave_the_console_on_its_defaults(tmp_path):
    result = _settings(tmp_path, READ, SERVING_MAX_BATCH_SIZE="", ALLOWED_HOSTS="", DJANGO_DEBUG=" ", LOG_LEVEL="")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "32 ['127.0.0.1', 'localhost', '[::1]', 'testserver'] False INFO"


def test_surrounding_whitespace_is_ignored_by_the_console(tmp_path):
    result = _settings(tmp_path, READ, SERVING_MAX_BATCH_SIZE=" 8 ", ALLOWED_HOSTS=" a.example ", LOG_LEVEL=" WARNING ")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "8 ['a.example'] False WARNING"


def test_a_bad_value_stops_the_console_naming_the_variable_the_value_and_what_is_expected(tmp_path):
    result = _settings(tmp_path, "'started'", SERVING_MAX_BATCH_SIZE="many")

    assert result.returncode != 0
    assert "SettingError: SERVING_MAX_BATCH_SIZE='many': expected an integer" in result.stderr
    assert "started" not in result.stdout


@pytest.mark.parametrize(("name", "value", "words"), [
    # Accepted, then an OverflowError: a traceback at start, or at every workers page (now - timedelta).
    ("LOGIN_COOLOFF_S", "99999999999999", "LOGIN_COOLOFF_S='99999999999999': must be <= 3153600000 (100 years)"),
    ("WORKER_GONE_AFTER_S", "1e11", "WORKER_GONE_AFTER_S='1e11': must be a finite number <= 3153600000 (100 years)"),
    ("JOB_MEMORY_LIMIT_BYTES", "1" + "0" * 30, "JOB_MEMORY_LIMIT_BYTES='1" + "0" * 30 + "': must be <= 9223372036854775807"),
])
def test_a_duration_past_a_century_or_a_number_past_64_bits_stops_the_console_naming_it(tmp_path, name, value, words):
    result = _settings(tmp_path, "'started'", **{name: value})

    assert result.returncode != 0
    assert f"SettingError: {words}" in result.stderr


@pytest.mark.parametrize("name", ["DATABASE_LOCK_TIMEOUT_S", "SQLITE_BUSY_TIMEOUT_S"])
def test_a_database_wait_past_what_its_milliseconds_hold_stops_the_console_naming_it(tmp_path, name):
    # Both are C ints of milliseconds (24.8 days). 30 days passed the 100-year ceiling: PostgreSQL
    # refused every connection (lock_timeout "exceeds integer range"), and SQLite's busy timeout
    # silently became 0, every writer that met another failing at once with "database is locked".
    result = _settings(tmp_path, "'started'", **{name: "2592000"})

    assert result.returncode != 0
    assert f"SettingError: {name}='2592000': must be " in result.stderr and "<= 2147483\n" in result.stderr


def test_a_celery_time_limit_within_the_job_timeout_stops_the_console(tmp_path):
    # Accepted, Celery killed each job before its own timeout, and the job read as lost.
    result = _settings(tmp_path, "'started'", CELERY_TASK_TIME_LIMIT_S="600", JOB_TIMEOUT_S="900")

    assert result.returncode != 0
    assert "SettingError: CELERY_TASK_TIME_LIMIT_S=600 with JOB_TIMEOUT_S=900: Celery would kill a job before its own timeout" in result.stderr


def test_an_unknown_log_level_stops_the_console_naming_it(tmp_path):
    result = _settings(tmp_path, "'started'", LOG_LEVEL="verbose")

    assert result.returncode != 0
    assert "SettingError: LOG_LEVEL='verbose': expected one of debug, info, warning, error, critical" in result.stderr


def test_an_empty_secret_key_is_not_set_and_the_generated_key_is_used(tmp_path):
    result = _settings(tmp_path, "settings.SECRET_KEY == open(settings.DATA_DIR / 'secret_key').read().strip()", DJANGO_SECRET_KEY="", DJANGO_DEBUG="false")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "True"


def test_the_database_url_can_come_from_a_file(tmp_path):
    (tmp_path / "database_url").write_text(f"sqlite:///{tmp_path / 'from-file.sqlite3'}\n")

    result = _settings(tmp_path, "settings.DATABASES['default']['NAME']", DATABASE_URL_FILE=str(tmp_path / "database_url"))

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(tmp_path / "from-file.sqlite3")


def _manage(tmp_path, *arguments: str, **env) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "DJANGO_SECRET_KEY"}}
    environment.update({"DATA_DIR": str(tmp_path / "data"), **env})
    return subprocess.run([sys.executable, "manage.py", *arguments], check=False, cwd=REPO_ROOT, env=environment, capture_output=True, text=True,
                          timeout=120)


def test_manage_py_with_a_bad_value_says_which_in_one_line_without_a_traceback(tmp_path):
    result = _manage(tmp_path, "check", MAX_UPLOAD_BYTES="abc")

    assert result.returncode == 1
    assert result.stderr == "manage.py: MAX_UPLOAD_BYTES='abc': expected an integer\n"


def test_a_serving_public_url_that_is_not_a_url_is_refused_at_start(tmp_path):
    # Read as any text, it was accepted until demo_traffic or the try-it page used it.
    result = _manage(tmp_path, "check", SERVING_PUBLIC_URL="worker:8001")

    assert result.returncode == 1
    assert result.stderr == ("manage.py: SERVING_PUBLIC_URL='worker:8001': expected an http:// or https:// URL with a host, "
                             "e.g. http://127.0.0.1:8001\n")


@pytest.mark.parametrize("name", ["DATABASE_CONNECT_TIMEOUT_S", "DATABASE_CONN_MAX_AGE_S"])
def test_a_bad_postgresql_setting_is_refused_on_sqlite_too(tmp_path, name):
    # Read on the PostgreSQL branch only, it was accepted until the day DATABASE_URL was set.
    result = _manage(tmp_path, "check", **{name: "abc"})

    assert result.returncode == 1
    assert result.stderr == f"manage.py: {name}='abc': expected an integer\n"


def test_a_bad_sqlite_setting_is_refused_on_postgresql_too(tmp_path):
    result = _manage(tmp_path, "check", DATABASE_URL="postgres://postgres@127.0.0.1:5432/test", SQLITE_BUSY_TIMEOUT_S="abc")

    assert result.returncode == 1
    assert result.stderr == "manage.py: SQLITE_BUSY_TIMEOUT_S='abc': expected an integer\n"


def test_a_database_url_of_no_known_scheme_is_named_and_its_value_is_not_echoed(tmp_path):
    result = _manage(tmp_path, "check", DATABASE_URL="nonsense://user:hunter2@db/x")

    assert result.returncode == 1
    assert result.stderr.startswith("manage.py: DATABASE_URL: UnknownSchemeError: expected a URL such as postgres://")
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr


def test_the_default_database_and_data_dir_are_readable_by_their_owner_alone(tmp_path):
    # The SQLite database holds API token keys and sessions in clear; it was made 0644 in
    # a 0755 DATA_DIR, beside secrets that were 0600.
    write_and_list_modes = ("[__import__('django.db').db.connection.cursor().execute('create table t (x)'), "
                            "sorted((p.name, oct(p.stat().st_mode & 0o777)) for p in [settings.DATA_DIR, *settings.DATA_DIR.iterdir()] if p == settings.DATA_DIR or p.is_file())][-1]")

    result = _settings(tmp_path, write_and_list_modes)

    assert result.returncode == 0, result.stderr
    modes = dict(ast.literal_eval(result.stdout.strip().splitlines()[-1]))
    assert modes.pop("data") == "0o700"
    assert {"db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm", "secret_key"} <= set(modes)
    assert set(modes.values()) == {"0o600"}, modes


def test_a_database_made_readable_by_an_earlier_version_is_made_private_at_start(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "db.sqlite3").touch(mode=0o644)

    result = _settings(tmp_path, "oct(settings.DATABASES['default']['NAME'].stat().st_mode & 0o777)")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0o600"


def test_a_report_rate_that_would_show_workers_gone_stops_the_console(tmp_path):
    result = _settings(tmp_path, "'started'", WORKER_REPORTS_PER_S="0.5", WORKER_GONE_AFTER_S="5")

    assert result.returncode != 0
    assert ("SettingError: WORKER_REPORTS_PER_S=0.5 with WORKER_GONE_AFTER_S=5: a worker held to it would be shown gone between its "
            "accepted reports; keep WORKER_REPORTS_PER_S at least 3 / WORKER_GONE_AFTER_S (0.6)") in result.stderr


def test_the_rollout_overdue_slack_is_read_and_a_negative_one_stops_the_console(tmp_path):
    default = _settings(tmp_path, "settings.ROLLOUT_OVERDUE_SLACK_S")
    short = _settings(tmp_path, "settings.ROLLOUT_OVERDUE_SLACK_S", ROLLOUT_OVERDUE_SLACK_S="2.5")
    negative = _settings(tmp_path, "'started'", ROLLOUT_OVERDUE_SLACK_S="-1")

    assert default.stdout.strip().splitlines()[-1] == "10.0", default.stderr
    assert short.stdout.strip().splitlines()[-1] == "2.5", short.stderr
    assert negative.returncode != 0
    assert "SettingError: ROLLOUT_OVERDUE_SLACK_S='-1': must be a finite number >= 0.0" in negative.stderr


def test_the_lock_timeout_is_set_on_postgresql_connections_unless_it_is_0(tmp_path):
    url = "postgres://u@127.0.0.1:5432/d"
    on = _settings(tmp_path, "settings.DATABASES['default']['OPTIONS'].get('options')", DATABASE_URL=url, DATABASE_LOCK_TIMEOUT_S="2.5")
    off = _settings(tmp_path, "settings.DATABASES['default']['OPTIONS'].get('options')", DATABASE_URL=url, DATABASE_LOCK_TIMEOUT_S="0")

    assert on.stdout.strip().splitlines()[-1] == "-c lock_timeout=2500", on.stderr
    assert off.stdout.strip().splitlines()[-1] == "None", off.stderr


REDIS_EXPECTED = "expected a redis:// or rediss:// URL, e.g. redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(("url", "said"), [
    ("http://user:hunter2@127.0.0.1:18599/0", f"REDIS_URL='http://user:***@127.0.0.1:18599/0': {REDIS_EXPECTED}"),
    ("unix:///run/redis.sock?password=hunter2", f"REDIS_URL='unix:///run/redis.sock?password=***': {REDIS_EXPECTED} (Celery's broker takes no unix:// socket)"),
    ("redis://:hunter2@127.0.0.1:6379/cache", f"REDIS_URL='redis://:***@127.0.0.1:6379/cache': {REDIS_EXPECTED} (the path is the database number)"),
    ("redis://127.0.0.1:six/0", f"REDIS_URL='redis://127.0.0.1:six/0': {REDIS_EXPECTED}"),
], ids=["http", "unix socket", "database not a number", "port not a number"])
def test_a_redis_url_neither_redis_client_takes_stops_manage_py_naming_it_with_its_password_masked(tmp_path, url, said):
    # Accepted, http:// went as far as Celery's first send ("No such transport: http") and
    # redis-py's first connection, after migrations and the demo models had been written.
    result = _manage(tmp_path, "check", REDIS_URL=url)

    assert result.returncode == 1
    assert result.stderr == f"manage.py: {said}\n"


@pytest.mark.parametrize("command", [["manage.py", "serve"], ["-m", "celery", "-A", "console", "worker"]], ids=["serving worker", "Celery worker"])
def test_the_workers_refuse_such_a_redis_url_at_start_too(tmp_path, command):
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "DJANGO_SECRET_KEY", "CONSOLE_URL"}}
    environment.update(DATA_DIR=str(tmp_path / "data"), REDIS_URL="http://user:hunter2@127.0.0.1:18599/0")

    result = subprocess.run([sys.executable, *command], check=False, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120)

    assert result.returncode != 0
    assert result.stderr.strip().endswith(f"REDIS_URL='http://user:***@127.0.0.1:18599/0': {REDIS_EXPECTED}")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # no traceback burying it
    assert "hunter2" not in result.stderr + result.stdout


@pytest.mark.parametrize("url", ["redis://:hunter2@127.0.0.1:6379/3", "rediss://cache.example:6380", "redis://127.0.0.1/"])
def test_a_redis_url_both_clients_take_is_used_as_given(tmp_path, url):
    result = _settings(tmp_path, "settings.REDIS_URL, settings.CELERY_BROKER_URL", REDIS_URL=url)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == f"{url} {url}"


@pytest.mark.parametrize("scheme", ["mysql", "oracle", "postgis", "cockroach"])
def test_a_database_url_of_a_database_the_project_does_not_run_on_is_refused_naming_its_scheme(tmp_path, scheme):
    # dj-database-url knows these; the drivers are not installed: mysql:// was Django's
    # traceback "Error loading MySQLdb module. Did you install mysqlclient?".
    result = _manage(tmp_path, "check", DATABASE_URL=f"{scheme}://user:hunter2@db:3306/x")

    assert result.returncode == 1
    assert result.stderr == (f"manage.py: DATABASE_URL: {scheme}:// is not supported (PostgreSQL and SQLite are): expected a URL such as "
                             "postgres://user@host:5432/name or sqlite:////path/db.sqlite3\n")


@pytest.mark.parametrize(("url", "engine"), [("postgres://u@127.0.0.1:5432/d", "postgresql"), ("postgresql://u@127.0.0.1:5432/d", "postgresql"),
                                           ("pgsql://u@127.0.0.1:5432/d", "postgresql"), ("sqlite:////tmp/x.sqlite3", "sqlite3")])
def test_a_database_url_for_postgresql_or_sqlite_is_accepted(tmp_path, url, engine):
    result = _settings(tmp_path, "settings.DATABASES['default']['ENGINE']", DATABASE_URL=url)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == f"django.db.backends.{engine}"


def test_a_data_dir_starting_with_a_tilde_is_the_home_directorys_for_the_console_as_for_the_workers(tmp_path):
    # As compose and .env files pass it, unexpanded: the console made ./~/modelops in its working
    # directory (the code tree under `make run`) while the workers read ~/modelops.
    home = tmp_path / "home"
    result = _settings(tmp_path, "settings.DATA_DIR", DATA_DIR="~/modelops", HOME=str(home))

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(home / "modelops")


def test_an_artifact_root_starting_with_a_tilde_is_the_home_directorys(tmp_path):
    # Read as DATA_DIR was: ./~/artifacts in the console's working directory.
    home = tmp_path / "home"
    result = _settings(tmp_path, "settings.ARTIFACT_ROOT", ARTIFACT_ROOT="~/artifacts", HOME=str(home))

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(home / "artifacts")


def test_a_data_dir_naming_the_home_of_no_such_user_stops_the_console_naming_it(tmp_path):
    # "~x/…" expands to user x's home; with no such user it was a RuntimeError traceback from
    # pathlib, not the one line naming DATA_DIR (before ~ was expanded: a ./~x directory).
    result = _manage(tmp_path, "check", DATA_DIR="~no-such-user-modelops/data")

    assert result.returncode == 1
    assert result.stderr == ("manage.py: DATA_DIR='~no-such-user-modelops/data': no home directory for '~no-such-user-modelops' "
                             "(no such user); give an absolute path\n")


def test_a_default_batch_size_past_what_a_model_may_set_stops_the_console(tmp_path):
    # A model's own max_batch_size is 1 to 1024 (400 past it); the default was unbounded, and
    # every worker warms each size up to it: 100000 timed every version's load out.
    result = _manage(tmp_path, "check", SERVING_MAX_BATCH_SIZE="1025")

    assert result.returncode == 1
    assert result.stderr == "manage.py: SERVING_MAX_BATCH_SIZE='1025': must be <= 1024\n"


def test_a_job_heartbeat_too_slow_for_its_stale_limit_stops_the_console(tmp_path):
    # JOB_HEARTBEAT_S=60 beside the default JOB_STALE_AFTER_S=30 was accepted: the sweep took
    # every running job for lost between two heartbeats and queued it again.
    result = _manage(tmp_path, "check", JOB_HEARTBEAT_S="60")

    assert result.returncode == 1
    assert result.stderr == ("manage.py: JOB_HEARTBEAT_S=60 with JOB_STALE_AFTER_S=30: a running job would be taken for lost between two "
                             "heartbeats and run again; keep JOB_STALE_AFTER_S at least 3 × JOB_HEARTBEAT_S (180)\n")
