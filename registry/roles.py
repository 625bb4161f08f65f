"""Roles are Django groups: viewers read; operators upload, change traffic and run
drills; admins (superusers or the admin group) do everything."""

from __future__ import annotations

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ALL_GROUPS = (VIEWER, OPERATOR, ADMIN)


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
