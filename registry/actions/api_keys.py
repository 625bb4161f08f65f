"""Inference API keys: created by admins, kept only as sha256, revoked, never deleted.

A key is shown once, when it is created (`create_key` returns it); the database holds
its sha256 and a short prefix to recognise it by. Workers fetch the active digests
(`active_digests`, served at `GET /api/serving/api-keys`) and check clients' keys
themselves, so a request never waits on the console. A revoked row stays, so the admin
log and the prefix still say whose key it was.
"""

from __future__ import annotations

import hashlib
import logging
import secrets

from django.db import transaction
from django.utils import timezone

from registry.models import InferenceApiKey

logger = logging.getLogger("registry.actions.api_keys")

KEY_PREFIX = "mk_"  # recognisable in logs and secret scanners
PREFIX_CHARS = 12


class ApiKeyError(ValueError):
    """A key request that breaks a rule (empty or overlong name)."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(name: str, user=None, *, row: InferenceApiKey | None = None) -> tuple[InferenceApiKey, str]:
    """A new active key named `name`: (its row, the key itself, shown to no one again).
    `row` lets the admin's unsaved form instance become the saved key."""
    name = (name or "").strip()
    if not name:
        raise ApiKeyError("a key needs a name (who or what uses it)")
    if len(name) > InferenceApiKey._meta.get_field("name").max_length:
        raise ApiKeyError("the key's name is too long (at most 100 characters)")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = row or InferenceApiKey()
    row.name, row.prefix, row.key_sha256, row.revoked_at = name, key[:PREFIX_CHARS], digest(key), None
    row.created_by = user if user is not None and user.is_authenticated else None
    row.save()
    logger.info('{"event": "api_key_created", "key": %d, "prefix": "%s"}', row.pk, row.prefix)
    return row, key


def revoke_keys(keys, user=None) -> int:
    """Revoke the given active keys (a queryset); returns how many were still active."""
    with transaction.atomic():
        ids = list(keys.filter(revoked_at__isnull=True).select_for_update().order_by("pk").values_list("pk", flat=True))
        InferenceApiKey.objects.filter(pk__in=ids).update(revoked_at=timezone.now())
    for pk in ids:
        logger.info('{"event": "api_key_revoked", "key": %d, "by": "%s"}', pk, getattr(user, "username", ""))
    return len(ids)


def revoke_key(key: InferenceApiKey, user=None) -> bool:
    """Revoke one key; False when it was revoked already (nothing changes)."""
    revoked = revoke_keys(InferenceApiKey.objects.filter(pk=key.pk), user) == 1
    key.refresh_from_db(fields=["revoked_at"])
    return revoked


def active_digests() -> list[str]:
    """The sha256 of every active key, the only thing a worker needs to check one."""
    return sorted(InferenceApiKey.objects.active().values_list("key_sha256", flat=True))
