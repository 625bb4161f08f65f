"""Login throttling (django-axes) through the real sign-in form: after the failure limit
a user name is paused from that address, the page says so, other pairs are untouched."""

from __future__ import annotations

import pytest
from axes.models import AccessAttempt
from django.conf import settings as django_settings
from django.test import Client

pytestmark = pytest.mark.django_db


def sign_in(username: str, password: str, address: str = "203.0.113.7"):
    return Client(REMOTE_ADDR=address).post("/login/", {"username": username, "password": password})


def fail(times: int, username: str = "olivia", address: str = "203.0.113.7") -> None:
    """Wrong passwords: the form says so each time, until the last one reaches the limit."""
    for attempt in range(1, times + 1):
        response = sign_in(username, "wrong-password", address)
        assert response.status_code == (429 if attempt == django_settings.AXES_FAILURE_LIMIT else 200)


def test_the_limit_of_failures_locks_out_that_user_name_from_that_address(settings, operator):
    fail(settings.AXES_FAILURE_LIMIT)

    response = sign_in("olivia", "pw-olivia")  # now even the right password is paused

    assert response.status_code == 429
    html = response.content.decode()
    assert f"after {settings.AXES_FAILURE_LIMIT} wrong passwords for this user name from your address" in html
    assert "paused for 15 minutes" in html
    assert "_auth_user_id" not in response.client.session


def test_failures_below_the_limit_still_let_the_right_password_in(settings, operator):
    fail(settings.AXES_FAILURE_LIMIT - 1)

    response = sign_in("olivia", "pw-olivia")

    assert response.status_code == 302
    assert AccessAttempt.objects.count() == 0  # a success resets the count


def test_a_lockout_touches_neither_other_users_nor_other_addresses(settings, operator, viewer):
    fail(settings.AXES_FAILURE_LIMIT)

    assert sign_in("victor", "pw-victor").status_code == 302
    assert sign_in("olivia", "pw-olivia", address="198.51.100.9").status_code == 302


def test_the_cool_off_ends_the_lockout(settings, operator):
    fail(settings.AXES_FAILURE_LIMIT)
    AccessAttempt.objects.update(attempt_time=AccessAttempt.objects.get().attempt_time - settings.AXES_COOLOFF_TIME)

    assert sign_in("olivia", "pw-olivia").status_code == 302


def test_attempts_during_a_lockout_neither_grow_its_record_nor_extend_it(settings):
    # Each locked-out attempt appended its query string and form (up to 1 KB each) to the
    # one record and restarted the pause: an anonymous loop grew a row to megabytes, every
    # write slower than the last, and kept the name locked out for good.
    fail(settings.AXES_FAILURE_LIMIT, username="ghost")
    before = AccessAttempt.objects.values("get_data", "post_data", "attempt_time", "failures_since_start").get()

    for _ in range(3):
        response = Client(REMOTE_ADDR="203.0.113.7").post(f"/login/?q={'B' * 1200}", {"username": "ghost", "password": "x", "f": "A" * 1000})
        assert response.status_code == 429

    assert AccessAttempt.objects.values("get_data", "post_data", "attempt_time", "failures_since_start").get() == before


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_a_user_name_longer_than_any_can_be_is_refused_by_the_form_and_never_tried(path):
    # Tried, django-axes recorded it in a 255-character column: a 500 on PostgreSQL.
    response = Client(REMOTE_ADDR="203.0.113.7").post(path, {"username": "g" * 256, "password": "p"})

    assert response.status_code == 200
    assert "a user name has at most 150 characters" in response.content.decode()
    assert AccessAttempt.objects.count() == 0


def change_password(client, old_password: str):
    return client.post("/account/password/", {"old_password": old_password, "new_password1": "a-new-long-pass-9", "new_password2": "a-new-long-pass-9"})


def test_wrong_old_passwords_on_the_password_page_count_towards_the_lockout_and_end_the_session(settings, operator):
    held = Client(REMOTE_ADDR="203.0.113.7")
    held.force_login(operator)
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert "incorrect" in change_password(held, "a-guess").content.decode()

    locked = change_password(held, "another-guess")

    assert locked.status_code == 429
    assert "_auth_user_id" not in held.session
    assert change_password(held, "pw-olivia").status_code == 302  # to the sign-in page: the guesser is out
    assert sign_in("olivia", "pw-olivia").status_code == 429  # and the name is paused from that address
    operator.refresh_from_db()
    assert operator.check_password("pw-olivia")


def test_the_right_old_password_changes_it(operator):
    held = Client(REMOTE_ADDR="203.0.113.7")
    held.force_login(operator)

    assert change_password(held, "pw-olivia").status_code == 302

    operator.refresh_from_db()
    assert operator.check_password("a-new-long-pass-9")


def test_the_django_admins_password_page_is_the_consoles(admin_user):
    held = Client()
    held.force_login(admin_user)

    assert held.get("/admin/password_change/")["Location"] == "/account/password/"
