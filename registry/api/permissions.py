from __future__ import annotations

import hmac

from django.conf import settings
from rest_framework import authentication, exceptions, permissions

from registry.domain.roles import can_operate


def is_worker(user) -> bool:
    return getattr(user, "is_worker", False) is True


class IsOperatorOrReadOnly(permissions.BasePermission):
    """Any signed-in person reads; only operators and admins change anything. The worker
    token is never a person: it is refused here even where a view authenticates it."""

    message = "your role may only read: operators and admins make changes"

    def has_permission(self, request, view) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        if is_worker(request.user):
            self.message = "the worker token only reads state, downloads artifacts, acks and reports"
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        return can_operate(request.user)


class IsOperator(IsOperatorOrReadOnly):
    """Operators and admins only, reading too: for what holds an operator's own data."""

    def has_permission(self, request, view) -> bool:
        return super().has_permission(request, view) and can_operate(request.user)


class WorkerUser:
    """The identity of a serving worker that presented the shared worker token."""

    is_authenticated = True
    is_active = True
    is_superuser = False
    is_staff = False
    is_worker = True
    pk = None
    username = "serving-worker"


def is_worker_token(token: bytes) -> bool:
    """Whether ``token`` is SERVING_WORKER_TOKEN (in constant time)."""
    return hmac.compare_digest(token, settings.SERVING_WORKER_TOKEN.encode())


def carries_worker_token(authorization: bytes) -> bool:
    """Whether an ``Authorization`` header's value is ``Bearer <SERVING_WORKER_TOKEN>``."""
    words = authorization.split()
    return len(words) == 2 and words[0].lower() == b"bearer" and is_worker_token(words[1])


class WorkerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <SERVING_WORKER_TOKEN>``, for workers only."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("malformed Bearer header")
        if not is_worker_token(header[1]):
            raise exceptions.AuthenticationFailed("invalid worker token")
        return WorkerUser(), None

    def authenticate_header(self, request) -> str:
        return self.keyword


class IsWorkerOrStaff(permissions.BasePermission):
    """Reading what workers read: the worker token, or staff looking into the fleet."""

    message = "only serving workers and staff read this"

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(is_worker(user) or (user and user.is_authenticated and user.is_staff))


class IsWorker(permissions.BasePermission):
    """What only a worker does (acks, reports, reading API-key digests): never a person."""

    message = "only serving workers (the worker token) may do this"

    def has_permission(self, request, view) -> bool:
        return is_worker(request.user)
