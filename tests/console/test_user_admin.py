"""Users and roles managed from the console by admins: who may, the rules that keep an
admin in charge (no self-demotion, the last active admin stays, one role each), and the
secrets (one-time passwords, API token keys) shown once and kept only as hashes or by DRF."""

from __future__ import annotations

import re

import pytest
from axes.models import AccessAttempt
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, User
from django.test import Client
from rest_framework.authtoken.models import Token

from registry.actions import users
from tests.console.conftest import signed_in

pytestmark = pytest.mark.django_db

SECRET = re.compile(r'id="secret" value="([^"]+)"')


def admin_member(username: str) -> User:
    """An admin through the group (not a superuser)."""
    user = User.objects.create_user(username, password="pw-" + username)
    user.groups.add(Group.objects.get(name="admin"))
    return user


def role_groups(user: User) -> set[str]:
    return set(user.groups.filter(name__in=("viewer", "operator", "admin")).values_list("name", flat=True))


def sign_in(username: str, password: str) -> Client:
    client = Client()
    client.post("/login/", {"username": username, "password": password})
    return client


def is_signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def api_status(key: str) -> int:
    return Client().get("/api/models/", HTTP_AUTHORIZATION=f"Token {key}").status_code


def shown_secret(response) -> str:
    return SECRET.search(response.content.decode()).group(1)


# ---------------------------------------------------------------- who may


@pytest.mark.parametrize("persona", ["operator_page", "viewer_page"])
@pytest.mark.parametrize("method, url", [("get", "/users/"), ("get", "/users/new/"), ("post", "/users/new/"), ("get", "/users/{pk}/"),
                                         ("post", "/users/{pk}/role/"), ("post", "/users/{pk}/deactivate/"), ("post", "/users/{pk}/token/"),
                                         ("post", "/users/{pk}/reset-password/")])
def test_non_admins_get_403_and_nothing_changes(request, persona, method, url, viewer):
    client = request.getfixturevalue(persona)
    password_before = User.objects.get(pk=viewer.pk).password

    response = getattr(client, method)(url.format(pk=viewer.pk), {"username": "mallory", "role": "admin"})

    assert response.status_code == 403
    viewer.refresh_from_db()
    assert (viewer.is_active, role_groups(viewer), viewer.password) == (True, {"viewer"}, password_before)
    assert not User.objects.filter(username="mallory").exists() and not Token.objects.filter(user=viewer).exists()


def test_signed_out_visitors_are_sent_to_sign_in():
    response = Client().get("/users/")

    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_admins_see_every_user_with_role_status_and_token(admin_page, operator, viewer):
    Token.objects.create(user=operator)

    html = admin_page.get("/users/").content.decode()

    assert re.search(r'data-user="olivia" data-role="operator" data-active="yes"', html)
    assert re.search(r'data-user="victor" data-role="viewer" data-active="yes"', html)
    assert re.search(r'data-user="ada" data-role="admin"', html)
    row = re.search(r'data-user="olivia".*?</tr>', html, re.DOTALL).group(0)
    assert "olivia@example.com" in row and '<td data-label="API token">yes</td>' in row


# ---------------------------------------------------------------- create


def test_a_new_user_gets_a_one_time_password_shown_once_and_stored_only_hashed(admin_page, admin_user):
    response = admin_page.post("/users/new/", {"username": "nora", "email": "nora@example.com", "role": "viewer"})

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    password = shown_secret(response)
    nora = User.objects.get(username="nora")
    assert role_groups(nora) == {"viewer"} and nora.email == "nora@example.com" and not nora.is_staff
    assert password not in nora.password and nora.password.startswith("pbkdf2_sha256$") and nora.check_password(password)
    assert password not in admin_page.get(f"/users/{nora.pk}/").content.decode()
    assert password not in admin_page.get("/users/").content.decode()
    assert all(password not in entry.change_message for entry in LogEntry.objects.all())


@pytest.mark.parametrize("form, field", [
    ({"username": "has space", "role": "viewer"}, "User name"),
    ({"username": "", "role": "viewer"}, "User name"),
    ({"username": "ok", "role": "root"}, "Role"),
    ({"username": "ok", "role": "viewer", "email": "not-an-email"}, "Email"),
    # Valid as an address, past the column's 254 characters: a 500 on PostgreSQL.
    ({"username": "ok", "role": "viewer", "email": f"{'n' * 60}@{'.'.join(['d' * 63] * 4)}.com"}, "at most 254 characters"),
    ({"username": "Victor", "role": "viewer"}, "exists already"),
])
def test_bad_new_user_input_is_400_with_the_reason_and_creates_nobody(admin_page, viewer, form, field):
    before = User.objects.count()

    response = admin_page.post("/users/new/", form)

    assert response.status_code == 400
    assert 'class="error-text"' in response.content.decode() and field in response.content.decode()
    assert User.objects.count() == before


# ---------------------------------------------------------------- one-time passwords


def test_a_one_time_password_opens_only_the_password_change_until_a_new_one_is_chosen(admin_page):
    password = shown_secret(admin_page.post("/users/new/", {"username": "nora", "role": "operator"}))
    client = sign_in("nora", password)

    refused = client.get("/")
    reused = client.post("/account/password/", {"old_password": password, "new_password1": password, "new_password2": password})
    changed = client.post("/account/password/", {"old_password": password, "new_password1": "quiet-harbour-47", "new_password2": "quiet-harbour-47"})

    assert refused.status_code == 302 and refused["Location"] == "/account/password/"
    assert reused.status_code == 200 and "other than the one you signed in with" in reused.content.decode()
    assert changed.status_code == 302 and client.get("/").status_code == 200
    assert not users.must_change_password(User.objects.get(username="nora"))
    assert is_signed_in(sign_in("nora", "quiet-harbour-47")) and not is_signed_in(sign_in("nora", password))


def test_before_a_new_password_is_chosen_the_api_answers_a_json_403_naming_the_page_not_a_redirect(admin_page):
    client = sign_in("nora", shown_secret(admin_page.post("/users/new/", {"username": "nora", "role": "operator"})))

    read = client.get("/api/models/")
    change = client.post("/api/models/", {"name": "x"}, content_type="application/json")

    for refused in (read, change):
        assert refused.status_code == 403 and refused["Content-Type"] == "application/json"
        assert "must choose its own" in refused.json()["error"] and "/account/password/" in refused.json()["error"]


def test_a_password_reset_ends_the_users_sessions_and_gives_a_new_one_time_password(admin_page, viewer):
    session = sign_in("victor", "pw-victor")

    response = admin_page.post(f"/users/{viewer.pk}/reset-password/")

    password = shown_secret(response)
    assert session.get("/").status_code == 302  # the old session is over
    assert not is_signed_in(sign_in("victor", "pw-victor"))
    fresh = sign_in("victor", password)
    assert is_signed_in(fresh) and fresh.get("/")["Location"] == "/account/password/"
    assert password not in User.objects.get(pk=viewer.pk).password


def test_a_password_reset_revokes_the_users_api_token(admin_page, viewer):
    """A reset is for an account that may be someone else's: the token answered 200 after it."""
    key = Token.objects.create(user=viewer).key

    admin_page.post(f"/users/{viewer.pk}/reset-password/")

    assert api_status(key) == 401
    assert "API token revoked" in LogEntry.objects.filter(object_id=str(viewer.pk)).latest("action_time").change_message


def test_a_password_set_in_the_django_admin_revokes_the_users_api_token(admin_page, operator):
    """Django's own password form changed only the hash: an operator's old token still rolled back a model (201)."""
    key = Token.objects.create(user=operator).key

    response = admin_page.post(f"/admin/auth/user/{operator.pk}/password/",
                               {"password1": "a-Long-new-pass-9371", "password2": "a-Long-new-pass-9371", "usable_password": "true"})

    assert response.status_code == 302
    assert User.objects.get(pk=operator.pk).check_password("a-Long-new-pass-9371")
    assert api_status(key) == 401
    assert "API token revoked" in LogEntry.objects.filter(object_id=str(operator.pk)).latest("action_time").change_message


def test_an_admin_setting_their_own_password_in_the_django_admin_keeps_their_token(admin_page):
    """As on the account page: one's own password change is not an account taken back."""
    admin = User.objects.get(pk=admin_page.session["_auth_user_id"])
    key = Token.objects.create(user=admin).key

    admin_page.post(f"/admin/auth/user/{admin.pk}/password/",
                    {"password1": "a-Long-new-pass-9371", "password2": "a-Long-new-pass-9371", "usable_password": "true"})

    assert User.objects.get(pk=admin.pk).check_password("a-Long-new-pass-9371")
    assert api_status(key) == 200


def test_a_refused_password_in_the_django_admin_keeps_the_token(admin_page, operator):
    key = Token.objects.create(user=operator).key

    response = admin_page.post(f"/admin/auth/user/{operator.pk}/password/", {"password1": "x", "password2": "y", "usable_password": "true"})

    assert response.status_code == 200  # the form again, with its errors
    assert api_status(key) == 200


# ---------------------------------------------------------------- roles


def test_setting_a_role_leaves_exactly_that_role_and_staff_follows_admin(admin_page, operator):
    extra = Group.objects.create(name="on-call")
    operator.groups.add(extra)

    admin_page.post(f"/users/{operator.pk}/role/", {"role": "admin"})
    operator.refresh_from_db()
    as_admin = (role_groups(operator), operator.is_staff)
    admin_page.post(f"/users/{operator.pk}/role/", {"role": "viewer"})
    operator.refresh_from_db()

    assert as_admin == ({"admin"}, True)
    assert (role_groups(operator), operator.is_staff) == ({"viewer"}, False)
    assert operator.groups.filter(pk=extra.pk).exists()  # groups that are not roles stay


def test_the_role_confirmation_changes_nothing_until_posted(admin_page, operator):
    response = admin_page.get(f"/users/{operator.pk}/role/", {"role": "viewer"})

    assert response.status_code == 200 and "Change olivia&#x27;s role?" in response.content.decode()
    assert role_groups(operator) == {"operator"}


def test_an_unknown_role_is_400_and_changes_nothing(admin_page, operator):
    response = admin_page.post(f"/users/{operator.pk}/role/", {"role": "root"})

    assert response.status_code == 400
    assert role_groups(operator) == {"operator"}


def test_an_admin_cannot_demote_themself(admin_user):
    bea = admin_member("bea")

    response = signed_in(bea).post(f"/users/{bea.pk}/role/", {"role": "viewer"})

    assert response.status_code == 409 and "you cannot demote yourself" in response.content.decode()
    bea.refresh_from_db()
    assert (role_groups(bea), bea.is_staff) == ({"admin"}, True)


def test_an_admin_cannot_deactivate_themself(admin_user):
    response = signed_in(admin_user).post(f"/users/{admin_user.pk}/deactivate/")

    assert response.status_code == 409 and "you cannot deactivate yourself" in response.content.decode()
    assert User.objects.get(pk=admin_user.pk).is_active


def test_a_superuser_is_not_demoted_from_the_console(admin_user):
    bea = admin_member("bea")

    response = signed_in(bea).post(f"/users/{admin_user.pk}/role/", {"role": "viewer"})

    assert response.status_code == 409 and "superuser" in response.content.decode()
    assert role_groups(admin_user) == set()


@pytest.mark.parametrize("change", [lambda user, actor: users.set_role(user, "operator", actor), users.deactivate], ids=["demote", "deactivate"])
def test_the_last_active_admin_stays(change, operator):
    bea = admin_member("bea")

    with pytest.raises(users.UserAdminError, match="bea is the last active admin") as refused:
        change(bea, operator)

    assert refused.value.status == 409
    bea.refresh_from_db()
    assert (bea.is_active, role_groups(bea)) == (True, {"admin"})


def test_an_admin_can_demote_another_while_one_remains():
    bea, cy = admin_member("bea"), admin_member("cy")

    response = signed_in(bea).post(f"/users/{cy.pk}/role/", {"role": "viewer"})

    assert response.status_code == 302
    assert role_groups(cy) == {"viewer"} and users.active_admin_ids() == {bea.pk}


# ---------------------------------------------------------------- active


def test_a_deactivated_user_can_no_longer_sign_in_or_use_their_token(admin_page, viewer):
    key = Token.objects.create(user=viewer).key
    session = sign_in("victor", "pw-victor")

    response = admin_page.post(f"/users/{viewer.pk}/deactivate/")

    assert response.status_code == 302
    assert not is_signed_in(sign_in("victor", "pw-victor"))
    assert session.get("/").status_code == 302
    assert api_status(key) == 401


def test_a_reactivation_does_not_bring_back_the_sessions_open_before_the_deactivation(admin_page, viewer, operator):
    before = sign_in("victor", "pw-victor")
    someone_else = sign_in("olivia", "pw-olivia")
    admin_page.post(f"/users/{viewer.pk}/deactivate/")

    admin_page.post(f"/users/{viewer.pk}/reactivate/")

    assert before.get("/").status_code == 302  # to the sign-in page: a cookie taken before stays dead
    assert before.get("/api/models/").status_code in (401, 403)
    assert someone_else.get("/").status_code == 200
    assert is_signed_in(sign_in("victor", "pw-victor"))


def test_a_reactivated_user_signs_in_again(admin_page, viewer):
    admin_page.post(f"/users/{viewer.pk}/deactivate/")

    admin_page.post(f"/users/{viewer.pk}/reactivate/")

    assert is_signed_in(sign_in("victor", "pw-victor"))


# ---------------------------------------------------------------- API tokens


def test_rotating_a_token_shows_the_new_key_once_and_the_old_key_stops_working(admin_page, viewer):
    first = shown_secret(admin_page.post(f"/users/{viewer.pk}/token/"))
    working_before = api_status(first)

    second = shown_secret(admin_page.post(f"/users/{viewer.pk}/token/"))

    assert working_before == 200 and first != second
    assert (api_status(first), api_status(second)) == (401, 200)
    assert second not in admin_page.get(f"/users/{viewer.pk}/").content.decode()


def test_a_revoked_token_stops_working(admin_page, viewer):
    key = Token.objects.create(user=viewer).key

    response = admin_page.post(f"/users/{viewer.pk}/revoke-token/")

    assert response.status_code == 302
    assert api_status(key) == 401 and not Token.objects.filter(user=viewer).exists()


def test_no_admin_page_lists_token_keys(viewer):
    key = Token.objects.create(user=viewer).key
    member = admin_member("ada")
    client = Client()
    client.force_login(member)

    assert client.get("/admin/authtoken/tokenproxy/").status_code == 404
    assert client.get("/admin/authtoken/token/").status_code == 404
    index = client.get("/admin/")
    assert index.status_code == 200 and "/admin/authtoken/" not in index.content.decode()
    assert key not in client.get(f"/admin/auth/user/{viewer.pk}/change/").content.decode()


# ---------------------------------------------------------------- lockouts and audit


def test_a_locked_out_user_is_shown_and_the_admin_unlocks_them(settings, admin_page, viewer):
    AccessAttempt.objects.create(username="victor", ip_address="203.0.113.7", user_agent="test", failures_since_start=settings.AXES_FAILURE_LIMIT)
    listed = admin_page.get("/users/").content.decode()

    response = admin_page.post(f"/users/{viewer.pk}/unlock/")

    assert "locked out" in re.search(r'data-user="victor".*?</tr>', listed, re.DOTALL).group(0)
    assert response.status_code == 302
    assert not AccessAttempt.objects.filter(username="victor").exists()
    assert "locked out</span>" not in admin_page.get(f"/users/{viewer.pk}/").content.decode()


def test_every_change_is_recorded_in_the_users_history_with_who_made_it(admin_page, admin_user):
    admin_page.post("/users/new/", {"username": "nora", "role": "viewer"})
    nora = User.objects.get(username="nora")
    for change, form in (("role", {"role": "operator"}), ("token", {}), ("revoke-token", {}), ("reset-password", {}), ("deactivate", {}),
                         ("reactivate", {})):
        admin_page.post(f"/users/{nora.pk}/{change}/", form)

    entries = LogEntry.objects.filter(object_id=str(nora.pk)).order_by("pk")

    assert [entry.change_message for entry in entries] == [
        "Created with role viewer and a one-time password", "Role viewer → operator", "API token created", "API token revoked",
        "Password reset to a one-time password", "Deactivated", "Reactivated"]
    assert {entry.user_id for entry in entries} == {admin_user.pk}


def test_an_unknown_user_is_404(admin_page):
    assert admin_page.get("/users/999999/").status_code == 404
    assert admin_page.post("/users/999999/deactivate/").status_code == 404


# ---------------------------------------------------------------- what they did stays theirs


def test_the_django_admin_deletes_no_one_and_a_persons_name_stays_on_what_they_did(admin_page, operator, operator_client):
    """A delete cleared the person's name on every release and audit row, and took their
    Django admin history (who deactivated whom) with it: people are deactivated instead."""
    assert operator_client.post("/api/models/", {"name": "fraud"}, format="json").status_code == 201

    response = admin_page.post(f"/admin/auth/user/{operator.pk}/delete/", {"post": "yes"})

    assert response.status_code == 403
    assert User.objects.filter(pk=operator.pk).exists()
    assert [event["actor"] for event in operator_client.get("/api/models/fraud/audit/").json()] == ["olivia"]


def test_the_django_admins_bulk_delete_deletes_no_one(admin_page, viewer):
    response = admin_page.post("/admin/auth/user/", {"action": "delete_selected", "_selected_action": [viewer.pk], "post": "yes"})

    assert response.status_code in (200, 302, 403)
    assert User.objects.filter(pk=viewer.pk).exists()


def test_a_deactivation_made_outside_the_console_ends_sessions_too(viewer):
    """The Django admin's Active box (or a shell) saves the flag without the console's
    action: those sessions came back at the reactivation."""
    before = sign_in("victor", "pw-victor")

    viewer.is_active = False
    viewer.save()
    viewer.is_active = True
    viewer.save()

    assert before.get("/").status_code == 302


# ---------------------------------------------------------------- the Django admin keeps the same rules


def admin_form(client: Client, user: User, **changes) -> dict:
    """The Django admin's change form of ``user`` as the page fills it, with ``changes``
    (a field given as None is left out, as an unticked box is)."""
    page = client.get(f"/admin/auth/user/{user.pk}/change/")
    form = page.context["adminform"].form
    data = {name: value for name, value in form.initial.items() if name not in ("password", "last_login", "date_joined")}
    data["groups"] = [group.pk for group in user.groups.all()]
    data["user_permissions"] = []
    joined = user.date_joined
    data.update({"date_joined_0": joined.strftime("%Y-%m-%d"), "date_joined_1": joined.strftime("%H:%M:%S")})
    data.update({name: value for name, value in changes.items() if value is not None})
    return {name: value for name, value in data.items() if changes.get(name, "kept") is not None and value is not False}


def test_in_the_django_admin_an_admin_cannot_deactivate_or_demote_themself():
    bea, _cy = admin_member("bea"), admin_member("cy")
    client = signed_in(bea)

    response = client.post(f"/admin/auth/user/{bea.pk}/change/", admin_form(client, bea, is_active=None, groups=[]))

    assert response.status_code == 200
    assert "you cannot deactivate or demote yourself: ask another admin" in response.content.decode()
    bea.refresh_from_db()
    assert (bea.is_active, role_groups(bea)) == (True, {"admin"})


def test_in_the_django_admin_the_last_active_admin_stays(operator):
    bea = admin_member("bea")
    bea.is_superuser = True
    bea.save()
    chief = User.objects.create_superuser("chief", "", "pw-chief-1")
    client = signed_in(chief)
    client.post(f"/admin/auth/user/{chief.pk}/change/", admin_form(client, chief, is_active=None))  # refused: themself
    User.objects.filter(pk=bea.pk).update(is_active=False)

    response = client.post(f"/admin/auth/user/{chief.pk}/change/", admin_form(client, chief, is_superuser=None, is_staff=None))

    assert response.status_code == 200
    chief.refresh_from_db()
    assert chief.is_superuser and chief.is_active


def test_in_the_django_admin_an_admin_deactivates_another_while_one_remains():
    bea, cy = admin_member("bea"), admin_member("cy")
    client = signed_in(bea)

    response = client.post(f"/admin/auth/user/{cy.pk}/change/", admin_form(client, cy, is_active=None))

    assert response.status_code == 302
    cy.refresh_from_db()
    assert not cy.is_active
