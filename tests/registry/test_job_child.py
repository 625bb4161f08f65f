"""What a job's child prints is untrusted (the model's native code shares its stdout):
registry.jobs.child takes only well-formed protocol lines, and a child that ends without
a result fails its job with a reason."""

from __future__ import annotations

import sys

import pytest

from registry.domain.choices import JobKind
from registry.jobs import child, records
from registry.jobs.runner import JobFailed
from registry.models import RegisteredModel

pytestmark = pytest.mark.django_db


@pytest.fixture
def job():
    model = RegisteredModel.objects.create(name="child-model")
    return records.claim(records.create(JobKind.BATCH, model).pk)


def printing(monkeypatch, script: str) -> None:
    monkeypatch.setattr(child, "command", lambda argv, *limits: [sys.executable, "-c", script])


def test_lines_that_are_not_the_protocol_are_ignored_and_the_result_is_taken(monkeypatch, job):
    printing(monkeypatch, "import sys; print('native noise'); print('[1, 2]'); print('{\"event\": \"progress\", \"done\": \"many\"}');"
                          "print('{\"event\": \"result\", \"result\": {\"rows\": 3}}')")

    assert child.run_child(job, [], timeout_s=30) == {"rows": 3}


def test_a_child_that_exits_without_a_result_fails_the_job_with_its_last_words(monkeypatch, job):
    printing(monkeypatch, "import sys; print('half a line', end=''); sys.stderr.write('it broke\\n'); sys.exit(3)")

    with pytest.raises(JobFailed, match=r"exit code 3\): it broke"):
        child.run_child(job, [], timeout_s=30)


def test_an_error_event_is_the_jobs_reason(monkeypatch, job):
    printing(monkeypatch, "print('{\"event\": \"error\", \"reason\": \"row 7 is not a number\"}'); raise SystemExit(2)")

    with pytest.raises(JobFailed, match="row 7 is not a number"):
        child.run_child(job, [], timeout_s=30)
