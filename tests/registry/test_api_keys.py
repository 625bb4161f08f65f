"""Inference API keys in the console: created once, stored hashed, revoked, served to workers."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.contrib.sessions.models import Session
from rest_framework.test import APIClient

from registry.actions import api_keys
from registry.models import InferenceApiKey

pytestmark = pytest.mark.django_db
KEYS_URL = "/api/serving/api-keys"


@pytest.fixture
def staff_client(admin_user, client):
    client.force_login(admin_user)
    return client


def test_created_key_is_returned_once_and_only_its_sha256_is_stored(admin_user):
    row, key = api_keys.create_key("  billing service ", admin_user)

    stored = InferenceApiKey.objects.get()
    assert key.startswith("mk_") and len(key) > 40
    assert (stored.name, stored.prefix, stored.created_by) == ("billing service", key[:12], admin_user)
    assert stored.key_sha256 == hashlib.sha256(key.encode()).hexdigest()
    assert key not in str([getattr(stored, field.attname) for field in InferenceApiKey._meta.fields])
    assert row.pk == stored.pk and stored.revoked_at is None


def test_two_keys_never_share_a_value(admin_user):
    _, first = api_keys.create_key("a", admin_user)
    _, second = api_keys.create_key("a", admin_user)

    assert first != second
    assert InferenceApiKey.objects.count() == 2


@pytest.mark.parametrize(("name", "error"), [("", "needs a name"), ("   ", "needs a name"), ("x" * 101, "too long")])
def test_key_without_a_usable_name_is_refused_and_nothing_stored(name, error):
    with pytest.raises(api_keys.ApiKeyError, match=error):
        api_keys.create_key(name)

    assert not InferenceApiKey.objects.exists()


def test_revoked_key_leaves_the_active_digests_and_revoking_twice_changes_nothing(admin_user):
    kept, _ = api_keys.create_key("kept", admin_user)
    gone, _ = api_keys.create_key("gone", admin_user)

    assert api_keys.revoke_key(gone, admin_user) is True
    revoked_at = InferenceApiKey.objects.get(pk=gone.pk).revoked_at
    assert api_keys.revoke_key(gone, admin_user) is False

    assert api_keys.active_digests() == [kept.key_sha256]
    assert InferenceApiKey.objects.get(pk=gone.pk).revoked_at == revoked_at


def test_workers_read_the_active_digests(worker_client, admin_user):
    kept, _ = api_keys.create_key("kept", admin_user)
    gone, _ = api_keys.create_key("gone", admin_user)
    api_keys.revoke_key(gone)

    response = worker_client.get(KEYS_URL)

    assert response.status_code == 200
    assert response.json() == {"sha256": [kept.key_sha256]}


def test_users_cannot_read_the_digests_not_even_admins(operator_client, admin_user):
    api_keys.create_key("kept", admin_user)
    admin_client = APIClient()
    admin_client.force_authenticate(admin_user)

    assert operator_client.get(KEYS_URL).status_code == 403
    assert admin_client.get(KEYS_URL).status_code == 403
    assert APIClient().get(KEYS_URL).status_code == 401
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Bearer not-the-worker-token")
    assert wrong.get(KEYS_URL).status_code == 401


def test_admin_creates_a_key_and_sees_it_once_on_the_answer_itself(staff_client):
    response = staff_client.post("/admin/registry/inferenceapikey/add/", {"name": "mobile app"})

    assert response.status_code == 200
    row = InferenceApiKey.objects.get()
    key = re.search(r'<code id="new-api-key"[^>]*>([^<]+)</code>', response.content.decode()).group(1)
    assert hashlib.sha256(key.encode()).hexdigest() == row.key_sha256
    assert "no-store" in response["Cache-Control"]
    again = staff_client.get(f"/admin/registry/inferenceapikey/{row.pk}/change/").content.decode()
    assert row.prefix in again and key not in again


def test_a_new_key_is_kept_in_no_session(staff_client):
    # Shown in a message, it sat in clear in django_session until a page read it (two weeks if none did).
    response = staff_client.post("/admin/registry/inferenceapikey/add/", {"name": "mobile app"})
    key = re.search(r'<code id="new-api-key"[^>]*>([^<]+)</code>', response.content.decode()).group(1)

    assert not [message for message in get_messages(response.wsgi_request) if key in str(message)]
    assert all(key not in session.get_decoded().__repr__() for session in Session.objects.all())


def test_admin_revokes_keys_with_the_action(staff_client, admin_user):
    row, _ = api_keys.create_key("old", admin_user)

    response = staff_client.post("/admin/registry/inferenceapikey/",
                                 {"action": "revoke", "_selected_action": [row.pk]})

    assert response.status_code == 302
    assert InferenceApiKey.objects.get(pk=row.pk).revoked_at is not None
    assert api_keys.active_digests() == []


def test_admin_cannot_delete_or_edit_a_key(staff_client, admin_user):
    row, _ = api_keys.create_key("old", admin_user)

    staff_client.post(f"/admin/registry/inferenceapikey/{row.pk}/change/", {"name": "renamed"})

    assert staff_client.get(f"/admin/registry/inferenceapikey/{row.pk}/delete/").status_code == 403
    assert InferenceApiKey.objects.get(pk=row.pk).name == "old"


def test_non_staff_cannot_reach_the_key_admin(client, operator):
    client.force_login(operator)

    response = client.post("/admin/registry/inferenceapikey/add/", {"name": "sneaky"})

    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert not InferenceApiKey.objects.exists()
    assert not User.objects.get(pk=operator.pk).is_staff
