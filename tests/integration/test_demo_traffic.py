"""`manage.py demo_traffic` sends the demo's held-out digits to a real worker and says
which versions answered."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from registry.actions import uploads
from registry.building import demo
from registry.models import RegisteredModel
from tools.stack import running_stack

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_demo_traffic_is_answered_by_the_demo_model(tmp_path, settings, operator):
    model = RegisteredModel.objects.create(name=demo.demo_model_name)
    uploads.register_stream(model, io.BytesIO(demo.build_demo_versions()[0].artifact), uploaded_by=operator)
    out = io.StringIO()

    with running_stack(tmp_path, settings, connection.settings_dict) as stack:
        worker = stack.start_worker()
        call_command("demo_traffic", url=worker.url, rate=40, seconds=1.0, stdout=out)

    tally = out.getvalue().strip().splitlines()[-1]
    assert tally.startswith("200 v1: ")
    assert int(tally.split(": ")[1]) >= 30, out.getvalue()
