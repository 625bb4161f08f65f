"""The rollout state machine through ``registry.actions.rollouts`` and the HTTP API:
steps, verdicts, automatic rollback, waiting for data, pause / resume / abort, manual
changes, one rollout per model. Worker reports are stored as the console stores them
(``registry.fleet.samples``); the clock is the ``now`` each tick is given, so every
window is exact. The live path (real workers, real traffic, Celery beat) is in
tests/integration/test_rollouts_live.py."""

from __future__ import annotations

import importlib
import io
import re
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from registry.actions import releases, rollouts, uploads
from registry.artifacts import storage
from registry.building.onnx_build import random_mlp, to_bytes
from registry.domain.choices import AuditKind, RolloutStatus
from registry.fleet import samples
from registry.models import AuditEvent, ReportSample, Rollout, Worker
from serving.contract import CONTRACT_VERSION

pytestmark = pytest.mark.django_db

FAST = {"interval_s": 10, "min_requests": 50, "failure_limit": 2}
BUCKETS = {"0.001": 0, "0.002": 0, "0.004": 0, "+Inf": 0}


def figures(model: str, version: int, requests: int = 200, errors: int = 0, client_errors: int = 0, classes=None) -> dict:
    answered = requests - errors - client_errors
    buckets = {bound: (answered if bound != "0.001" else 0) for bound in BUCKETS}
    entry = {"model": model, "version": version, "requests": requests, "errors": errors, "client_errors": client_errors,
             "latency_sum_s": 0.0015 * requests, "latency_buckets": buckets, "batch_size_buckets": {}}
    counts = classes if classes is not None else [answered // 4] * 4
    entry["outputs"] = [{"name": "probabilities", "kind": "classes", "counts": counts, "other": 0}]
    return entry


def report(model, version_numbers: dict[int, dict], at) -> None:
    """One report from one worker at ``at``: figures per version number."""
    versions = {version.number: version for version in model.versions.all()}
    samples.store("worker-0", [(versions[number], entry) for number, entry in version_numbers.items()], received_at=at)


def window_of_traffic(model, rollout: Rollout, at, canary: dict | None = None, stable: dict | None = None) -> None:
    """Figures for both sides a moment before ``at`` (inside the window ending at ``at``)."""
    report(model, {rollout.canary_version: canary or figures(model.name, rollout.canary_version),
                   rollout.stable_version: stable or figures(model.name, rollout.stable_version)}, at - timedelta(seconds=1))


def start(model, operator, **overrides) -> Rollout:
    plan = {"canary_version": 2, "steps": [10, 50, 100], "step_duration_s": 0, "analysis": FAST, **overrides}
    return rollouts.start(model, plan.pop("canary_version"), plan.pop("steps"), plan.pop("step_duration_s"), plan.pop("analysis"), operator, **plan)


def judge_next(rollout: Rollout, **traffic) -> Rollout:
    """Report one window of traffic and tick at the end of it."""
    rollout.refresh_from_db()
    at = rollout.next_window_at
    window_of_traffic(rollout.model, rollout, at, **traffic)
    rollouts.tick(at)
    rollout.refresh_from_db()
    return rollout


def routes(model) -> list[dict]:
    return model.current_release().routes


# ---- starting ----------------------------------------------------------------------


def test_a_rollout_gives_the_canary_the_first_steps_weight_at_once(three_versions, operator):
    rollout = start(three_versions, operator)

    assert (rollout.status, rollout.step_index, rollout.stable_version) == (RolloutStatus.RUNNING, 0, 1)
    assert routes(three_versions) == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
    assert rollout.release_generation == three_versions.current_release().generation


def test_a_second_rollout_of_the_same_model_is_refused_naming_the_first(three_versions, operator):
    first = start(three_versions, operator)

    with pytest.raises(releases.ReleaseConflict, match=f"rollout #{first.pk} .* one rollout per model"):
        start(three_versions, operator, canary_version=3)


@pytest.mark.parametrize(("steps", "message"), [
    ([10, 5, 100], "increase strictly"),
    ([10, 50], "last step must be 100"),
    ([100], "at least one analysed step"),
    ([10, 0, 100], r"steps\[1\] \(step 2\) must be an integer percentage from 1 to 100 \(only the first step may be 0, a shadow step\)"),
    ([-1, 100], r"steps\[0\] \(step 1\) must be an integer percentage from 0 \(a shadow step\) to 100"),
    ("10,100", "non-empty list"),
])
def test_a_plan_with_bad_steps_is_refused_naming_the_problem(three_versions, operator, steps, message):
    with pytest.raises(rollouts.RolloutError, match=message):
        start(three_versions, operator, steps=steps)
    assert not Rollout.objects.exists()


def test_the_stable_version_cannot_be_its_own_canary(three_versions, operator):
    with pytest.raises(rollouts.RolloutError, match="already the stable version"):
        start(three_versions, operator, canary_version=1)


def test_a_rollout_is_refused_while_a_third_version_has_traffic_and_the_split_is_left_alone(three_versions, operator):
    # Its first step replaced the split: v1 50 / v3 50 became v1 99 / v2 1, v3's half gone without a word.
    releases.set_routes(three_versions, [{"version": 1, "weight": 50}, {"version": 3, "weight": 50}], operator, "v3 on half")

    with pytest.raises(rollouts.RolloutConflict, match=r"also routes v3 at 50% .* between the stable v1 and v2 only"):
        start(three_versions, operator, steps=[1, 10, 100])

    assert routes(three_versions) == [{"version": 1, "weight": 50}, {"version": 3, "weight": 50}]
    assert not Rollout.objects.exists()


def test_a_rollout_of_the_version_that_already_has_canary_traffic_starts(three_versions, operator):
    releases.set_routes(three_versions, [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}], operator, "v2 on a fifth")

    start(three_versions, operator)

    assert routes(three_versions) == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]


# ---- walking the steps -----------------------------------------------------------------


def test_a_healthy_canary_walks_every_step_and_is_promoted(three_versions, operator):
    rollout = start(three_versions, operator)

    rollout = judge_next(rollout)
    assert (rollout.step_index, routes(three_versions)) == (1, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    rollout = judge_next(rollout)

    assert rollout.status == RolloutStatus.PROMOTED
    assert routes(three_versions) == [{"version": 2, "weight": 100}]
    assert three_versions.current_release().stable_version == 2
    assert [verdict.result for verdict in rollout.verdicts.order_by("number")] == ["pass", "pass"]


def test_a_passing_step_holds_for_its_duration_before_advancing(three_versions, operator):
    rollout = start(three_versions, operator, step_duration_s=25)

    rollout = judge_next(rollout)  # 10 s into the step
    rollout = judge_next(rollout)  # 20 s
    assert (rollout.step_index, rollout.status) == (0, RolloutStatus.RUNNING)
    rollout = judge_next(rollout)  # 30 s: held long enough

    assert rollout.step_index == 1


def test_consecutive_failing_windows_roll_back_to_stable_with_the_numbers_in_the_reason(three_versions, operator):
    rollout = start(three_versions, operator)
    broken = figures("digits", 2, requests=200, errors=60)

    rollout = judge_next(rollout, canary=broken)
    assert (rollout.status, rollout.consecutive_failures) == (RolloutStatus.RUNNING, 1)
    rollout = judge_next(rollout, canary=broken)

    assert rollout.status == RolloutStatus.ROLLED_BACK
    assert routes(three_versions) == [{"version": 1, "weight": 100}]
    assert "2 consecutive failing windows" in rollout.status_reason and "30.0%" in rollout.status_reason
    assert three_versions.current_release().reason.startswith(f"rollout #{rollout.pk} rolled back automatically")


def test_after_the_automatic_rollback_no_rollback_brings_the_failing_canary_back(three_versions, operator):
    rollout = start(three_versions, operator)
    rollout = judge_next(rollout)  # step 2: v2 at 50%
    broken = figures("digits", 2, requests=200, errors=60)
    judge_next(judge_next(rollout, canary=broken), canary=broken)
    current = three_versions.current_release()

    assert releases.rollback_preview(current) is None
    with pytest.raises(releases.ReleaseConflict, match="nothing to roll back to"):
        releases.rollback(three_versions, operator)
    assert routes(three_versions) == [{"version": 1, "weight": 100}]


def test_a_passing_window_between_failures_resets_the_streak(three_versions, operator):
    rollout = start(three_versions, operator, step_duration_s=1000)
    broken = figures("digits", 2, requests=200, errors=60)

    judge_next(rollout, canary=broken)
    judge_next(rollout)
    rollout = judge_next(rollout, canary=broken)

    assert (rollout.status, rollout.consecutive_failures) == (RolloutStatus.RUNNING, 1)


def test_a_canary_refusing_every_request_fails_on_client_errors(three_versions, operator):
    rollout = start(three_versions, operator, analysis={**FAST, "failure_limit": 1})

    rollout = judge_next(rollout, canary=figures("digits", 2, requests=200, client_errors=200))

    assert rollout.status == RolloutStatus.ROLLED_BACK
    signals = {signal["name"]: signal["passed"] for signal in rollout.verdicts.get().signals}
    assert signals["client_errors"] is False and signals["server_errors"] is True


def test_a_canary_whose_predictions_shift_is_rolled_back_on_the_distribution(three_versions, operator):
    rollout = start(three_versions, operator, analysis={**FAST, "failure_limit": 1})

    rollout = judge_next(rollout, canary=figures("digits", 2, classes=[10, 10, 170, 10]))

    assert rollout.status == RolloutStatus.ROLLED_BACK
    verdict = rollout.verdicts.get()
    failed = [signal["name"] for signal in verdict.signals if signal["passed"] is False]
    assert failed == ["output:probabilities"]
    assert "PSI" in verdict.reason


def test_quiet_traffic_waits_and_says_how_many_requests_are_needed(three_versions, operator):
    rollout = start(three_versions, operator)

    rollout = judge_next(rollout, canary=figures("digits", 2, requests=12))

    assert rollout.status == RolloutStatus.WAITING_FOR_DATA
    assert "12" in rollout.status_reason and "50" in rollout.status_reason
    assert (rollout.step_index, rollout.consecutive_failures) == (0, 0)
    rollout = judge_next(rollout)
    assert (rollout.status, rollout.step_index) == (RolloutStatus.RUNNING, 1)


def test_a_window_is_judged_once_however_often_the_tick_runs(three_versions, operator):
    rollout = start(three_versions, operator, step_duration_s=1000)
    at = rollout.next_window_at
    window_of_traffic(three_versions, rollout, at)

    judged = [rollouts.tick(at), rollouts.tick(at), rollouts.tick(at + timedelta(seconds=1))]

    assert judged == [1, 0, 0]
    assert rollout.verdicts.count() == 1


# ---- operator actions ------------------------------------------------------------------


def test_pause_stops_the_analysis_and_resume_starts_the_step_again(three_versions, operator):
    rollout = rollouts.pause(start(three_versions, operator), operator, "looking at a dashboard")
    assert (rollout.status, rollout.status_reason) == (RolloutStatus.PAUSED, "paused by olivia (looking at a dashboard)")
    rollouts.tick(rollout.next_window_at + timedelta(seconds=60))
    assert rollout.verdicts.count() == 0

    rollout = rollouts.resume(rollout, operator)

    assert rollout.status == RolloutStatus.RUNNING
    assert rollout.next_window_at > timezone.now()


def test_abort_returns_all_traffic_to_stable_at_once(three_versions, operator):
    rollout = rollouts.abort(start(three_versions, operator), operator, "wrong version")

    assert rollout.status == RolloutStatus.ABORTED
    assert routes(three_versions) == [{"version": 1, "weight": 100}]
    with pytest.raises(releases.ReleaseConflict, match="already aborted"):
        rollouts.abort(rollout, operator)


def test_aborting_after_an_operator_promoted_the_canary_by_hand_leaves_the_promote_standing(three_versions, operator):
    """The 409 for a second rollout said to abort the paused one first; the abort put the
    old stable back at 100 %, undoing the promote, with no rollback to return to it."""
    rollout = start(three_versions, operator)
    promoted = releases.promote(three_versions, operator, "v2 is fine, taking it now")

    rollout = rollouts.abort(Rollout.objects.get(pk=rollout.pk), operator)

    assert routes(three_versions) == [{"version": 2, "weight": 100}]
    assert three_versions.current_release().generation == promoted.generation
    assert rollout.status == RolloutStatus.ABORTED
    assert rollout.status_reason.endswith(f"traffic left as generation {promoted.generation} (v2 100%), made since the rollout's last step")


def test_aborting_after_an_operator_mirrored_the_canary_ends_the_mirror_too(three_versions, operator):
    rollout = start(three_versions, operator)
    releases.set_routes(three_versions, [{"version": 1, "weight": 100}, {"version": 2, "weight": 0, "shadow": 0.5}], operator)

    rollouts.abort(Rollout.objects.get(pk=rollout.pk), operator)

    assert routes(three_versions) == [{"version": 1, "weight": 100}]


def test_aborting_after_an_operators_split_returns_that_splits_stable_to_100(three_versions, operator):
    rollout = start(three_versions, operator)
    releases.set_routes(three_versions, [{"version": 1, "weight": 70}, {"version": 2, "weight": 30}], operator)

    rollouts.abort(Rollout.objects.get(pk=rollout.pk), operator)

    assert routes(three_versions) == [{"version": 1, "weight": 100}]


def test_a_manual_traffic_change_pauses_a_running_rollout_and_says_so(three_versions, operator):
    rollout = start(three_versions, operator)

    release = releases.set_routes(three_versions, [{"version": 1, "weight": 70}, {"version": 2, "weight": 30}], operator)

    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.PAUSED
    assert f"manual traffic change by olivia (generation {release.generation}" in rollout.status_reason
    assert AuditEvent.objects.filter(kind=AuditKind.ROLLOUT, message__contains="manual traffic change").exists()


def test_resume_after_a_manual_change_sets_the_steps_split_again(three_versions, operator):
    rollout = start(three_versions, operator)
    releases.set_routes(three_versions, [{"version": 1, "weight": 70}, {"version": 2, "weight": 30}], operator)

    rollouts.resume(rollout, operator)

    assert routes(three_versions) == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]


def test_every_step_verdict_and_outcome_is_in_the_audit_timeline(three_versions, operator):
    rollout = start(three_versions, operator)
    judge_next(rollout)
    judge_next(rollout)

    messages = list(AuditEvent.objects.filter(kind=AuditKind.ROLLOUT).order_by("pk").values_list("data__event", flat=True))

    assert messages == ["started", "verdict", "step", "verdict", "promoted"]


# ---- rollback semantics ------------------------------------------------------------------


def test_rollback_after_a_promote_returns_to_the_last_all_stable_release(three_versions, operator):
    all_stable = three_versions.current_release()
    releases.set_routes(three_versions, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], operator)
    releases.promote(three_versions, operator)

    release = releases.rollback(three_versions, operator)

    assert release.routes == [{"version": 1, "weight": 100}] == all_stable.routes
    assert release.stable_version == 1


@pytest.mark.parametrize("step", [1, 2])
def test_a_rollback_during_a_rollout_returns_to_its_stable_at_100_not_to_its_previous_step(three_versions, operator, step):
    """At step 2 (50 %), a rollback landed on step 1 (10 %); after an operator's 30 % split
    the rollout replaced on resuming, a drill's rollback raised the canary to that 30 %."""
    rollout = start(three_versions, operator)
    for _ in range(step - 1):
        rollout = judge_next(rollout)
    assert rollout.step_index == step - 1

    release = releases.rollback(three_versions, operator, "the canary looks wrong")

    assert release.routes == [{"version": 1, "weight": 100}]


def test_a_rollback_after_a_resumed_rollout_returns_to_its_stable_not_to_the_operators_split(three_versions, operator):
    rollout = start(three_versions, operator)
    releases.set_routes(three_versions, [{"version": 1, "weight": 70}, {"version": 2, "weight": 30}], operator, "more canary")
    rollouts.resume(Rollout.objects.get(pk=rollout.pk), operator)

    release = releases.rollback(three_versions, operator)

    assert release.routes == [{"version": 1, "weight": 100}]


# ---- a shadow step ---------------------------------------------------------------------


def shadowed(model: str, version: int, compared: int = 200, agreed: int = 200, errors: int = 0, classes=None) -> dict:
    """A shadow version's report entry: its mirrored runs' outputs and comparisons."""
    entry = figures(model, version, requests=0, classes=classes if classes is not None else [compared // 4] * 4)
    entry["shadow"] = {"compared": compared, "agreed": agreed, "errors": errors, "dropped": 0}
    return entry


def test_a_first_step_of_zero_mirrors_traffic_to_the_canary_without_answering_clients(three_versions, operator):
    start(three_versions, operator, steps=[0, 50, 100], shadow_fraction=0.5)

    assert routes(three_versions) == [{"version": 1, "weight": 100}, {"version": 2, "weight": 0, "shadow": 0.5}]


# ---- a canary no worker can load --------------------------------------------------------


LOAD_ERROR = "applied but for digits (keeps the routes it served before): digits v2: artifact sha256 mismatch (expected 00…, got 3f…)"


def live_worker(worker_id: str, *, ok: bool = True, error: str = "", loaded_versions=(1,)) -> Worker:
    loaded = [{"model": "digits", "version": number, "routed": True, "ready": True} for number in loaded_versions]
    return Worker.objects.create(worker_id=worker_id, last_seen_at=timezone.now(), ok=ok, error=error, loaded=loaded)


def stable_only_window(rollout: Rollout) -> Rollout:
    """One window in which only stable answered (the canary serves nowhere), judged at its end."""
    rollout.refresh_from_db()
    at = rollout.next_window_at
    report(rollout.model, {rollout.stable_version: figures("digits", rollout.stable_version)}, at - timedelta(seconds=1))
    rollouts.tick(at)
    rollout.refresh_from_db()
    return rollout


def test_a_canary_every_live_worker_failed_to_load_fails_its_windows_and_is_rolled_back(three_versions, operator):
    """It waited for data for ever ("canary: 0 requests"), holding its share of the split
    while no worker could serve it."""
    rollout = start(three_versions, operator)
    live_worker("w-1", ok=False, error=LOAD_ERROR)
    live_worker("w-2", ok=False, error=LOAD_ERROR)

    rollout = stable_only_window(rollout)
    verdict = rollout.verdicts.get()
    assert verdict.result == "fail"
    assert verdict.reason.startswith("no worker serves v2: 2 of 2 live workers failed to load it (digits v2: artifact sha256 mismatch")
    assert [signal["name"] for signal in verdict.signals if signal["passed"] is False] == ["canary_loaded"]

    rollout = stable_only_window(rollout)
    assert rollout.status == RolloutStatus.ROLLED_BACK
    assert routes(three_versions) == [{"version": 1, "weight": 100}]


def test_another_model_s_load_error_whose_name_ends_like_this_one_s_does_not_fail_the_canary(three_versions, operator):
    rollout = start(three_versions, operator)
    live_worker("w-1", ok=False, error="applied but for big-digits (keeps the routes it served before): big-digits v2: sha256 mismatch")

    rollout = stable_only_window(rollout)

    assert rollout.verdicts.get().result == "waiting_for_data"


def test_a_canary_the_workers_are_still_loading_waits_for_data(three_versions, operator):
    rollout = start(three_versions, operator)
    live_worker("w-1")  # its last apply went well; this one's ack has not come yet

    rollout = stable_only_window(rollout)

    assert rollout.verdicts.get().result == "waiting_for_data"


def test_a_canary_one_worker_serves_waits_for_data_though_another_failed_to_load_it(three_versions, operator):
    rollout = start(three_versions, operator)
    live_worker("w-1", ok=False, error=LOAD_ERROR)
    live_worker("w-2", loaded_versions=(1, 2))

    rollout = stable_only_window(rollout)

    assert rollout.verdicts.get().result == "waiting_for_data"


def test_a_paused_rollout_saved_with_a_shadow_below_the_floor_resumes_once_migrated(three_versions, operator):
    """Saved before shadows had a floor, a rollout of shadow_fraction 1e-6 could not take
    a step again: resuming it was a 400 about "routes[1].shadow" nobody had sent."""
    from django.apps import apps

    floor = importlib.import_module("registry.migrations.0014_shadow_fraction_floor")
    rollout = start(three_versions, operator, steps=[0, 50, 100], shadow_fraction=0.5)
    rollouts.pause(rollout, operator)
    Rollout.objects.filter(pk=rollout.pk).update(shadow_fraction=1e-6)

    floor.raise_to_the_floor(apps, None)
    rollouts.resume(Rollout.objects.get(pk=rollout.pk), operator)

    assert routes(three_versions) == [{"version": 1, "weight": 100}, {"version": 2, "weight": 0, "shadow": 0.0001}]


def test_a_rollout_and_model_defaults_saved_with_alpha_0_are_judged_at_the_floor_once_migrated(three_versions, operator):
    """Saved before alpha had a floor, alpha 0 let no statistical gate fail, and every
    window judged again would refuse it; the migration raises active rollouts and model
    defaults to 0.001, and leaves a finished rollout's record as it ran."""
    from django.apps import apps

    floor = importlib.import_module("registry.migrations.0021_alpha_floor")
    finished = start(three_versions, operator)
    rollouts.abort(finished, operator)
    rollout = start(three_versions, operator)
    Rollout.objects.filter(pk__in=[finished.pk, rollout.pk]).update(analysis={**rollout.analysis, "alpha": 0})
    type(three_versions).objects.filter(pk=three_versions.pk).update(analysis={"alpha": 0, "min_requests": 50})

    floor.raise_to_the_floor(apps, None)

    assert Rollout.objects.get(pk=rollout.pk).analysis == {**rollout.analysis, "alpha": 0.001}
    assert Rollout.objects.get(pk=finished.pk).analysis["alpha"] == 0
    three_versions.refresh_from_db()
    assert three_versions.analysis == {"alpha": 0.001, "min_requests": 50}
    rollout = judge_next(Rollout.objects.get(pk=rollout.pk), canary=figures("digits", 2, errors=200))
    assert rollout.verdicts.get().result == "fail"


def test_a_shadow_step_that_agrees_with_stable_advances_to_the_first_weighted_step(three_versions, operator):
    rollout = start(three_versions, operator, steps=[0, 50, 100])

    rollout = judge_next(rollout, canary=shadowed("digits", 2))

    assert rollout.step_index == 1
    assert routes(three_versions) == [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]
    verdict = rollout.verdicts.get()
    assert {signal["name"]: signal["passed"] for signal in verdict.signals}["shadow_agreement"] is True
    assert verdict.canary["requests"] == 200  # the mirrored runs


def test_a_shadow_step_that_disagrees_with_stable_is_rolled_back_on_agreement(three_versions, operator):
    rollout = start(three_versions, operator, steps=[0, 50, 100], analysis={**FAST, "failure_limit": 1})

    rollout = judge_next(rollout, canary=shadowed("digits", 2, agreed=120))

    assert rollout.status == RolloutStatus.ROLLED_BACK
    assert "shadow agreement 60.0%" in rollout.status_reason
    assert routes(three_versions) == [{"version": 1, "weight": 100}]


def test_a_canary_with_incompatible_inputs_needs_force_with_a_reason_even_for_a_shadow_step(three_versions, operator):
    six_inputs = uploads.register_stream(three_versions, io.BytesIO(to_bytes(random_mlp([6, 4], seed=9))), uploaded_by=operator)

    with pytest.raises(releases.ReleaseConflict, match=r"v4: input 'input' dimension 1: 8 on v1, 6 here.*force: true"):
        start(three_versions, operator, canary_version=six_inputs.number, steps=[0, 100])
    with pytest.raises(releases.ReleaseError, match="force needs a reason"):
        start(three_versions, operator, canary_version=six_inputs.number, steps=[0, 100], force=True)
    rollout = start(three_versions, operator, canary_version=six_inputs.number, steps=[10, 100], force=True,
                    reason="clients move to 6 features next week")

    assert rollout.forced
    assert "forced onto incompatible inputs" in AuditEvent.objects.filter(kind=AuditKind.RELEASE).latest("pk").message


def test_a_canary_whose_stored_file_changed_is_not_rolled_out_unless_forced_with_a_reason(three_versions, operator):
    # An attacker's 201: a split to it was refused, a rollout of 99 % was not.
    path = storage.path_for(three_versions.versions.get(number=2).sha256)
    path.write_bytes(path.read_bytes() + b"\0")

    with pytest.raises(releases.CanaryNotLoaded, match=r"^v2 not rolled out: its stored file changed after its upload"):
        start(three_versions, operator, steps=[99, 100])
    rollout = start(three_versions, operator, steps=[99, 100], force=True, reason="the file is being restored")

    assert rollout.forced
    started = AuditEvent.objects.filter(kind=AuditKind.ROLLOUT).earliest("pk")
    assert "; forced although its stored file changed after its upload" in started.message
    assert started.data["forced"][0].startswith("its stored file changed after its upload")


# ---- the samples the windows read ----------------------------------------------------------


def test_the_analysis_tick_deletes_samples_older_than_their_retention(three_versions, settings):
    settings.REPORT_SAMPLE_RETENTION_S = 600
    now = timezone.now()
    report(three_versions, {1: figures("digits", 1)}, now - timedelta(seconds=601))
    report(three_versions, {1: figures("digits", 1)}, now - timedelta(seconds=599))

    rollouts.tick(now)

    assert list(ReportSample.objects.values_list("received_at", flat=True)) == [now - timedelta(seconds=599)]


# ---- an analysis that stopped ------------------------------------------------------------


def due_ago(rollout: Rollout, seconds: float) -> None:
    """The rollout's window came due ``seconds`` ago and no tick has judged it (Celery beat down)."""
    Rollout.objects.filter(pk=rollout.pk).update(next_window_at=timezone.now() - timedelta(seconds=seconds))


def test_a_window_left_unjudged_past_a_few_ticks_is_reported_overdue(three_versions, operator, viewer_client, settings):
    settings.ROLLOUT_TICK_S = 5
    rollout = start(three_versions, operator)
    due_ago(rollout, 3 * 5 + settings.ROLLOUT_OVERDUE_SLACK_S + 20)

    overdue = viewer_client.get(f"/api/models/digits/rollouts/{rollout.pk}/").json()["analysis_overdue_s"]

    assert overdue == pytest.approx(3 * 5 + settings.ROLLOUT_OVERDUE_SLACK_S + 20, abs=5)


def test_a_window_due_within_a_few_ticks_is_not_overdue(three_versions, operator, viewer_client, settings):
    settings.ROLLOUT_TICK_S = 5
    rollout = start(three_versions, operator)
    due_ago(rollout, 5)

    assert viewer_client.get(f"/api/models/digits/rollouts/{rollout.pk}/").json()["analysis_overdue_s"] is None


def test_a_shorter_overdue_slack_reports_a_window_overdue_sooner(three_versions, operator, viewer_client, settings):
    settings.ROLLOUT_TICK_S = 5
    settings.ROLLOUT_OVERDUE_SLACK_S = 1
    rollout = start(three_versions, operator)
    due_ago(rollout, 3 * 5 + 1 + 3)  # within the default 10 s of slack

    overdue = viewer_client.get(f"/api/models/digits/rollouts/{rollout.pk}/").json()["analysis_overdue_s"]

    assert overdue == pytest.approx(3 * 5 + 1 + 3, abs=2)


def test_a_paused_rollout_is_never_overdue(three_versions, operator, viewer_client):
    rollout = start(three_versions, operator)
    rollouts.pause(rollout, operator)
    due_ago(rollout, 3600)

    assert viewer_client.get(f"/api/models/digits/rollouts/{rollout.pk}/").json()["analysis_overdue_s"] is None


def a_workers_report(worker_client) -> int:
    """A worker's report posted as a worker posts it (one that has applied no state: the
    figures the windows judge are stored by ``report`` above); its status code."""
    body = {"worker": {"id": "w-1", "host": "box", "pid": 7, "url": "http://127.0.0.1:9", "device": "cpu"},
            "generation": None, "digest": None, "epoch": None, "loaded": [], "versions": [], "contract": CONTRACT_VERSION}
    return worker_client.post("/api/serving/reports", body, format="json").status_code


def a_tick_later(settings) -> None:
    """The console looks for overdue windows at most once a ROLLOUT_TICK_S per process."""
    settings.ROLLOUT_TICK_S = 0.2
    time.sleep(0.25)


def test_a_window_the_analysis_left_overdue_is_judged_by_the_console_when_a_worker_reports(three_versions, operator,
                                                                                         worker_client, settings):
    # Redis (Celery's broker) down: beat judged nothing, and a canary failing half its
    # requests kept its share for the whole outage, its workers' reports reaching the console.
    rollout = start(three_versions, operator)
    due_ago(rollout, 3 * 5 + settings.ROLLOUT_OVERDUE_SLACK_S + 20)
    a_tick_later(settings)
    report(three_versions, {2: figures("digits", 2, errors=100), 1: figures("digits", 1)}, timezone.now())

    assert a_workers_report(worker_client) == 204

    rollout.refresh_from_db()
    verdict = rollout.verdicts.get()
    assert (verdict.result, verdict.canary["requests"]) == ("fail", 200), verdict.reason
    assert re.search(r"judged by the console \d+ s after it was due: Celery beat, or its broker Redis, is not running", verdict.reason)
    assert rollout.next_window_at > timezone.now()


def test_a_window_due_within_a_few_ticks_is_left_to_celery_beat_when_a_worker_reports(three_versions, operator, worker_client,
                                                                                    settings):
    rollout = start(three_versions, operator)
    a_tick_later(settings)
    due_ago(rollout, 3 * 0.2)

    assert a_workers_report(worker_client) == 204

    assert not rollout.verdicts.exists()


def test_a_report_is_kept_when_the_overdue_window_cannot_be_judged(three_versions, operator, worker_client, settings, monkeypatch):
    rollout = start(three_versions, operator)
    due_ago(rollout, 3600)
    a_tick_later(settings)

    def fails(*args, **kwargs):
        raise RuntimeError("the analysis broke")

    monkeypatch.setattr(rollouts, "tick", fails)

    assert a_workers_report(worker_client) == 204
    assert Worker.objects.filter(worker_id="w-1").exists()


def test_a_window_judged_late_covers_the_whole_time_since_the_last_one(three_versions, operator):
    # The analysis stopped for three windows (Celery beat down): judged as the last
    # interval only, the canary's failures meanwhile went unseen and the step passed.
    rollout = judge_next(start(three_versions, operator))
    late = rollout.next_window_at + timedelta(seconds=3 * FAST["interval_s"])
    report(three_versions, {2: figures("digits", 2, errors=100), 1: figures("digits", 1)}, rollout.next_window_at)
    window_of_traffic(three_versions, rollout, late)

    rollouts.tick(late)

    verdict = rollout.verdicts.order_by("-number").first()
    assert (verdict.window_start, verdict.window_end) == (rollout.next_window_at - timedelta(seconds=FAST["interval_s"]), late)
    assert verdict.result == "fail"


def test_a_window_whose_reports_stopped_short_of_its_end_waits_for_them(three_versions, operator, settings):
    """Judged while the console could not take reports, a window passed on the 6 s of its
    12 reported before the outage, and promoted a canary that then failed 1,389 requests."""
    settings.WORKER_GONE_AFTER_S = 5
    rollout = start(three_versions, operator, steps=[50, 100])
    due = rollout.next_window_at
    report(three_versions, {2: figures("digits", 2), 1: figures("digits", 1)}, due - timedelta(seconds=6))  # then nothing reached it

    rollouts.tick(due)

    rollout.refresh_from_db()
    assert (rollout.windows_judged, rollout.status, routes(three_versions)[1]) == (0, RolloutStatus.RUNNING, {"version": 2, "weight": 50})
    assert rollout.status_reason.startswith("waiting for the workers' reports: the newest that reached the console is over 6 s old")

    later = due + timedelta(seconds=4)  # the outage's figures arrive, sent again with the next report
    report(three_versions, {2: figures("digits", 2, errors=150), 1: figures("digits", 1)}, later - timedelta(seconds=1))
    rollouts.tick(later)

    verdict = rollout.verdicts.get()
    assert (verdict.window_end, verdict.result) == (later, "fail")
    assert verdict.canary["requests"] == 400  # the whole window, before and after the outage


def test_a_window_no_report_reached_waits_when_a_worker_was_live_as_it_began(three_versions, operator, settings):
    """The console killed just after a verdict: the next window had no report at all and
    was judged "waiting for data, 0 requests a side" instead of waiting for the reports."""
    settings.WORKER_GONE_AFTER_S = 5
    rollout = start(three_versions, operator)
    due = rollout.next_window_at
    Worker.objects.create(worker_id="w-1", last_seen_at=rollout.step_started_at - timedelta(seconds=1))

    rollouts.tick(due)

    rollout.refresh_from_db()
    assert rollout.windows_judged == 0 and rollout.status_reason.startswith("waiting for the workers' reports")


def test_a_window_is_judged_when_its_reporters_fell_silent_but_the_console_hears_from_workers(three_versions, operator, settings):
    """A worker restarted with no traffic sends reports without figures: the reports reach
    the console, and waiting for figures would have said, falsely, that they did not."""
    settings.WORKER_GONE_AFTER_S = 5
    rollout = start(three_versions, operator)
    due = rollout.next_window_at
    report(three_versions, {2: figures("digits", 2), 1: figures("digits", 1)}, due - timedelta(seconds=8))
    Worker.objects.create(worker_id="restarted", last_seen_at=due - timedelta(seconds=1))

    rollouts.tick(due)

    assert rollout.verdicts.count() == 1


def test_a_window_is_judged_when_one_worker_reports_though_another_fell_silent(three_versions, operator, settings):
    settings.WORKER_GONE_AFTER_S = 5
    rollout = start(three_versions, operator)
    due = rollout.next_window_at
    versions = {version.number: version for version in three_versions.versions.all()}
    samples.store("gone-worker", [(versions[2], figures("digits", 2)), (versions[1], figures("digits", 1))], received_at=due - timedelta(seconds=8))
    report(three_versions, {2: figures("digits", 2), 1: figures("digits", 1)}, due - timedelta(seconds=1))

    rollouts.tick(due)

    assert rollout.verdicts.count() == 1


def test_a_rollout_waiting_for_reports_says_so_where_the_overdue_analysis_is_shown(three_versions, operator, settings):
    settings.WORKER_GONE_AFTER_S, settings.ROLLOUT_TICK_S = 5, 5
    rollout = start(three_versions, operator)
    Rollout.objects.filter(pk=rollout.pk).update(step_started_at=timezone.now() - timedelta(seconds=100))
    report(three_versions, {2: figures("digits", 2), 1: figures("digits", 1)}, timezone.now() - timedelta(seconds=60))
    due_ago(rollout, 3 * 5 + settings.ROLLOUT_OVERDUE_SLACK_S + 20)
    rollouts.tick()

    page = Client()
    page.force_login(operator)
    panel = page.get("/models/digits/", {"fragment": "rollout-panel"}).content.decode()

    assert "It is waiting for the workers&#x27; reports: the newest that reached the console is over" in panel
    assert "Are the Celery worker that runs beat" not in panel


def test_a_window_whose_figures_compute_to_infinity_is_still_judged_and_saved(three_versions, operator):
    """A latency bound of 9e307 s (stored before the contract's limit) is Infinity in ms: every
    verdict of the window failed to save (JSON holds no Infinity) and the analysis jammed."""
    rollout = start(three_versions, operator)
    hostile = figures("digits", 2)
    hostile["latency_buckets"] = {"9e307": 200, "+Inf": 200}

    rollout = judge_next(rollout, canary=hostile)

    verdict = rollout.verdicts.get()
    assert rollout.windows_judged == 1
    assert next(signal for signal in verdict.signals if signal["name"] == "latency_p99")["value"] is None
