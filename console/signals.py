"""Role upkeep: admin-group membership and ``is_staff`` move together, whichever side
of the many-to-many changes (``user.groups`` or ``group.user_set``), by add, remove,
clear or deleting the group; the groups and their permissions exist after every
migrate; a user's sessions end when their active flag changes. The rules are
``registry.domain.roles``' and ``registry.actions.users``'; this module only listens."""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.db.models.signals import m2m_changed, post_delete, post_migrate, pre_delete, pre_save
from django.dispatch import receiver

from registry.actions import users
from registry.domain import roles


@receiver(pre_save, sender=User)
def active_flag_change_ends_sessions(sender, instance, update_fields=None, **kwargs):
    """Whichever way the flag changes (the console's Users & roles, the Django admin's
    Active box, a shell): the Django admin's left a deactivated user's sessions to come
    back at their reactivation."""
    if instance.pk is None or (update_fields is not None and "is_active" not in update_fields):
        return  # a sign-in saves last_login alone
    stored = User.objects.filter(pk=instance.pk).values_list("is_active", flat=True).first()
    if stored is not None and stored != instance.is_active:
        users.end_sessions(instance)


@receiver(post_migrate)
def create_role_groups(sender, **kwargs):
    # After each app's migrations (idempotent): the permissions of the apps the admin
    # group needs are created in their own post_migrate, in INSTALLED_APPS order.
    roles.ensure_role_groups()


@receiver(m2m_changed, sender=User.groups.through)
def admin_membership_sets_staff(sender, instance, action, reverse, pk_set, **kwargs):
    if action == "pre_clear":
        instance._admin_members_before_clear = _admin_members(instance, reverse)
        return
    if action == "post_clear":
        user_ids = instance.__dict__.pop("_admin_members_before_clear", [])
    elif action in ("post_add", "post_remove"):
        user_ids = _touched_admins(instance, reverse, pk_set)
    else:
        return
    roles.sync_admin_staff(user_ids)
    if not reverse and instance.pk in user_ids:
        instance.refresh_from_db(fields=["is_staff"])  # so a later save() keeps it


def _touched_admins(instance, reverse: bool, pk_set) -> list[int]:
    """Users whose admin membership this add or remove changed."""
    if reverse:  # group.user_set.add(...): instance is the group, pk_set its users
        return list(pk_set) if instance.name == roles.ADMIN else []
    return [instance.pk] if Group.objects.filter(pk__in=pk_set, name=roles.ADMIN).exists() else []


def _admin_members(instance, reverse: bool) -> list[int]:
    """Before a clear: the users it will take out of the admin group."""
    if reverse:
        return list(instance.user_set.values_list("pk", flat=True)) if instance.name == roles.ADMIN else []
    return [instance.pk] if instance.groups.filter(name=roles.ADMIN).exists() else []


@receiver(pre_delete, sender=Group)
def remember_admin_members(sender, instance, **kwargs):
    if instance.name == roles.ADMIN:
        instance._admin_members_before_delete = list(instance.user_set.values_list("pk", flat=True))


@receiver(post_delete, sender=Group)
def revoke_staff_of_deleted_admin_group(sender, instance, **kwargs):
    roles.sync_admin_staff(instance.__dict__.pop("_admin_members_before_delete", []))
