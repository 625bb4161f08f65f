"""What signing in leaves in the database is pruned on a schedule: expired sessions, and
django-axes' access-log rows past ACCESS_LOG_RETENTION_S. Live sessions and recent rows stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessLog
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from console.sign_in_records import prune
from console.tasks import prune_sign_in_records

pytestmark = pytest.mark.django_db


def sign_in(user, password: str = "a-long-test-password-1") -> Client:
    client = Client()
    assert client.post("/login/", {"username": user.username, "password": password}).status_code == 302
    return client


@pytest.fixture
def signed_in_twice(viewer):
    viewer.set_password("a-long-test-password-1")
    viewer.save()
    return sign_in(viewer), sign_in(viewer)


def test_each_sign_in_leaves_a_session_and_an_access_log_row(signed_in_twice):
    assert Session.objects.count() == 2
    assert AccessLog.objects.count() == 2


def test_expired_sessions_are_deleted_and_live_ones_kept(signed_in_twice):
    first, second = signed_in_twice
    Session.objects.filter(session_key=first.cookies["sessionid"].value).update(expire_date=timezone.now() - timedelta(seconds=1))

    deleted = prune()

    assert deleted["sessions"] == 1
    assert list(Session.objects.values_list("session_key", flat=True)) == [second.cookies["sessionid"].value]
    assert second.get("/").status_code == 200  # still signed in


def test_access_log_rows_past_the_retention_are_deleted(settings, signed_in_twice):
    settings.ACCESS_LOG_RETENTION_S = 3600
    old = AccessLog.objects.order_by("id").first()
    AccessLog.objects.filter(pk=old.pk).update(attempt_time=timezone.now() - timedelta(seconds=3601))

    deleted = prune()

    assert deleted["access_logs"] == 1
    assert AccessLog.objects.count() == 1 and not AccessLog.objects.filter(pk=old.pk).exists()


def test_pruning_twice_deletes_nothing_more(signed_in_twice):
    prune(timezone.now() + timedelta(days=400))

    assert prune(timezone.now() + timedelta(days=400)) == {"sessions": 0, "access_logs": 0}


def test_celery_beat_prunes_sign_in_records_every_hour(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["prune-sign-in-records"]

    assert entry["task"] == prune_sign_in_records.name
    assert entry["schedule"] == 3600.0
