"""Every model change has its migration in the repository: a field or index added to a
model without one works in tests (which build tables from migrations) only by luck, and a
deployment's migrate would not make it."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_the_models_need_no_migration_that_is_not_written():
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exit_:
        pytest.fail(f"makemigrations would write a migration (exit {exit_.code}):\n{out.getvalue()}")
