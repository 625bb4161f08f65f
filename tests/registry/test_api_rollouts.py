"""The rollout API: start, read, pause / resume / abort, bad requests answered with a
4xx naming the problem; and the release in force at a given time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework import serializers
from rest_framework.fields import empty

from registry.actions import releases
from registry.models import AuditEvent
from tests.fixtures.evaluations import evaluated_on_holdout

pytestmark = pytest.mark.django_db

ROLLOUTS = "/api/models/digits/rollouts/"
PLAN = {"canary_version": 2, "steps": [5, 100], "step_duration_s": 60, "analysis": {"interval_s": 30, "min_requests": 10}}


def test_starting_a_rollout_answers_its_state_and_routes_the_first_step(three_versions, operator_client):
    answer = operator_client.post(ROLLOUTS, PLAN, format="json")

    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert (body["status"], body["current_step"], body["current_weight"], body["steps"]) == ("running", 1, 5, [5, 100])
    assert body["analysis"]["interval_s"] == 30 and body["analysis"]["failure_limit"] == 2  # the default fills the rest
    assert body["verdicts"] == []
    assert three_versions.current_release().routes == [{"version": 1, "weight": 95}, {"version": 2, "weight": 5}]


def test_a_rollout_of_a_canary_evaluated_worse_says_so_when_it_starts(three_versions, operator_client):
    # The console's rollout form said it; an API client started one and heard nothing.
    evaluated_on_holdout(three_versions, {1: 0.89, 2: 0.11})

    answer = operator_client.post(ROLLOUTS, PLAN, format="json")

    worse = "v2 was evaluated worse than the stable v1: accuracy 11.0% on holdout, against v1's accuracy 89.0%"
    assert answer.status_code == 201, answer.json()
    assert answer.json()["evaluated_worse"] == [worse]
    assert AuditEvent.objects.filter(kind="rollout").order_by("-pk").first().data["evaluated_worse"] == [worse]
    assert "evaluated_worse" not in operator_client.get(f"{ROLLOUTS}{answer.json()['id']}/").json()


def test_a_plan_of_more_steps_than_allowed_is_refused_by_its_length_before_any_step_is_read(three_versions, operator_client, monkeypatch):
    """600,000 steps held a console thread 5.8 s, each read, before "at most 20"."""
    read = []
    validate = serializers.JSONField.run_validation

    def counted(self, data=empty):
        if isinstance(self.parent, serializers.ListField):  # a step, not another field of the plan
            read.append(data)
        return validate(self, data)

    monkeypatch.setattr(serializers.JSONField, "run_validation", counted)

    answer = operator_client.post(ROLLOUTS, {"canary_version": 2, "steps": [1] * 600_000}, format="json")

    assert read == []
    assert answer.status_code == 400
    assert "at most 20 steps are allowed" in answer.json()["error"]
    assert three_versions.current_release().generation == 1


def test_the_default_plan_is_one_ten_fifty_hundred(three_versions, operator_client):
    body = operator_client.post(ROLLOUTS, {"canary_version": 2}, format="json").json()

    assert (body["steps"], body["step_duration_s"]) == ([1, 10, 50, 100], 300)


def test_the_model_thresholds_apply_under_the_rollouts_own(three_versions, operator_client):
    answer = operator_client.patch("/api/models/digits/", {"analysis": {"min_requests": 500, "max_class_psi": 0.1}}, format="json")
    assert answer.status_code == 200, answer.json()

    body = operator_client.post(ROLLOUTS, {**PLAN, "analysis": {"min_requests": 20}}, format="json").json()

    assert (body["analysis"]["min_requests"], body["analysis"]["max_class_psi"]) == (20, 0.1)


@pytest.mark.parametrize(("change", "field"), [
    ({"analysis": {"interval_s": "soon"}}, "interval_s"),
    ({"analysis": {"no_such_threshold": 1}}, "no_such_threshold"),
    ({"steps": [50, 10, 100]}, "increase strictly"),
    ({"step_duration_s": -1}, "step_duration_s"),
    ({"canary_version": 99}, "version 99"),
    ({"canary_version": "2"}, "canary_version"),
    ({"steps": [True, 100]}, "steps[0] (step 1) must be an integer percentage from 0 (a shadow step) to 100, got True"),
    ({"steps": [10, 0, 100]}, "steps[1] (step 2) must be an integer percentage from 1 to 100"),
    ({"steps": [10, "x" * 100, 100]}, "got '" + "x" * 36 + "..."),
    ({"steps": list(range(1, 100)) + [100]}, "at most 20"),
    ({"step_duration_s": True}, "step_duration_s"),
    ({"shadow_fraction": 0}, "shadow_fraction"),
    ({"shadow_fraction": 1.5}, "shadow_fraction"),
    ({"shadow_fraction": True}, "shadow_fraction"),
    ({"shadow_fraction": 5e-324}, "from 0.0001"),
    ({"shadow_fraction": 0.00009}, "from 0.0001"),
    ({"analysis": {"min_requests": True}}, "min_requests"),
    ({"analysis": {"alpha": 0}}, "alpha must be a number from 0.001 to 1"),  # no gate could fail
])
def test_a_bad_plan_is_a_400_naming_the_problem_and_starts_nothing(three_versions, operator_client, change, field):
    answer = operator_client.post(ROLLOUTS, {**PLAN, **change}, format="json")

    assert answer.status_code == 400
    assert field in answer.json()["error"] or field in str(answer.json().get("fields"))
    assert operator_client.get(ROLLOUTS).json() == []
    assert three_versions.current_release().generation == 1


@pytest.mark.parametrize(("body", "named"), [
    ('{"canary_version": 2, "step_duration_s": NaN}', "NaN"),  # refused by the JSON parser itself
    ('{"canary_version": 2, "step_duration_s": 1e400}', "step_duration_s"),  # parses as inf
    ('{"canary_version": 2, "analysis": {"max_class_psi": 1e400}}', "max_class_psi"),
])
def test_non_finite_numbers_in_a_plan_are_a_400_and_start_nothing(three_versions, operator_client, body, named):
    answer = operator_client.post(ROLLOUTS, body, content_type="application/json")

    assert answer.status_code == 400 and named in answer.json()["error"]
    assert three_versions.current_release().generation == 1


def test_bad_model_thresholds_are_refused_naming_the_field(three_versions, operator_client):
    answer = operator_client.patch("/api/models/digits/", {"analysis": {"max_class_psi": -1}}, format="json")

    assert answer.status_code == 400 and "max_class_psi" in str(answer.json())


def test_a_second_rollout_is_a_409(three_versions, operator_client):
    operator_client.post(ROLLOUTS, PLAN, format="json")

    answer = operator_client.post(ROLLOUTS, {**PLAN, "canary_version": 3}, format="json")

    assert answer.status_code == 409 and "one rollout per model" in answer.json()["error"]


def test_a_rollout_while_a_third_version_has_traffic_is_a_409_naming_it(three_versions, operator_client):
    split = operator_client.post("/api/models/digits/release/", {"routes": [{"version": 1, "weight": 70}, {"version": 3, "weight": 30}]},
                                 format="json")
    assert split.status_code == 201

    answer = operator_client.post(ROLLOUTS, PLAN, format="json")

    assert answer.status_code == 409 and "also routes v3 at 30%" in answer.json()["error"]


def test_a_viewer_reads_rollouts_but_cannot_start_or_abort_one(three_versions, operator_client, viewer_client):
    rollout = operator_client.post(ROLLOUTS, PLAN, format="json").json()

    assert viewer_client.post(ROLLOUTS, PLAN, format="json").status_code == 403
    assert viewer_client.post(f"{ROLLOUTS}{rollout['id']}/abort/", {}, format="json").status_code == 403
    assert viewer_client.get(f"{ROLLOUTS}{rollout['id']}/").json()["status"] == "running"


def test_pause_resume_and_abort_answer_the_new_state(three_versions, operator_client):
    url = f"{ROLLOUTS}{operator_client.post(ROLLOUTS, PLAN, format='json').json()['id']}/"

    assert operator_client.post(url + "pause/", {"reason": "hold"}, format="json").json()["status"] == "paused"
    assert operator_client.post(url + "pause/", {}, format="json").status_code == 409
    assert operator_client.post(url + "resume/", {}, format="json").json()["status"] == "running"
    aborted = operator_client.post(url + "abort/", {"reason": "not today"}, format="json").json()

    assert (aborted["status"], aborted["status_reason"].split(" (generation")[0]) == ("aborted", "aborted by olivia (not today)")
    assert three_versions.current_release().routes == [{"version": 1, "weight": 100}]
    assert operator_client.post(url + "resume/", {}, format="json").status_code == 409


@pytest.mark.parametrize("action", ["pause", "resume", "abort"])
def test_a_rollout_action_sent_with_a_generation_older_than_the_traffic_is_refused_and_changes_nothing(three_versions, operator_client, action):
    """The API took expected_generation for these and ignored it."""
    url = f"{ROLLOUTS}{operator_client.post(ROLLOUTS, PLAN, format='json').json()['id']}/"
    if action == "resume":
        operator_client.post(url + "pause/", {}, format="json")
    seen = three_versions.current_release().generation
    operator_client.post("/api/models/digits/release/", {"routes": [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}]}, format="json")
    before = (three_versions.current_release().generation, operator_client.get(url).json()["status"])

    answer = operator_client.post(url + f"{action}/", {"expected_generation": seen}, format="json")

    assert answer.status_code == 409 and f"replaced generation {seen} you saw" in answer.json()["error"]
    assert (three_versions.current_release().generation, operator_client.get(url).json()["status"]) == before


def test_a_finished_rollout_answers_no_weight_and_no_next_window(three_versions, operator_client):
    # Rolled back, it answered "current_weight": 10 while the canary served nothing, and a window after its end.
    url = f"{ROLLOUTS}{operator_client.post(ROLLOUTS, PLAN, format='json').json()['id']}/"
    running = operator_client.get(url).json()

    aborted = operator_client.post(url + "abort/", {}, format="json").json()

    assert running["current_weight"] == PLAN["steps"][0] and running["next_window_at"] is not None
    assert (aborted["status"], aborted["current_weight"], aborted["next_window_at"]) == ("aborted", None, None)
    assert aborted["current_step"] == 1  # where it stopped, as history


def test_an_unknown_rollout_is_a_404(three_versions, operator_client):
    assert operator_client.get(f"{ROLLOUTS}12345/").status_code == 404
    assert operator_client.post(f"{ROLLOUTS}12345/abort/", {}, format="json").status_code == 404


# ---- the release in force at a time ------------------------------------------------------


def test_the_release_at_a_time_is_the_newest_made_by_then(three_versions, operator, operator_client):
    first = three_versions.current_release()
    between = timezone.now()
    releases.set_routes(three_versions, [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}], operator)

    then = operator_client.get("/api/models/digits/release/", {"at": between.isoformat()}).json()
    now = operator_client.get("/api/models/digits/release/", {"at": (timezone.now() + timedelta(seconds=1)).isoformat()}).json()

    assert then["release"]["generation"] == first.generation
    assert now["release"]["routes"] == [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}]


def test_a_time_before_the_first_release_is_a_404_and_a_bad_time_a_400(three_versions, operator_client):
    before = operator_client.get("/api/models/digits/release/", {"at": "2001-01-01T00:00:00Z"})
    bad = operator_client.get("/api/models/digits/release/", {"at": "yesterday"})

    assert before.status_code == 404 and "no release" in before.json()["error"]
    assert bad.status_code == 400 and "ISO 8601" in bad.json()["error"]


def test_a_time_without_a_zone_is_taken_as_utc(three_versions, operator_client):
    made = three_versions.current_release().created_at.astimezone(timezone.get_fixed_timezone(0))
    naive = (made + timedelta(seconds=1)).replace(tzinfo=None).isoformat()

    response = operator_client.get("/api/models/digits/release/", {"at": naive})

    assert response.status_code == 200, response.content
    assert response.json()["at"].endswith("+00:00")


@pytest.mark.parametrize("at", ["2026-12-03T14:24:00+25:00", "2026-02-30T00:00:00Z", "0001-01-01T00:00:00-01:00",
                                "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-12:00"])
def test_an_impossible_time_is_a_400_not_a_500(three_versions, operator_client, at):
    response = operator_client.get("/api/models/digits/release/", {"at": at})

    assert response.status_code in (400, 404), response.content
    assert response.json()["error"]

def test_the_release_state_says_what_a_rollback_returns_to(three_versions, operator, operator_client):
    releases.set_routes(three_versions, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], operator)
    releases.promote(three_versions, operator)

    body = operator_client.get("/api/models/digits/release/").json()

    assert body["rollback_returns_to"] == "v1 100% (generation 1)"
