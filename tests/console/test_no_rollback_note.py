"""The release panel's note when there is no rollback says why: an abort of a canary that
every earlier split routes (the old stable, brought back as a canary) ends the rollback
chain, which the note had called "already returned to the earliest split on record"."""

from __future__ import annotations

import re

import pytest

from registry.actions import releases
from tests.console.conftest import add_version

pytestmark = pytest.mark.django_db
MODEL = "/models/digits/"


def no_rollback_note(page) -> str:
    html = page.get(MODEL).content.decode()
    return re.search(r'<p class="hint" id="no-rollback-note">(.*?)</p>', html, re.S).group(1)


def abort_to_stable(page, generation: int):
    response = page.post(MODEL + "to-stable/", {"reason": "canary looks wrong", "expected_generation": str(generation)})
    assert response.status_code == 302, response.content


@pytest.fixture
def v3_promoted_over_v1(digits, operator):
    """digits: v3 promoted to 100% over v1 (generation 3), whose rollback returns to v1 100%."""
    add_version(digits, 3)
    releases.set_routes(digits, [{"version": 1, "weight": 90}, {"version": 3, "weight": 10}], operator)
    releases.promote(digits, operator)
    return digits


def test_after_aborting_the_old_stable_as_a_canary_the_note_says_the_abort_ended_the_rollback_chain(operator_page, v3_promoted_over_v1, operator):
    releases.set_routes(v3_promoted_over_v1, [{"version": 3, "weight": 90}, {"version": 1, "weight": 10}], operator)  # generation 4
    abort_to_stable(operator_page, 4)  # generation 5: v3 100%

    assert no_rollback_note(operator_page) == (
        "Nothing to roll back to: the abort of v1 at generation 5 ended the rollback chain — every earlier split on it "
        "routes v1 or serves v3 100%, as generation 5 does. A new split makes a new rollback point. A rollback drill needs one too.")


def test_after_aborting_a_first_canary_the_note_says_the_stable_split_is_the_earliest_on_record(operator_page, digits, operator):
    releases.set_routes(digits, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], operator)  # generation 2
    abort_to_stable(operator_page, 2)  # generation 3: v1 100%, as generation 1

    assert no_rollback_note(operator_page) == (
        "Nothing to roll back to: generation 3 already returned to the earliest split on record. "
        "A new split makes a new rollback point. A rollback drill needs one too.")
