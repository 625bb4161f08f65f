"""Django settings. Every value comes from the environment through serving/env.py, the
reader the workers use too (see the README tables)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from csp.constants import NONE, SELF

from console import console_address, redis_options
from console.kept_secret import kept_secret
from serving import contract
from serving.env import (
    SettingError,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_path,
    env_redis_url,
    env_secret,
    env_str,
    env_url,
)
from serving.model_safety import default_data_dir

BASE_DIR = Path(__file__).resolve().parent.parent


def _data_dir() -> Path:
    """DATA_DIR, made if missing. One that cannot be used is a SettingError naming it (one
    line from manage.py), not the traceback of a mkdir every command printed."""
    path = default_data_dir()  # the workers' reading: "~/x" is the home directory's, not ./~/x
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)  # the mode applies when it is made here
    except FileExistsError:  # exist_ok covers a directory only
        raise SettingError(f"DATA_DIR={str(path)!r}: not a directory (a file of that name is there)") from None
    except OSError as error:
        raise SettingError(f"DATA_DIR={str(path)!r}: cannot create it ({error.strerror})") from None
    return path


# Outside the code tree: no process that loads models runs where the secrets live.
DATA_DIR = _data_dir()

# Read by ONNX Runtime itself (the serving and registry packages set it when it is empty);
# checked here so that a value that is no true/false word stops the console like any other.
ORT_TELEMETRY_DISABLED = env_bool("ORT_DISABLE_TELEMETRY", True)


def _private_file(path: Path) -> Path:
    """``path``, existing and readable by this user alone. For SQLite: its -wal and -shm
    files take the database's mode. The database holds API token keys and sessions in
    clear, and was created 0644 in a 0755 directory: any local user could read them."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        for existing in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if existing.exists() and existing.stat().st_mode & 0o077:
                existing.chmod(0o600)  # made by an earlier version
    except OSError:  # a read-only DATA_DIR (a process that never opens the database): SQLite says so if one does
        pass
    return path


def _secret(name: str, file_name: str) -> str:
    """An explicit value wins; otherwise one generated once and kept in DATA_DIR, so
    every process started from the same checkout agrees on it."""
    explicit = env_secret(name)
    if explicit:
        return explicit
    return kept_secret(DATA_DIR / file_name)


# Keys that ship in examples, or too short to resist guessing: whoever knows the key
# signs sessions, password-reset links and CSRF tokens for any user.
SECRET_KEY_PLACEHOLDERS = ("change-me", "changeme", "change_me", "django-insecure", "insecure", "placeholder", "secret-key", "secretkey")
SECRET_KEY_MIN_LENGTH = 50


def _refuse_weak_secret_key(value: str) -> None:
    lowered = value.strip().lower()
    if len(value) < SECRET_KEY_MIN_LENGTH:
        problem = f"only {len(value)} characters long (at least {SECRET_KEY_MIN_LENGTH} are needed)"
    elif any(word in lowered for word in SECRET_KEY_PLACEHOLDERS) or len(set(value)) < 5:
        problem = "a placeholder, not a secret"
    else:
        return
    raise SettingError(  # manage.py says it in one line
        f"DJANGO_SECRET_KEY is {problem}. Refusing to start outside DJANGO_DEBUG: set DJANGO_SECRET_KEY to a long "
        "random value (python -c 'import secrets; print(secrets.token_urlsafe(50))'), or unset it to use the key "
        "generated once into $DATA_DIR/secret_key."
    )


DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = _secret("DJANGO_SECRET_KEY", "secret_key")
if not DEBUG:
    _refuse_weak_secret_key(SECRET_KEY)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "channels",
    "axes",
    "registry",
    "serving",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "console.security.LiveFeedCSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "console.outage.DatabaseOutageMiddleware",  # outside the session and auth middleware: 503, not 500
    "registry.api.query_parameters.refuse_repeated_query_parameters",  # before anything reads the query
    "console.form_charset.refuse_form_charsets",  # before anything reads a form's fields
    "django.contrib.sessions.middleware.SessionMiddleware",
    "console.method_not_allowed.MethodNotAllowedPage",  # a page address visited with the wrong method: the error page
    "console.trailing_slash.AppendSlashMiddleware",  # Django's CommonMiddleware, answering a change 308 (keeps its body)
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "console.password_change.PasswordChangeRequiredMiddleware",  # a one-time password only opens the password change
    "axes.middleware.AxesMiddleware",  # last, as django-axes requires
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = "console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.roles",
            ],
        },
    },
]


# How long a change may wait for a lock another session holds (PostgreSQL): every single
# wait (lock_timeout), and the generation row's in all (registry/row_lock.py).
# 0: neither (a pooler that refuses startup options; set lock_timeout on the role instead).
# PostgreSQL's lock_timeout and statement_timeout, and SQLite's busy timeout, are C ints of
# milliseconds: past 24.8 days PostgreSQL refused every connection ("exceeds integer range"),
# and SQLite's wait silently became 0, under the 100-year ceiling of every other duration.
MAX_MILLISECONDS_S = (2**31 - 1) // 1000
DATABASE_LOCK_TIMEOUT_S = env_float("DATABASE_LOCK_TIMEOUT_S", 10.0, minimum=0.0, maximum=MAX_MILLISECONDS_S)


# Requests one console process runs at once, of each kind (workers' calls, sign-ins,
# changes, reads, streams that read the database),
# and how long one waits for a slot before its 503 (console/request_slots.py): each running
# request holds a thread and a database connection, and nothing else bounded how many.
CONSOLE_MAX_REQUESTS = env_int("CONSOLE_MAX_REQUESTS", 16, minimum=1)
CONSOLE_REQUEST_WAIT_S = env_float("CONSOLE_REQUEST_WAIT_S", 5.0, minimum=0.0)
# A client's time for a request head, and for a body's first bytes (then at least 500 bytes
# a second): console/http_protocol.py and console/body_limit.py.
CONSOLE_CLIENT_WAIT_S = env_float("CONSOLE_CLIENT_WAIT_S", 20.0, minimum=1.0)
# Live feeds one console process keeps open, per user and in all (console/consumers.py):
# every open feed gets every worker report, and 2,000 of one viewer's took a core and
# had the watchdog close everyone's.
LIVE_FEEDS_PER_USER = env_int("LIVE_FEEDS_PER_USER", 8, minimum=1)
LIVE_FEEDS_MAX = env_int("LIVE_FEEDS_MAX", 200, minimum=1)


# What requirements.txt installs a driver for (psycopg, and Python's sqlite3). dj-database-url
# maps many more schemes (mysql, oracle, postgis, cockroach) to engines that are not there.
SUPPORTED_DATABASE_ENGINES = ("django.db.backends.postgresql", "django.db.backends.sqlite3")
DATABASE_EXPECTED = "expected a URL such as postgres://user@host:5432/name or sqlite:////path/db.sqlite3"


def _database() -> dict:
    url = env_secret("DATABASE_URL")  # may carry a password
    # All read whatever the database: a bad value is refused at start, not accepted until
    # the day DATABASE_URL changes.
    conn_max_age_s = env_int("DATABASE_CONN_MAX_AGE_S", 0, minimum=0)
    busy_timeout_s = env_int("SQLITE_BUSY_TIMEOUT_S", 20, minimum=1, maximum=MAX_MILLISECONDS_S)
    connect_timeout_s = env_int("DATABASE_CONNECT_TIMEOUT_S", 3, minimum=2)
    if url:
        # Health checks: a persistent connection broken by an outage is replaced at the
        # next request instead of failing it.
        try:
            database = dj_database_url.parse(url, conn_max_age=conn_max_age_s, conn_health_checks=True)
        except ValueError as error:  # an unknown scheme, a port that is not a number; never the URL: it may hold a password
            raise SettingError(f"DATABASE_URL: {type(error).__name__}: {DATABASE_EXPECTED}") from None
        if database["ENGINE"] not in SUPPORTED_DATABASE_ENGINES:  # mysql:// was a traceback naming a driver never installed
            raise SettingError(f"DATABASE_URL: {urlsplit(url).scheme}:// is not supported (PostgreSQL and SQLite are): {DATABASE_EXPECTED}")
    else:
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": _private_file(DATA_DIR / "db.sqlite3"),
                    "TEST": {"NAME": DATA_DIR / "test-db.sqlite3"}}
    if database["ENGINE"].endswith("sqlite3"):
        # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock at
        # BEGIN so two writers queue on the busy timeout instead of failing mid-way.
        database["OPTIONS"] = {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": busy_timeout_s,
        }
    elif database["ENGINE"].endswith("postgresql"):
        # Without it a database host that drops packets holds each request for libpq's
        # 130 s; with it the request fails fast as a 503. libpq counts 2 s at least.
        database.setdefault("OPTIONS", {})["connect_timeout"] = connect_timeout_s
        # Without it a change waited for a lock as long as anyone held it: a session left
        # idle in a transaction held the generation row 45 s, every traffic change waited
        # (and committed long after the click), and 110 of them used up max_connections,
        # so every page and report failed. Past this a change is a 503 that made nothing.
        if DATABASE_LOCK_TIMEOUT_S > 0:
            options = database["OPTIONS"].get("options", "")
            database["OPTIONS"]["options"] = f"{options} -c lock_timeout={round(DATABASE_LOCK_TIMEOUT_S * 1000)}".strip()
    return database


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Login throttling (django-axes): after LOGIN_FAILURE_LIMIT wrong passwords for one user
# name from one address, that pair is locked out for LOGIN_COOLOFF_S; the login page says so.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("LOGIN_COOLOFF_S", 900, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# An attempt while locked out is refused and not recorded: recorded, each appended its
# query string and form to the record (a row grown to megabytes by an anonymous loop)
# and restarted the pause, so the lockout never ended while the loop went on.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_TEMPLATE = "registration/login.html"
AXES_VERBOSE = False  # its start-up banner is the one line a worker under manage.py serve could not log as JSON

# Browser-facing hardening (docs/security.md). Cookies are Secure outside debug; `make run`
# on a loopback address serves plain http, so runstack sets SECURE_COOKIES=false there.
SECURE_COOKIES = env_bool("SECURE_COOKIES", not DEBUG)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_COOKIES
# Messages can carry a secret shown once (a new inference API key): keep them server-side,
# not in a signed-but-readable cookie.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True  # the pages' scripts read the token from <meta name="csrf-token">
CSRF_FAILURE_VIEW = "console.views.csrf_refused"  # a stale form said as such, never Django's bare page
SESSION_ENGINE = "console.sessions"  # database sessions; a database outage while saving one is a 503, not a 400
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Behind a TLS-terminating proxy: believe its X-Forwarded-Proto, so HSTS and secure
# redirects see https. Only when the proxy always sets (or strips) that header.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("TRUST_X_FORWARDED_PROTO", False) else None
# No inline script or style anywhere; the live feed's ws(s):// origin is added per request.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "frame-ancestors": [NONE],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
    },
}
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "models"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Uploads: stream to the artifact store's temporary folder while hashing.
ARTIFACT_ROOT = env_path("ARTIFACT_ROOT", DATA_DIR / "artifacts").resolve()
MAX_UPLOAD_BYTES = env_int("MAX_UPLOAD_BYTES", 2 * 1024**3, minimum=1)
# No request stages a file part by default: only the upload endpoints, once the caller's
# role is checked, swap in the staging handler (registry/artifacts/upload_handler.py).
FILE_UPLOAD_HANDLERS = ["registry.artifacts.upload_handler.FileFieldsRefused"]
STAGING_MAX_AGE_S = env_float("STAGING_MAX_AGE_S", 600.0, minimum=60.0)
FILE_UPLOAD_TEMP_DIR = str(ARTIFACT_ROOT / "tmp")
Path(FILE_UPLOAD_TEMP_DIR).mkdir(parents=True, exist_ok=True)
INSPECTION_TIMEOUT_S = env_float("INSPECTION_TIMEOUT_S", 120.0, minimum=1.0)
INSPECTION_MEMORY_LIMIT_BYTES = env_int("INSPECTION_MEMORY_LIMIT_BYTES", 0, minimum=0) or None
INSPECTION_CPU_LIMIT_S = env_float("INSPECTION_CPU_LIMIT_S", INSPECTION_TIMEOUT_S, minimum=1.0)
INSPECTION_MAX_CONCURRENT = env_int("INSPECTION_MAX_CONCURRENT", 2, minimum=1)
# Background jobs (registry/jobs/): a running job's runner writes a heartbeat every
# JOB_HEARTBEAT_S; one silent for JOB_STALE_AFTER_S (its Celery worker died) is queued
# again until it has run JOB_MAX_ATTEMPTS times, then failed. JOB_MEMORY_LIMIT_BYTES caps a
# job's child process (0: sized from the model, like an inspection).
JOB_HEARTBEAT_S = env_float("JOB_HEARTBEAT_S", 2.0, minimum=0.1)
JOB_STALE_AFTER_S = env_float("JOB_STALE_AFTER_S", 30.0, minimum=1.0)
if JOB_STALE_AFTER_S < 3 * JOB_HEARTBEAT_S:  # the sweep would take a live job for lost between two heartbeats
    raise SettingError(f"JOB_HEARTBEAT_S={JOB_HEARTBEAT_S:g} with JOB_STALE_AFTER_S={JOB_STALE_AFTER_S:g}: a running job would be taken for "
                       "lost between two heartbeats and run again; keep JOB_STALE_AFTER_S at least 3 × JOB_HEARTBEAT_S "
                       f"({3 * JOB_HEARTBEAT_S:g})")
JOB_MAX_ATTEMPTS = env_int("JOB_MAX_ATTEMPTS", 2, minimum=1)
JOB_SWEEP_INTERVAL_S = env_float("JOB_SWEEP_INTERVAL_S", 10.0, minimum=0.5)
JOB_TIMEOUT_S = env_float("JOB_TIMEOUT_S", 3600.0, minimum=1.0)
JOB_MEMORY_LIMIT_BYTES = env_int("JOB_MEMORY_LIMIT_BYTES", 0, minimum=0) or None
# Jobs that follow a version becoming ready (registry/jobs/scheduling.py), and their
# inputs: a batch job's file and an evaluation data set are streamed to disk, never read
# whole, and refused past their limit (413). Outputs and inputs of finished jobs are
# deleted by retention after JOB_OUTPUT_RETENTION_S.
BENCHMARK_ENABLED = env_bool("BENCHMARK_ENABLED", True)
BENCHMARK_NICE = env_int("BENCHMARK_NICE", 19, minimum=0, maximum=19)
BENCHMARK_SECONDS_PER_SIZE = env_float("BENCHMARK_SECONDS_PER_SIZE", 1.0, minimum=0.01)
# Batch inference and evaluation children yield to serving too, less than a benchmark.
JOB_NICE = env_int("JOB_NICE", 10, minimum=0, maximum=19)
JOB_MAX_INPUT_BYTES = env_int("JOB_MAX_INPUT_BYTES", MAX_UPLOAD_BYTES, minimum=1)
DATASET_MAX_BYTES = env_int("DATASET_MAX_BYTES", 512 * 1024**2, minimum=1)
BATCH_JOB_BATCH_SIZE = env_int("BATCH_JOB_BATCH_SIZE", 256, minimum=1, maximum=4096)
JOB_MAX_OUTPUT_BYTES = env_int("JOB_MAX_OUTPUT_BYTES", 16 * 1024**3, minimum=1024**2)
JOB_OUTPUT_RETENTION_S = env_float("JOB_OUTPUT_RETENTION_S", 7 * 86400.0, minimum=60.0)
RETENTION_KEEP_VERSIONS = env_int("RETENTION_KEEP_VERSIONS", 3, minimum=1)
RETENTION_ROLLBACK_DEPTH = env_int("RETENTION_ROLLBACK_DEPTH", 3, minimum=1)

# Serving control plane.
SERVING_WORKER_TOKEN = _secret("SERVING_WORKER_TOKEN", "worker_token")
SERVING_DEFAULT_MAX_BATCH_SIZE = env_int("SERVING_MAX_BATCH_SIZE", contract.DEFAULT_MAX_BATCH_SIZE, minimum=1, maximum=contract.MAX_BATCH_SIZE)
SERVING_DEFAULT_MAX_QUEUE_DELAY_S = env_float("SERVING_MAX_QUEUE_DELAY_S", contract.DEFAULT_MAX_QUEUE_DELAY_S, minimum=0.0,
                                              maximum=contract.MAX_QUEUE_DELAY_S)
SERVING_DEFAULT_MAX_QUEUE_SIZE = env_int("SERVING_MAX_QUEUE_SIZE", contract.DEFAULT_MAX_QUEUE_SIZE, minimum=1)
SERVING_PUBLIC_URL = (env_url("SERVING_PUBLIC_URL", "", example="http://127.0.0.1:8001")
                      or console_address.recorded(DATA_DIR, console_address.SERVING_FILE_NAME)
                      or "http://127.0.0.1:8001")
# The console a hand-started `manage.py serve` follows when it is given no CONSOLE_URL:
# the address `manage.py runstack` recorded in DATA_DIR, never a default port's.
CONSOLE_URL = env_str("CONSOLE_URL", "") or console_address.recorded(DATA_DIR)
# ...and the Redis that stack's processes share, so such a worker joins its push channel
# too (manage.py serve; only when it follows the recorded console). Not a setting: a record.
STACK_REDIS_URL = console_address.recorded(DATA_DIR, console_address.REDIS_FILE_NAME)
WORKER_GONE_AFTER_S = env_float("WORKER_GONE_AFTER_S", 5.0, minimum=1.0)
# Progressive delivery: how often Celery beat asks the analysis whether a window is due
# (each rollout judges at its own interval_s), and how long per-report samples are kept.
ROLLOUT_TICK_S = env_float("ROLLOUT_TICK_S", 5.0, minimum=0.2)
# A due window left unjudged past three ticks and this slack counts as overdue: the
# analysis has stopped (beat or Redis is down) and the console judges it itself.
ROLLOUT_OVERDUE_SLACK_S = env_float("ROLLOUT_OVERDUE_SLACK_S", 10.0, minimum=0.0)
REPORT_SAMPLE_RETENTION_S = env_float("REPORT_SAMPLE_RETENTION_S", 3600.0, minimum=60.0)
WORKER_FORGET_AFTER_S = env_float("WORKER_FORGET_AFTER_S", 86400.0, minimum=1.0)
# Reports one worker id may send a second, and save up (registry/fleet/report_rate.py).
WORKER_REPORTS_PER_S = env_float("WORKER_REPORTS_PER_S", 10.0, minimum=0.1)
WORKER_REPORT_BURST = env_float("WORKER_REPORT_BURST", 20.0, minimum=1.0)
if WORKER_REPORTS_PER_S * WORKER_GONE_AFTER_S < 3:  # a refused report does not count as seen
    raise SettingError(f"WORKER_REPORTS_PER_S={WORKER_REPORTS_PER_S:g} with WORKER_GONE_AFTER_S={WORKER_GONE_AFTER_S:g}: a worker held "
                       "to it would be shown gone between its accepted reports; keep WORKER_REPORTS_PER_S at least "
                       f"3 / WORKER_GONE_AFTER_S ({3 / WORKER_GONE_AFTER_S:g})")
DRILL_TARGET_S = env_float("DRILL_TARGET_S", 60.0, minimum=0.1)
DRILL_ACK_TIMEOUT_S = env_float("DRILL_ACK_TIMEOUT_S", 10.0, minimum=0.1)

# GET /metrics (console/metrics.py) answers only with this bearer token; unset, it is a 404.
CONSOLE_METRICS_TOKEN = env_secret("CONSOLE_METRICS_TOKEN")

REDIS_URL = env_redis_url("REDIS_URL")  # may carry a password (masked when refused)
# Channels groups ("serving", "live") are global to a Redis database: deployments that
# share one Redis keep apart by prefix, or one's workers would apply the other's states.
CHANNEL_LAYER_PREFIX = env_str("CHANNEL_LAYER_PREFIX", "modelops")
# A relay or a push a request makes waits no longer than this: workers reconcile, pages poll.
CHANNEL_SEND_TIMEOUT_S = 2.0
if REDIS_URL:
    CHANNEL_LAYERS = redis_options.channel_layers(REDIS_URL, CHANNEL_LAYER_PREFIX)
else:
    # Only for one-process use (manage.py shell, unit tests without Redis): the run
    # command always starts or connects to a Redis server and sets REDIS_URL.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_BROKER_TRANSPORT_OPTIONS = redis_options.broker_transport_options(CHANNEL_LAYER_PREFIX) if REDIS_URL else {}
# One retry, not Celery's three: a job whose send fails stays queued and the sweep sends it again.
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}
CELERY_RESULT_BACKEND = None
# JSON only, said here rather than left to Celery's default: a pickled message from
# whoever holds the Redis password would run code in every Celery worker.
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_ACKS_LATE = True
# Jobs bound their own time (JOB_TIMEOUT_S, per child); Celery's hard limit backs it up.
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT_S", int(JOB_TIMEOUT_S) + 60, minimum=1)
if CELERY_TASK_TIME_LIMIT <= JOB_TIMEOUT_S:  # Celery would kill a job before its own timeout: "lost its worker", not "timed out"
    raise SettingError(f"CELERY_TASK_TIME_LIMIT_S={CELERY_TASK_TIME_LIMIT} with JOB_TIMEOUT_S={JOB_TIMEOUT_S:g}: Celery would kill a job "
                       "before its own timeout ends it, and the job would read as lost, not timed out; keep CELERY_TASK_TIME_LIMIT_S "
                       "above JOB_TIMEOUT_S (unset, it is JOB_TIMEOUT_S + 60)")
# A task whose pool process dies is queued again (the job's claim makes a rerun safe).
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# One task at a time per pool process: a long batch job must not hold others it prefetched.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Jobs run on their own queue and worker: a long batch job must never hold up the canary
# analysis tick, retention or the job sweep, which stay on the default queue ("celery").
JOBS_QUEUE = "jobs"
CELERY_TASK_ROUTES = {"registry.tasks.run_job": {"queue": JOBS_QUEUE}}
CELERY_BEAT_SCHEDULE = {
    "apply-retention": {"task": "registry.tasks.apply_retention", "schedule": env_float("RETENTION_INTERVAL_S", 3600.0, minimum=10.0)},
    "sweep-staging": {"task": "registry.tasks.sweep_staging", "schedule": env_float("STAGING_SWEEP_INTERVAL_S", 300.0, minimum=10.0)},
    "sweep-jobs": {"task": "registry.tasks.sweep_jobs", "schedule": JOB_SWEEP_INTERVAL_S, "options": {"expires": JOB_SWEEP_INTERVAL_S}},
    "analyse-rollouts": {"task": "registry.tasks.analyse_rollouts", "schedule": ROLLOUT_TICK_S, "options": {"expires": ROLLOUT_TICK_S}},
    "abandon-stale-drills": {"task": "registry.tasks.abandon_stale_drills", "schedule": 30.0, "options": {"expires": 30.0}},
    "prune-sign-in-records": {"task": "console.tasks.prune_sign_in_records",
                              "schedule": env_float("SIGN_IN_PRUNE_INTERVAL_S", 3600.0, minimum=10.0)},
}
# Successful sign-ins kept in django-axes' access log (console/sign_in_records.py).
ACCESS_LOG_RETENTION_S = env_int("ACCESS_LOG_RETENTION_S", 90 * 24 * 3600, minimum=60)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["registry.api.permissions.IsOperatorOrReadOnly"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "registry.api.errors.exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "registry.api.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
        "rest_framework.parsers.FormParser",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "ModelOps console API",
    "DESCRIPTION": "Registry, gray release and rollback for ONNX models.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema maps every endpoint and field: signed-in users only (401 otherwise).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # A request's schema apart from its answer's: file fields are `format: binary` (a
    # generated client sends a file), where one shared schema typed them as URLs.
    "COMPONENT_SPLIT_REQUEST": True,
    # Several models have a `status`: each enum is named for its model, not a hash.
    "ENUM_NAME_OVERRIDES": {
        "VersionStatusEnum": "registry.domain.choices.VersionStatus",
        "DrillStatusEnum": "registry.domain.choices.DrillStatus",
        "RolloutStatusEnum": "registry.domain.choices.RolloutStatus",
        "JobStatusEnum": "registry.domain.choices.JobStatus",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # A client decides how often a bad Host header, a CSRF refusal or a failed login is
    # logged: each place in the code writes at most a few such lines a window (serving.log_throttle).
    "filters": {"repeats": {"()": "serving.log_throttle.RepeatThrottle"},
                "security": {"()": "console.log_filters.SecurityWithoutTraceback"}},
    "formatters": {"plain": {"()": "serving.log_throttle.SuppressedFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["security", "repeats"], "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_choice("LOG_LEVEL", "info", ("debug", "info", "warning", "error", "critical")).upper()},
    # uvicorn's own lines ("Invalid HTTP request received.", one per malformed request) through
    # the same handler: uvicorn configured its loggers before Django, and the last configuration
    # wins. Only uvicorn.error: configuring "uvicorn" would reset its child uvicorn.access and
    # undo --no-access-log (an access line quotes the whole path, 8 KB for an 8,000-character one).
    "loggers": {"django.request": {"level": "ERROR"},
                "uvicorn.error": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}
