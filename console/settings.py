"""Django settings. Every value comes from the environment (see the README table)."""

from __future__ import annotations

import secrets
from pathlib import Path

import dj_database_url

from console.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("DATA_DIR", str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret(name: str, file_name: str) -> str:
    """An explicit value wins; otherwise one generated once and kept in DATA_DIR, so
    every process started from the same checkout agrees on it."""
    explicit = env_str(name)
    if explicit:
        return explicit
    path = DATA_DIR / file_name
    if not path.exists():
        path.write_text(secrets.token_urlsafe(40))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret("DJANGO_SECRET_KEY", "secret_key")
DEBUG = env_bool("DJANGO_DEBUG", False)
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
    "registry",
    "serving",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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


def _database() -> dict:
    url = env_str("DATABASE_URL")
    if url:
        database = dj_database_url.parse(url, conn_max_age=env_int("DATABASE_CONN_MAX_AGE_S", 0))
    else:
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": DATA_DIR / "db.sqlite3", "TEST": {"NAME": DATA_DIR / "test-db.sqlite3"}}
    if database["ENGINE"].endswith("sqlite3"):
        # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock at
        # BEGIN so two writers queue on the busy timeout instead of failing mid-way.
        database["OPTIONS"] = {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": env_int("SQLITE_BUSY_TIMEOUT_S", 20, minimum=1),
        }
    return database


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
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
ARTIFACT_ROOT = Path(env_str("ARTIFACT_ROOT", str(DATA_DIR / "artifacts"))).resolve()
MAX_UPLOAD_BYTES = env_int("MAX_UPLOAD_BYTES", 2 * 1024**3, minimum=1)
FILE_UPLOAD_HANDLERS = ["registry.upload_handler.HashingUploadHandler"]
FILE_UPLOAD_TEMP_DIR = str(ARTIFACT_ROOT / "tmp")
Path(FILE_UPLOAD_TEMP_DIR).mkdir(parents=True, exist_ok=True)
INSPECTION_TIMEOUT_S = env_float("INSPECTION_TIMEOUT_S", 120.0, minimum=1.0)
INSPECTION_MEMORY_LIMIT_BYTES = env_int("INSPECTION_MEMORY_LIMIT_BYTES", 0, minimum=0) or None
RETENTION_KEEP_VERSIONS = env_int("RETENTION_KEEP_VERSIONS", 3, minimum=1)
RETENTION_ROLLBACK_DEPTH = env_int("RETENTION_ROLLBACK_DEPTH", 3, minimum=1)

# Serving control plane.
SERVING_WORKER_TOKEN = _secret("SERVING_WORKER_TOKEN", "worker_token")
SERVING_DEFAULT_MAX_BATCH_SIZE = env_int("SERVING_MAX_BATCH_SIZE", 32, minimum=1)
SERVING_DEFAULT_MAX_QUEUE_DELAY_S = env_float("SERVING_MAX_QUEUE_DELAY_S", 0.002, minimum=0.0)
SERVING_DEFAULT_MAX_QUEUE_SIZE = env_int("SERVING_MAX_QUEUE_SIZE", 1024, minimum=1)
SERVING_PUBLIC_URL = env_str("SERVING_PUBLIC_URL", "http://127.0.0.1:8001")
WORKER_GONE_AFTER_S = env_float("WORKER_GONE_AFTER_S", 5.0, minimum=1.0)
DRILL_TARGET_S = env_float("DRILL_TARGET_S", 60.0, minimum=0.1)
DRILL_ACK_TIMEOUT_S = env_float("DRILL_ACK_TIMEOUT_S", 10.0, minimum=0.1)

REDIS_URL = env_str("REDIS_URL")
# Channels groups ("serving", "live") are global to a Redis database: deployments that
# share one Redis keep apart by prefix, or one's workers would apply the other's states.
CHANNEL_LAYER_PREFIX = env_str("CHANNEL_LAYER_PREFIX", "modelops")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 1000, "expiry": 30, "prefix": CHANNEL_LAYER_PREFIX},
        }
    }
else:
    # Only for one-process use (manage.py shell, unit tests without Redis): the run
    # command always starts or connects to a Redis server and sets REDIS_URL.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT_S", 600, minimum=1)
CELERY_BEAT_SCHEDULE = {
    "apply-retention": {"task": "registry.tasks.apply_retention", "schedule": env_float("RETENTION_INTERVAL_S", 3600.0, minimum=10.0)},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["registry.api.permissions.IsOperatorOrReadOnly"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "registry.api.errors.exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "rest_framework.parsers.JSONParser",
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
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.request": {"level": "ERROR"}},
}
