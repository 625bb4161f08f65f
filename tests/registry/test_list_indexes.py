"""The lists read a page at a time are read through an index of their own order: a
model's jobs (by kind or status too), drills and audit events, newest first by id. Without
one, a page of a model with few rows scanned and sorted every model's rows."""

from __future__ import annotations

import pytest
from django.db import connection

from registry.models import AuditEvent, Drill, Job, RegisteredModel

pytestmark = pytest.mark.django_db


def plan(queryset) -> str:
    """The database's plan for the first page of ``queryset``, with scans that need no index
    and sorts made dear: a table of a few test rows is otherwise read whole."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_sort = off")
    return queryset[:51].explain()


@pytest.mark.parametrize(("rows", "index"), [
    (lambda model: Job.objects.filter(model=model), "jobs_newest_of_model"),
    (lambda model: Job.objects.filter(model=model, kind="batch"), "jobs_newest_of_kind"),
    (lambda model: Job.objects.filter(model=model, status="queued"), "jobs_newest_by_status"),
    (lambda model: Drill.objects.filter(model=model), "drills_newest_of_model"),
    (lambda model: AuditEvent.objects.filter(model=model), "audit_newest_of_model"),
], ids=["jobs", "jobs of a kind", "jobs of a status", "drills", "audit events"])
def test_a_page_of_a_models_list_is_read_through_its_index(rows, index):
    model = RegisteredModel.objects.create(name="indexed")

    found = plan(rows(model).order_by("-id"))

    assert index in found, found
    assert "TEMP B-TREE" not in found.upper() and "Sort" not in found  # read in order, not sorted
