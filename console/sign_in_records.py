"""Retention for what signing in leaves in the database: Django's sessions and
django-axes' access log.

Each sign-in adds a session row and an AccessLog row, and neither was ever removed: a
session outlives its expiry until someone runs `clearsessions`, and axes keeps every
AccessLog row. Any user, a viewer included, could grow both tables without bound (an
audit: 20 sign-ins, +20 rows in each). Celery beat runs `prune` every
`SIGN_IN_PRUNE_INTERVAL_S`; failed attempts (AccessAttempt) are axes' own to expire,
after LOGIN_COOLOFF_S.
"""

from __future__ import annotations

from datetime import timedelta
from importlib import import_module

from axes.models import AccessLog
from django.conf import settings
from django.utils import timezone


def prune(now=None) -> dict[str, int]:
    """Delete expired sessions and access-log rows older than ACCESS_LOG_RETENTION_S; the
    number of each deleted. Idempotent."""
    now = now or timezone.now()
    sessions = import_module(settings.SESSION_ENGINE).SessionStore.get_model_class()  # clear_expired's rows, at `now`
    expired_sessions, _ = sessions.objects.filter(expire_date__lt=now).delete()
    cutoff = now - timedelta(seconds=settings.ACCESS_LOG_RETENTION_S)
    old_access_logs, _ = AccessLog.objects.filter(attempt_time__lt=cutoff).delete()
    return {"sessions": expired_sessions, "access_logs": old_access_logs}
