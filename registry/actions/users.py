"""People and their roles, as the console's admins manage them: create (with a one-time
password), set the role, deactivate and reactivate, reset a password, issue and revoke
the API token, lift a login lockout. Views only translate; every rule is here.

Rules that keep the console administrable: a role is exactly one of viewer, operator,
admin (``registry.domain.roles``; ``is_staff`` follows the admin group through
console/signals.py, so demoting an admin here takes back the Django admin too); an admin
never deactivates or demotes themself; the last active admin stays. Every change that
could remove an admin first locks the admin group's row, so two admins demoting each
other cannot both succeed.

Passwords and token keys are returned to the caller once and never stored, logged or
audited in clear (Django keeps the password's hash). A one-time password puts its user
in the ``must-change-password`` group (not a role), which sends them to the password
change page at their next sign-in (``console.password_change``) until they pick their own.

Each change is one Django admin ``LogEntry`` (the user's History in the Django admin),
written in the change's transaction, plus a JSON log line: the registry's audit events
belong to a model, and a person is not one.
"""

from __future__ import annotations

import json
import logging
import secrets

from axes.models import AccessAttempt
from axes.utils import reset as reset_login_attempts
from django.conf import settings
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth import SESSION_KEY as SESSION_USER_KEY
from django.contrib.auth.models import Group, User
from django.contrib.contenttypes.models import ContentType
from django.contrib.sessions.models import Session
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables
from rest_framework.authtoken.models import Token

from registry.domain import roles

logger = logging.getLogger("registry.actions.users")

MUST_CHANGE_PASSWORD_GROUP = "must-change-password"
PASSWORD_BYTES = 15  # 20 URL-safe characters, 120 bits


class UserAdminError(ValueError):
    """A change that breaks a rule; ``status`` is the HTTP answer (409: the state forbids it)."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.message, self.status = message, status


# ---------------------------------------------------------------- queries


def is_user_admin(user) -> bool:
    """May manage users here: an active superuser or member of the admin group."""
    return bool(user is not None and user.is_authenticated and user.is_active and roles.role_of(user) == roles.ADMIN)


def active_admin_ids() -> set[int]:
    """The users who can still manage users: active superusers and admin-group members."""
    admins = User.objects.filter(Q(is_superuser=True) | Q(groups__name=roles.ADMIN), is_active=True)
    return set(admins.values_list("pk", flat=True))


def locked_out_usernames() -> set[str]:
    """User names django-axes is refusing now (from at least one address)."""
    since = timezone.now() - settings.AXES_COOLOFF_TIME
    attempts = AccessAttempt.objects.filter(failures_since_start__gte=settings.AXES_FAILURE_LIMIT, attempt_time__gte=since)
    return set(attempts.values_list("username", flat=True))


def must_change_password(user) -> bool:
    return user.groups.filter(name=MUST_CHANGE_PASSWORD_GROUP).exists()


# ---------------------------------------------------------------- changes


@sensitive_variables("password")
def create_user(username: str, email: str, role: str, actor) -> tuple[User, str]:
    """A new active user with ``role`` and a one-time password: (the user, the password)."""
    _check_role(role)
    username = (username or "").strip()
    if not username:
        raise UserAdminError("a user needs a user name", status=400)
    password = _one_time_password()
    with transaction.atomic():
        if User.objects.filter(username__iexact=username).exists():
            raise UserAdminError(f"a user named {username!r} exists already")
        user = User.objects.create_user(username, (email or "").strip(), password)
        user.groups.set([_group(role), _group(MUST_CHANGE_PASSWORD_GROUP)])
        _record(actor, user, ADDITION, f"Created with role {role} and a one-time password", event="user_created", role=role)
    return user, password


def set_role(user: User, role: str, actor) -> bool:
    """``user`` holds exactly ``role``; False when they held it already (nothing changes)."""
    _check_role(role)
    with transaction.atomic():
        _lock_admins()
        before = roles.role_of(user)
        if before == role and _role_groups(user) == {role}:
            return False
        if role != roles.ADMIN:
            _refuse_losing_admin(user, actor, "demote")
        kept = [group for group in user.groups.all() if group.name not in roles.ALL_GROUPS]
        user.groups.set([*kept, _group(role)])
        _record(actor, user, CHANGE, f"Role {before} → {role}", event="user_role_set", role=role, previous=before)
    return True


def deactivate(user: User, actor) -> bool:
    """``user`` can no longer sign in or use their token, and their sessions end for good;
    False when they could not already."""
    with transaction.atomic():
        _lock_admins()
        if not User.objects.get(pk=user.pk).is_active:
            return False
        _refuse_losing_admin(user, actor, "deactivate")
        _set_active(user, False)  # its sessions end (console/signals.py: whichever way it changes)
        _record(actor, user, CHANGE, "Deactivated", event="user_deactivated")
    return True


def reactivate(user: User, actor) -> bool:
    with transaction.atomic():
        if User.objects.get(pk=user.pk).is_active:
            return False
        _set_active(user, True)
        _record(actor, user, CHANGE, "Reactivated", event="user_reactivated")
    return True


@sensitive_variables("password")
def reset_password(user: User, actor) -> str:
    """A new one-time password for ``user`` (returned once); their sessions end, since
    Django ties a session to the password's hash, and so does their API token: a reset is
    what an admin does when the account may be someone else's, and the token still
    answered 200 until it was revoked by hand."""
    password = _one_time_password()
    with transaction.atomic():
        user.set_password(password)
        user.save(update_fields=["password"])
        user.groups.add(_group(MUST_CHANGE_PASSWORD_GROUP))
        revoked = Token.objects.filter(user=user).delete()[0] > 0
        _record(actor, user, CHANGE, "Password reset to a one-time password" + ("; API token revoked" if revoked else ""),
                event="user_password_reset", token_revoked=revoked)
    return password


def password_set_by_admin(user: User, actor) -> None:
    """Another person set ``user``'s password in the Django admin (its own form, which only
    changes the hash): their API token goes too, as with a reset on the Users page, or the
    token of an account an admin took back still answered 201. Called inside the admin's
    transaction, so the password and the token change together."""
    if actor.pk == user.pk:
        return  # one's own password, as on the account page: the token stays theirs
    revoked = Token.objects.filter(user=user).delete()[0] > 0
    if revoked:
        _record(actor, user, CHANGE, "API token revoked with the password set in the Django admin",
                event="user_password_set", token_revoked=True)


def password_changed(user: User) -> None:
    """The user chose their own password: the one-time one is gone."""
    user.groups.remove(_group(MUST_CHANGE_PASSWORD_GROUP))


@sensitive_variables("token")
def rotate_token(user: User, actor) -> str:
    """A new API token key for ``user`` (returned once); any previous key stops working."""
    with transaction.atomic():
        replaced = Token.objects.filter(user=user).delete()[0] > 0
        token = Token.objects.create(user=user)
        _record(actor, user, CHANGE, "API token rotated" if replaced else "API token created", event="user_token_issued", replaced=replaced)
    return token.key


def revoke_token(user: User, actor) -> bool:
    """``user`` has no API token; False when they had none."""
    with transaction.atomic():
        if not Token.objects.filter(user=user).delete()[0]:
            return False
        _record(actor, user, CHANGE, "API token revoked", event="user_token_revoked")
    return True


def unlock(user: User, actor) -> int:
    """Lift django-axes' lockouts of ``user``'s name; how many attempt records went."""
    with transaction.atomic():
        removed = reset_login_attempts(username=user.username)
        if removed:
            _record(actor, user, CHANGE, "Login lockout lifted", event="user_unlocked", attempts=removed)
    return removed


# ---------------------------------------------------------------- helpers


def _check_role(role: str) -> None:
    if role not in roles.ALL_GROUPS:
        raise UserAdminError(f"unknown role {role!r}: one of {', '.join(roles.ALL_GROUPS)}", status=400)


def _one_time_password() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


def _group(name: str) -> Group:
    return Group.objects.get_or_create(name=name)[0]


def _role_groups(user: User) -> set[str]:
    return set(user.groups.filter(name__in=roles.ALL_GROUPS).values_list("name", flat=True))


def _lock_admins() -> None:
    """Serialise the changes that can remove an admin (see the module docstring)."""
    Group.objects.select_for_update().filter(name=roles.ADMIN).first()


def refuse_losing_admin(user: User, actor) -> None:
    """For a change made elsewhere (the Django admin's user form) that takes ``user``'s
    admin rights or sign-in away: the console's rules, refused as UserAdminError."""
    with transaction.atomic():
        _lock_admins()
        if user.pk in active_admin_ids():
            _refuse_losing_admin(user, actor, "deactivate or demote")


def _refuse_losing_admin(user: User, actor, verb: str) -> None:
    if user.pk == getattr(actor, "pk", None):
        raise UserAdminError(f"you cannot {verb} yourself: ask another admin")
    if user.is_superuser and verb == "demote":
        raise UserAdminError(f"{user.username} is a superuser, an admin whatever their group: change that in the Django admin")
    admins = active_admin_ids()
    if user.pk in admins and len(admins) == 1:
        raise UserAdminError(f"{user.username} is the last active admin: make someone else admin first")


def end_sessions(user: User) -> int:
    """Delete ``user``'s sessions, as their active flag changes either way. Django only
    ignores an inactive user's session, so a reactivation brought back every cookie, a
    stolen one included (and one a sign-in racing the deactivation made). No index maps a
    user to their sessions: the live ones are read, fine at a console's scale."""
    live = Session.objects.filter(expire_date__gt=timezone.now())
    theirs = [session.pk for session in live.iterator() if session.get_decoded().get(SESSION_USER_KEY) == str(user.pk)]
    return Session.objects.filter(pk__in=theirs).delete()[0]


def _set_active(user: User, active: bool) -> None:
    user.is_active = active
    user.save(update_fields=["is_active"])


def _record(actor, user: User, flag: int, message: str, *, event: str, **data) -> None:
    LogEntry.objects.create(user_id=actor.pk, content_type=ContentType.objects.get_for_model(User), object_id=str(user.pk),
                            object_repr=user.username[:200], action_flag=flag, change_message=message)
    line = {"event": event, "user": user.username, "by": actor.username, **data}
    transaction.on_commit(lambda: logger.info(json.dumps(line)))

