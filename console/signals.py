"""Role upkeep: members of the admin group become Django superusers (staff with every
permission), so "admin" includes managing users in the Django admin, as the roles promise."""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.db.models.signals import m2m_changed
from django.dispatch import receiver

from registry.roles import ADMIN


@receiver(m2m_changed, sender=User.groups.through)
def admin_group_members_are_superusers(sender, instance, action, reverse, pk_set, **kwargs):
    if action != "post_add" or not pk_set:
        return
    if reverse:  # group.user_set.add(...): instance is the group
        if instance.name == ADMIN:
            User.objects.filter(pk__in=pk_set).update(is_staff=True, is_superuser=True)
        return
    if Group.objects.filter(pk__in=pk_set, name=ADMIN).exists() and not instance.is_superuser:
        instance.is_staff = instance.is_superuser = True
        instance.save(update_fields=["is_staff", "is_superuser"])
