"""The admin role includes the Django admin: admin-group members become superusers."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

pytestmark = pytest.mark.django_db


def test_adding_a_user_to_the_admin_group_lets_them_manage_users(client):
    user = User.objects.create_user("alma", password="pw-alma")

    user.groups.add(Group.objects.get_or_create(name="admin")[0])

    user.refresh_from_db()
    assert (user.is_staff, user.is_superuser) == (True, True)
    client.force_login(user)
    assert client.get("/admin/auth/user/").status_code == 200


def test_adding_members_from_the_group_side_makes_them_superusers():
    users = [User.objects.create_user(name) for name in ("bo", "cy")]

    Group.objects.get_or_create(name="admin")[0].user_set.add(*users)

    assert list(User.objects.filter(username__in=["bo", "cy"]).values_list("is_superuser", flat=True)) == [True, True]


def test_other_groups_grant_nothing_in_the_django_admin():
    user = User.objects.create_user("dee")

    user.groups.add(Group.objects.get_or_create(name="operator")[0])

    user.refresh_from_db()
    assert (user.is_staff, user.is_superuser) == (False, False)
