"""The drill's dialog names the silent workers the drill would wait for."""

from __future__ import annotations

import re

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from registry.actions.drills import SILENT_NAMED, silent_participants
from registry.models import Worker
from tests.console.conftest import report_from


def silent_named(html: str) -> list[str]:
    warning = html[html.index('id="drill-silent-warning"'):]
    return re.findall(r"(\S+) \(silent \d+ s\)", warning[:warning.index("</p>")])


def test_the_drill_dialog_names_the_longest_silent_workers_and_counts_the_rest(operator_page, canary_digits):
    # Any worker token can make up ids: the dialog, asked at each page refresh, named and
    # loaded whole every one of them.
    generation = canary_digits.current_release().generation
    report_from("live", generation=generation, versions=[])
    for index in range(SILENT_NAMED + 4):
        report_from(f"silent-{index:02}", generation=generation, versions=[], seconds_ago=settings.WORKER_GONE_AFTER_S + 1 + index)

    html = operator_page.get("/models/digits/drill/").content.decode()

    assert silent_named(html) == [f"silent-{index:02}" for index in reversed(range(4, SILENT_NAMED + 4))]
    assert "and 4 more: not reporting" in html
    assert "Unless they answer in time the drill fails" in html


def test_the_drill_dialog_names_one_silent_worker_alone(operator_page, canary_digits):
    generation = canary_digits.current_release().generation
    report_from("live", generation=generation, versions=[])
    report_from("frozen", generation=generation, versions=[], seconds_ago=settings.WORKER_GONE_AFTER_S + 2)

    html = operator_page.get("/models/digits/drill/").content.decode()

    assert silent_named(html) == ["frozen"]
    assert "more: not reporting" not in html and "Unless it answers in time the drill fails" in html


def test_the_drill_dialog_names_no_worker_silent_past_a_minute_or_one_that_said_it_stopped(operator_page, canary_digits):
    generation = canary_digits.current_release().generation
    report_from("live", generation=generation, versions=[])
    report_from("long-gone", generation=generation, versions=[], seconds_ago=120)
    stopped = report_from("stopped", generation=generation, versions=[], seconds_ago=settings.WORKER_GONE_AFTER_S + 2)
    stopped.last_report = {**stopped.last_report, "state": "stopped"}
    stopped.save()

    html = operator_page.get("/models/digits/drill/").content.decode()

    assert 'id="drill-silent-warning"' not in html


def test_the_count_of_silent_workers_left_unnamed_is_never_negative_when_a_named_one_reports_meanwhile(canary_digits, monkeypatch):
    # The names and the count are two reads: a named worker reporting between them left
    # the count one short of the names, and the dialog said "and -1 more".
    generation = canary_digits.current_release().generation
    for index in range(SILENT_NAMED):
        report_from(f"silent-{index:02}", generation=generation, versions=[], seconds_ago=settings.WORKER_GONE_AFTER_S + 1 + index)
    count = QuerySet.count

    def reported_meanwhile(queryset):
        Worker.objects.filter(worker_id="silent-00").update(last_seen_at=timezone.now())
        return count(queryset)

    monkeypatch.setattr(QuerySet, "count", reported_meanwhile)

    named, more = silent_participants()

    assert len(named) == SILENT_NAMED and more == 0
