"""The console believes no X-Forwarded-For: a client reaching it over loopback (make run,
an SSH tunnel, a port-forward) cannot name its own address to step around the sign-in
lockout, which django-axes keeps per user name and address. A real console process, with
the command-line options every deployment gives it (console.processes.CONSOLE_HTTP_OPTIONS)."""

from __future__ import annotations

import re

import httpx
import pytest
from django.db import connection

from tools.stack import running_stack

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def console(tmp_path, settings):
    with running_stack(tmp_path, settings, connection.settings_dict, SECURE_COOKIES="false") as stack:
        yield stack.console


def sign_in(console, password: str, forwarded_for: str | None = None) -> int:
    with httpx.Client(base_url=console.url, timeout=10) as client:
        form = client.get("/login/").text
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
        headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
        return client.post("/login/", data={"username": "olivia", "password": password, "csrfmiddlewaretoken": token},
                           headers=headers).status_code


def test_a_forged_forwarded_address_does_not_lift_a_sign_in_lockout(console, settings, operator):
    for attempt in range(settings.AXES_FAILURE_LIMIT):
        sign_in(console, "wrong-password", forwarded_for=f"203.0.113.{attempt}")  # each guess "from" elsewhere
    assert sign_in(console, "pw-olivia") == 429  # the guesses counted against the real address

    assert sign_in(console, "pw-olivia", forwarded_for="198.51.100.9") == 429
