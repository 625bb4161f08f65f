"""The admin role includes the Django admin, through the admin group's permissions and
``is_staff``; leaving the group, from either side, by remove, clear or deleting the
group, takes back everything joining gave."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

pytestmark = pytest.mark.django_db

USER_PERMISSIONS = ("auth.view_user", "auth.add_user", "auth.change_user", "auth.delete_user", "auth.change_group")


def admin_group() -> Group:
    return Group.objects.get(name="admin")  # made after every migrate, with its permissions


def manages_users(user: User) -> bool:
    """Through the public surface: the Django admin's user list, and the permissions."""
    fresh = User.objects.get(pk=user.pk)  # no cached permissions
    client = Client()
    client.force_login(fresh)
    return client.get("/admin/auth/user/").status_code == 200 and all(fresh.has_perm(name) for name in USER_PERMISSIONS)


def flags(user: User) -> tuple[bool, bool]:
    user.refresh_from_db()
    return user.is_staff, user.is_superuser


def test_adding_a_user_to_the_admin_group_lets_them_manage_users():
    user = User.objects.create_user("alma")

    user.groups.add(admin_group())

    assert manages_users(user)
    assert flags(user) == (True, False)


def test_an_admin_manages_the_prediction_apis_keys_in_the_django_admin():
    """As the README says: a member of the admin group who is no superuser was refused
    (403) the API-key pages, the group holding no registry permission."""
    user = User.objects.create_user("ines")
    user.groups.add(admin_group())
    client = Client()
    client.force_login(User.objects.get(pk=user.pk))

    pages = [client.get(url).status_code for url in ("/admin/registry/inferenceapikey/", "/admin/registry/inferenceapikey/add/")]

    assert pages == [200, 200]
    assert User.objects.get(pk=user.pk).has_perms(["registry.add_inferenceapikey", "registry.change_inferenceapikey"])
    assert not User.objects.get(pk=user.pk).has_perm("registry.change_release")  # registry data changes only through the console


def test_adding_members_from_the_group_side_lets_them_manage_users():
    users = [User.objects.create_user(name) for name in ("bo", "cy")]

    admin_group().user_set.add(*users)

    assert [manages_users(user) for user in users] == [True, True]
    assert [flags(user) for user in users] == [(True, False), (True, False)]


@pytest.mark.parametrize("leave", [
    pytest.param(lambda user: user.groups.remove(admin_group()), id="user.groups.remove"),
    pytest.param(lambda user: admin_group().user_set.remove(user), id="group.user_set.remove"),
    pytest.param(lambda user: user.groups.clear(), id="user.groups.clear"),
    pytest.param(lambda user: admin_group().user_set.clear(), id="group.user_set.clear"),
    pytest.param(lambda user: user.groups.set([Group.objects.get(name="operator")]), id="user.groups.set"),
    pytest.param(lambda user: admin_group().delete(), id="group.delete"),
])
def test_leaving_the_admin_group_takes_back_what_joining_gave(leave):
    user = User.objects.create_user("dana")
    user.groups.add(admin_group())
    assert manages_users(user)

    leave(user)

    assert not manages_users(user)
    assert flags(user) == (False, False)


def test_a_saved_instance_does_not_write_staff_back_after_leaving():
    user = User.objects.create_user("eli")
    user.groups.add(admin_group())
    user.groups.remove(admin_group())

    user.first_name = "Eli"
    user.save()

    assert flags(user) == (False, False)


def test_a_user_created_as_superuser_keeps_it_when_leaving_the_admin_group():
    user = User.objects.create_superuser("root", "", "unused-password-41")
    user.groups.add(admin_group())

    user.groups.remove(admin_group())

    assert flags(user) == (True, True)
    assert manages_users(user)


def test_other_groups_grant_nothing_in_the_django_admin():
    user = User.objects.create_user("fay")

    user.groups.add(Group.objects.get(name="operator"), Group.objects.get(name="viewer"))

    assert flags(user) == (False, False)
    assert not manages_users(user)
