"""Roles are Django groups: viewers read; operators upload, change traffic and run
drills; admins do everything, including managing users in the Django admin.

What the admin group grants is real Django permissions (``ADMIN_PERMISSION_APPS`` and the
registry's ``ADMIN_REGISTRY_MODELS``) plus
``is_staff``, the admin site's door, which ``sync_admin_staff`` keeps equal to membership
(console/signals.py calls it on every change). Nothing is granted by flipping
``is_superuser``, so leaving the group takes back everything joining gave; users created
as superusers (``ensure_login``'s first admin) keep their flag.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission, User
from django.db.models import Q

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ALL_GROUPS = (VIEWER, OPERATOR, ADMIN)

# The Django admin's share of the admin role: users and groups, API tokens, login
# lockouts (to unlock someone) and the prediction API's keys. Other registry data changes
# only through the console.
ADMIN_PERMISSION_APPS = ("auth", "authtoken", "axes")
ADMIN_REGISTRY_MODELS = ("inferenceapikey",)


def can_operate(user) -> bool:
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    if user.is_superuser:
        return True
    return user.groups.filter(name__in=(OPERATOR, ADMIN)).exists()


def role_of(user) -> str:
    if user.is_superuser or user.groups.filter(name=ADMIN).exists():
        return ADMIN
    if user.groups.filter(name=OPERATOR).exists():
        return OPERATOR
    return VIEWER


def ensure_role_groups() -> None:
    """The three groups exist and admin holds its permissions; idempotent."""
    for name in ALL_GROUPS:
        Group.objects.get_or_create(name=name)
    admin = Group.objects.get(name=ADMIN)
    granted = Q(content_type__app_label__in=ADMIN_PERMISSION_APPS) | Q(content_type__app_label="registry", content_type__model__in=ADMIN_REGISTRY_MODELS)
    admin.permissions.add(*Permission.objects.filter(granted))


def sync_admin_staff(user_ids) -> None:
    """``is_staff`` follows admin membership for these users; superusers keep it."""
    users = User.objects.filter(pk__in=list(user_ids), is_superuser=False)
    users.filter(groups__name=ADMIN).update(is_staff=True)
    users.exclude(groups__name=ADMIN).update(is_staff=False)
