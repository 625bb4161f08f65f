"""Traffic changes through the API: split, promote, roll back, restore, and who may."""

from __future__ import annotations

import pytest

from registry.artifacts import storage
from registry.fleet.state import desired_state
from registry.models import AuditEvent, Release
from serving.contract import CONTRACT_VERSION
from tests.fixtures.evaluations import evaluated_on_holdout

pytestmark = pytest.mark.django_db

RELEASE = "/api/models/digits/release/"


def split(client, routes, reason=""):
    return client.post(RELEASE, {"routes": routes, "reason": reason}, format="json")


def current_routes(model):
    return model.current_release().routes


def test_operator_sets_a_canary_split(operator_client, three_versions):
    response = split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], "try v2")

    assert response.status_code == 201, response.content
    release = response.json()["release"]
    assert release["routes"] == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
    assert release["generation"] == 2
    assert release["stable_version"] == 1
    assert release["actor"] == "olivia"
    assert release["reason"] == "try v2"


@pytest.mark.parametrize(
    ("routes", "words"),
    [
        ([{"version": 1, "weight": 90}, {"version": 2, "weight": 20}], "sum to 100, got 110"),
        ([{"version": 1, "weight": 50}, {"version": 9, "weight": 50}], "version 9 does not exist"),
        ([{"version": 1, "weight": 50.5}, {"version": 2, "weight": 49.5}], "weight must be an integer"),
        ([{"version": 2, "weight": 50}, {"version": 3, "weight": 50}], "a canary needs a stable"),
        ([{"version": 1, "weight": 100}, {"version": 1, "weight": 0}], "appears twice"),
        ([{"version": 1, "weight": 100, "colour": "red"}], "unknown field"),
        ([], "routes"),
        # Refused by its length before any item is read: DRF read every item first.
        pytest.param([7] * 100_000, "at most 256 routes", id="100000-routes"),
    ],
)
def test_invalid_split_is_refused_and_nothing_changes(operator_client, three_versions, routes, words):
    response = split(operator_client, routes)

    assert response.status_code == 400
    assert words in response.json()["error"]
    assert Release.objects.count() == 1


@pytest.mark.parametrize(("status", "words"), [
    ("validating", "version 2 is still being validated: it can take traffic once it is ready"),
    ("rejected", "version 2 was rejected by its validation (its page says why): it cannot take traffic"),
])
def test_a_split_to_a_version_that_is_not_ready_says_why(operator_client, three_versions, status, words):
    # "does not exist or is not ready" sent a newcomer looking for a version still being validated.
    three_versions.versions.filter(number=2).update(status=status)

    response = split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])

    assert (response.status_code, response.json()["error"]) == (400, words)
    assert Release.objects.count() == 1


def test_a_rollout_of_a_version_still_being_validated_says_so(operator_client, three_versions):
    three_versions.versions.filter(number=2).update(status="validating")

    response = operator_client.post("/api/models/digits/rollouts/", {"canary_version": 2, "steps": [10, 100]}, format="json")

    assert response.status_code == 400
    assert response.json()["error"] == "version 2 is still being validated: it can take traffic once it is ready"


def failing_to_load_v2() -> None:
    from django.utils import timezone

    from registry.models import Worker

    Worker.objects.create(worker_id="w-1", last_seen_at=timezone.now(), ok=False, error="digits v2: artifact sha256 mismatch",
                          loaded=[{"model": "digits", "version": 1, "routed": True, "ready": True}])


def test_a_canary_the_live_workers_failed_to_load_is_not_promoted_unless_forced_with_a_reason(operator_client, three_versions):
    # Promoted with a 201 and no word: the page read "v2 100 %" while every worker went on
    # serving v1 (an operator's fault run).
    split(operator_client, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    failing_to_load_v2()

    refused = operator_client.post(RELEASE + "promote/", {}, format="json")
    unexplained = operator_client.post(RELEASE + "promote/", {"force": True}, format="json")
    forced = operator_client.post(RELEASE + "promote/", {"force": True, "reason": "its file is being restored"}, format="json")

    assert refused.status_code == 409
    assert refused.json()["error"] == ("v2 not promoted: no worker serves v2: 1 of 1 live worker failed to load it (digits v2: artifact "
                                       "sha256 mismatch); the workers would go on serving what they serve now. Mend or replace the "
                                       "version, or send force: true with a reason to do it anyway")
    assert (unexplained.status_code, unexplained.json()["error"]) == (400, "force needs a reason: say why v2, which no live worker "
                                                                           "could load, is promoted")
    assert forced.status_code == 201, forced.content
    assert forced.json()["release"]["routes"] == [{"version": 2, "weight": 100}]
    assert Release.objects.count() == 3  # the first, the split, the forced promote: the refusals made none
    audit = AuditEvent.objects.filter(kind="release").order_by("-pk").first()
    assert audit.data["forced"] == ["no worker serves v2: 1 of 1 live worker failed to load it (digits v2: artifact sha256 mismatch)"]
    assert audit.message.endswith("; forced although no worker serves v2: 1 of 1 live worker failed to load it (digits v2: artifact "
                                  "sha256 mismatch): its file is being restored")


# ---- a version evaluated worse than the stable one: said in the answer and the audit ----------------

V2_WORSE = "v2 was evaluated worse than the stable v1: accuracy 11.0% on holdout, against v1's accuracy 89.0%"


def test_a_promote_of_a_version_evaluated_worse_says_so_in_its_answer_and_its_audit(operator_client, three_versions):
    # Only the console's dialogs said it: an API client promoted v2 at 11 % (stable 89 %) and heard nothing.
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    evaluated_on_holdout(three_versions, {1: 0.89, 2: 0.11})

    promoted = operator_client.post(RELEASE + "promote/", {"reason": "ship it"}, format="json")

    assert promoted.status_code == 201, promoted.content
    assert promoted.json()["evaluated_worse"] == [V2_WORSE]
    audit = AuditEvent.objects.filter(kind="release").order_by("-pk").first()
    assert audit.data["evaluated_worse"] == [V2_WORSE]
    assert audit.message.endswith("; " + V2_WORSE)


def test_a_split_or_a_restore_giving_traffic_to_a_version_evaluated_worse_says_so(operator_client, three_versions):
    evaluated_on_holdout(three_versions, {1: 0.89, 2: 0.11})

    split_answer = split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    back = operator_client.post(RELEASE + "rollback/", {}, format="json")
    restored = operator_client.post(RELEASE + "restore/", {"generation": 2}, format="json")

    assert split_answer.json()["evaluated_worse"] == [V2_WORSE]
    assert "evaluated_worse" not in back.json()  # back to v1 alone: nothing worse takes traffic
    assert restored.json()["evaluated_worse"] == [V2_WORSE]


@pytest.mark.parametrize("accuracies", [{1: 0.89, 2: 0.88}, {1: 0.89}, {2: 0.11}],
                         ids=["within-a-point", "canary-not-evaluated", "stable-not-evaluated"])
def test_a_promote_says_nothing_of_evaluations_unless_both_were_measured_and_the_canary_is_worse(operator_client, three_versions, accuracies):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    evaluated_on_holdout(three_versions, accuracies)

    promoted = operator_client.post(RELEASE + "promote/", {}, format="json")

    assert promoted.status_code == 201, promoted.content
    assert "evaluated_worse" not in promoted.json()
    assert "evaluated_worse" not in AuditEvent.objects.filter(kind="release").order_by("-pk").first().data


def test_a_split_sending_traffic_to_a_version_the_live_workers_failed_to_load_is_refused_unless_forced(operator_client, three_versions):
    # 100 % to it was a promote by another door: 201, stable v2, nothing forced or said.
    split(operator_client, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    failing_to_load_v2()

    refused = split(operator_client, [{"version": 2, "weight": 100}])
    forced = operator_client.post(RELEASE, {"routes": [{"version": 2, "weight": 100}], "force": True, "reason": "restored"}, format="json")

    assert refused.status_code == 409
    assert refused.json()["error"].startswith("v2 not routed: no worker serves v2: 1 of 1 live worker failed to load it")
    assert forced.status_code == 201, forced.content
    audit = AuditEvent.objects.filter(kind="release").order_by("-pk").first()
    assert audit.data["forced"] == ["no worker serves v2: 1 of 1 live worker failed to load it (digits v2: artifact sha256 mismatch)"]


def test_a_restore_giving_traffic_to_a_version_the_live_workers_failed_to_load_is_refused_unless_forced(operator_client, three_versions):
    # An attacker's 201: the split was refused, the restore of a release routing it was not.
    split(operator_client, [{"version": 2, "weight": 100}], "v2 alone")  # generation 2
    split(operator_client, [{"version": 1, "weight": 100}], "back")  # generation 3
    failing_to_load_v2()

    refused = operator_client.post(RELEASE + "restore/", {"generation": 2}, format="json")
    forced = operator_client.post(RELEASE + "restore/", {"generation": 2, "force": True, "reason": "file restored"}, format="json")

    assert (refused.status_code, refused.json()["error"]) == (409, (
        "v2 not routed: no worker serves v2: 1 of 1 live worker failed to load it (digits v2: artifact sha256 mismatch); the workers "
        "would go on serving what they serve now. Mend or replace the version, or send force: true with a reason to do it anyway"))
    assert forced.status_code == 201, forced.content
    audit = AuditEvent.objects.filter(kind="release").order_by("-pk").first()
    assert audit.data["forced"] == ["no worker serves v2: 1 of 1 live worker failed to load it (digits v2: artifact sha256 mismatch)"]
    assert audit.message.endswith(": file restored")


def test_a_version_whose_stored_file_is_missing_is_not_routed_unless_forced_though_no_worker_said_so(operator_client, three_versions,
                                                                                                     artifact_root):
    # The workers' load errors are forgotten once they apply another state: what the
    # console knows of its own store stays.
    storage.path_for(three_versions.versions.get(number=2).sha256).unlink()

    refused = split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])

    assert (refused.status_code, refused.json()["error"]) == (409, (
        "v2 not routed: its stored file is missing from the artifact store, so no worker can download it; the workers would go on "
        "serving what they serve now. Mend or replace the version, or send force: true with a reason to do it anyway"))


def test_a_version_whose_stored_file_the_console_saw_changed_is_not_routed_unless_forced(operator_client, three_versions):
    v2 = three_versions.versions.get(number=2)
    path = storage.path_for(v2.sha256)
    path.write_bytes(path.read_bytes()[:-1] + b"\0")
    b"".join(operator_client.get("/api/models/digits/versions/2/artifact").streaming_content)  # a worker's download: the console hashes it

    refused = split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])

    assert refused.status_code == 409
    assert refused.json()["error"].startswith("v2 not routed: its stored file changed after its upload (the console's last download of it "
                                              "did not match its sha256)")


def test_a_version_whose_stored_file_was_cut_short_is_not_routed_unforced_before_any_download(operator_client, three_versions):
    # A tired operator's split to a version whose file had changed was made and said
    # "Workers are converging" while every worker went on serving what it served.
    path = storage.path_for(three_versions.versions.get(number=2).sha256)
    uploaded = path.read_bytes()
    path.write_bytes(uploaded[:-10])

    refused = split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])

    assert refused.status_code == 409
    assert refused.json()["error"].startswith(f"v2 not routed: its stored file changed after its upload ({len(uploaded) - 10} bytes, not "
                                              f"the {len(uploaded)} uploaded)")


def test_a_version_named_only_before_the_cut_of_a_long_load_error_counts_as_failed_to_load(operator_client, worker_client, three_versions):
    # Five models' canaries broken: the ack's error, kept to its first 2,000 characters,
    # named the fifth model only in its "applied but for" list, and its promote went through.
    from django.utils import timezone

    from registry.models import Worker

    split(operator_client, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    error = ("applied but for a-model (served as before), digits (served as before): a-model v3: " + "x" * 1990)[:2000] + "…"
    Worker.objects.create(worker_id="w-1", last_seen_at=timezone.now(), ok=False, error=error,
                          loaded=[{"model": "digits", "version": 1, "routed": True, "ready": True}])

    refused = operator_client.post(RELEASE + "promote/", {}, format="json")

    assert (refused.status_code, refused.json()["error"]) == (409, (
        "v2 not promoted: no worker serves v2: 1 of 1 live worker failed to apply digits (its error, cut to 2000 characters, names it "
        "as failing but not why); the workers would go on serving what they serve now. Mend or replace the version, or send force: "
        "true with a reason to do it anyway"))


def test_a_version_no_state_routed_is_not_blamed_for_a_cut_error_naming_its_model(operator_client, three_versions):
    # v3 broke and the error was cut before its words: the operator's split to v2, the
    # mend, was refused as if v2 had failed to load.
    from django.utils import timezone

    from registry.models import Worker

    split(operator_client, [{"version": 1, "weight": 90}, {"version": 3, "weight": 10}])
    error = ("applied but for digits (served as before): digits v3: " + "x" * 2000)[:2000] + "…"
    Worker.objects.create(worker_id="w-1", last_seen_at=timezone.now(), ok=False, error=error,
                          loaded=[{"model": "digits", "version": 1, "routed": True, "ready": True}])

    response = split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])

    assert response.status_code == 201, response.content


@pytest.mark.parametrize(("reason", "words"), [
    ("\x1b[2J cleared", "must be one line of text without control characters or directional overrides (found U+001B)"),
    ("line\nbreak", "(found U+000A)"),
    ("\u202egnp.exe", "(found U+202E)"),
    ("line\u2028separator", "(found U+2028)"),
    ("hidden\U000e0069\U000e0067tag", "must not hold tag characters outside an emoji flag: they carry text no one sees (found U+E0069)"),
])
def test_a_reason_holding_control_characters_or_hidden_text_is_refused_and_nothing_changes(operator_client, three_versions, reason, words):
    response = split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], reason)

    assert response.status_code == 400
    assert response.json()["error"].startswith("reason: ") and words in response.json()["error"], response.json()
    assert Release.objects.count() == 1


@pytest.mark.parametrize("reason", [
    "\u05e2\u05d1\u05e8\u05d9\u05ea v2 \u200f(canary)",  # Hebrew with a right-to-left mark
    "\u0645\u062b\u0627\u0644\u061c 2",  # Arabic with its letter mark
    "\u0645\u06cc\u200c\u062e\u0648\u0627\u0645",  # Persian with a zero-width non-joiner
    "soft\u00adhyphen from a word processor",
    "\ufeffpasted with a byte order mark",
    "go \U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",  # Scotland's flag
])
def test_a_reason_in_real_text_is_kept_as_typed(operator_client, three_versions, reason):
    response = split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], reason)

    assert (response.status_code, response.json()["release"]["reason"]) == (201, reason)


def test_a_reason_pasted_with_a_tab_is_kept(operator_client, three_versions):
    response = split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], "ticket\t4711")

    assert (response.status_code, response.json()["release"]["reason"]) == (201, "ticket\t4711")


@pytest.mark.parametrize("reason", ["\u200d", "\u3164", "\u2800", "\u0301", "\ufe0f", "\u115f\uffa0"])
def test_a_forced_change_whose_reason_shows_nothing_is_refused(operator_client, three_versions, reason):
    split(operator_client, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    failing_to_load_v2()

    response = operator_client.post(RELEASE + "promote/", {"force": True, "reason": reason}, format="json")

    assert (response.status_code, response.json()["error"]) == (400, "force needs a reason: say why v2, which no live worker could load, "
                                                                     "is promoted")


def test_a_split_back_to_the_stable_alone_is_never_held_by_a_canary_that_failed_to_load(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    failing_to_load_v2()

    assert split(operator_client, [{"version": 1, "weight": 100}]).status_code == 201


def test_promote_makes_the_canary_stable_at_full_weight(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])

    response = operator_client.post(RELEASE + "promote/", {}, format="json")

    assert response.status_code == 201
    assert response.json()["release"]["routes"] == [{"version": 2, "weight": 100}]
    assert response.json()["release"]["stable_version"] == 2


def test_promote_without_a_canary_is_a_conflict(operator_client, three_versions):
    response = operator_client.post(RELEASE + "promote/", {}, format="json")

    assert response.status_code == 409
    assert "nothing to promote" in response.json()["error"]
    assert Release.objects.count() == 1


def test_rollback_restores_the_previous_split(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])

    response = operator_client.post(RELEASE + "rollback/", {}, format="json")

    assert response.status_code == 201
    assert response.json()["release"]["routes"] == [{"version": 1, "weight": 100}]
    assert response.json()["release"]["action"] == "rollback"
    assert "rollback of generation 2" in response.json()["release"]["reason"]


def test_rolling_back_twice_walks_back_twice(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    split(operator_client, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])

    operator_client.post(RELEASE + "rollback/", {}, format="json")
    assert current_routes(three_versions) == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
    operator_client.post(RELEASE + "rollback/", {}, format="json")
    assert current_routes(three_versions) == [{"version": 1, "weight": 100}]


def test_rollback_of_the_first_release_is_a_conflict(operator_client, three_versions):
    response = operator_client.post(RELEASE + "rollback/", {}, format="json")

    assert response.status_code == 409
    assert "nothing to roll back to" in response.json()["error"]
    assert Release.objects.count() == 1


def test_a_split_that_changes_nothing_is_a_conflict_and_makes_no_generation(operator_client, three_versions):
    # It used to make a new generation, which became the rollback point: the one-click
    # rollback then offered to "return" to the very split being served, and refused.
    split(operator_client, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    count = Release.objects.count()

    response = split(operator_client, [{"version": 2, "weight": 50}, {"version": 1, "weight": 50}])  # a retried call, reordered

    assert response.status_code == 409
    assert response.json()["error"] == "digits already serves v1 50%, v2 50% (generation 2): nothing to change"
    assert Release.objects.count() == count


def test_a_rollback_that_would_change_no_traffic_is_a_conflict_naming_why(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    split(operator_client, [{"version": 1, "weight": 70}, {"version": 2, "weight": 30}])
    operator_client.post(RELEASE + "restore/", {"generation": 2}, format="json")  # generation 4: 50/50 again, over 70/30
    # A restore of what is served is refused now; a rollout's step may still set it again
    # (generation 5), and one made before its rollback returned to the stable at 100 % (an
    # upgraded database's) rolls back to generation 4.
    operator_client.post("/api/models/digits/rollouts/", {"canary_version": 2, "steps": [50, 100]}, format="json")
    Release.objects.filter(generation=5).update(rollback_target=Release.objects.get(generation=4))
    count = Release.objects.count()

    response = operator_client.post(RELEASE + "rollback/", {}, format="json")

    assert response.status_code == 409
    assert response.json()["error"].startswith(
        "nothing to roll back to: generation 4, the release before, routes the same traffic (v1 50%, v2 50%)")
    assert Release.objects.count() == count


def test_a_rollback_back_to_the_first_release_does_not_call_itself_the_first(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    rolled_back = operator_client.post(RELEASE + "rollback/", {}, format="json").json()["release"]["generation"]

    response = operator_client.post(RELEASE + "rollback/", {}, format="json")

    assert response.status_code == 409
    assert response.json()["error"] == (f"nothing to roll back to: generation {rolled_back} (rolled back) has no earlier routes "
                                         "to return to; restore an earlier generation from the history instead")


def test_a_traffic_reason_past_500_characters_is_refused(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])

    response = operator_client.post(RELEASE + "rollback/", {"reason": "x" * 501}, format="json")

    assert response.status_code == 400
    assert response.json()["error"].startswith("reason:")

def test_restore_brings_back_any_earlier_generation(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    split(operator_client, [{"version": 3, "weight": 100}])

    response = operator_client.post(RELEASE + "restore/", {"generation": 2}, format="json")

    assert response.status_code == 201
    assert response.json()["release"]["routes"] == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
    assert response.json()["release"]["action"] == "restore"


@pytest.mark.parametrize("generation", [4, 2])
def test_restoring_the_split_served_now_is_a_conflict_naming_the_generation_and_writes_nothing(operator_client, three_versions, generation):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    split(operator_client, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    counts = (Release.objects.count(), AuditEvent.objects.count())

    response = operator_client.post(RELEASE + "restore/", {"generation": generation}, format="json")  # the current one, or its split's twin

    assert response.status_code == 409
    assert response.json()["error"] == (f"generation {generation} routes what digits serves now (v1 90%, v2 10%, generation 4): "
                                        "nothing to restore")
    assert (Release.objects.count(), AuditEvent.objects.count()) == counts


def test_a_refused_restore_of_the_split_served_now_leaves_the_rollback_where_it_was(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    operator_client.post(RELEASE + "restore/", {"generation": 2}, format="json")

    assert operator_client.get(RELEASE).json()["rollback_returns_to"] == "v1 100% (generation 1)"
    response = operator_client.post(RELEASE + "rollback/", {}, format="json")
    assert (response.status_code, response.json()["release"]["routes"]) == (201, [{"version": 1, "weight": 100}])


def test_restore_of_an_unknown_generation_is_refused(operator_client, three_versions):
    response = operator_client.post(RELEASE + "restore/", {"generation": 99}, format="json")

    assert response.status_code == 400
    assert "no release with generation 99" in response.json()["error"]


@pytest.mark.parametrize(
    ("path", "body"),
    [("", {"routes": [{"version": 2, "weight": 100}]}), ("promote/", {}), ("rollback/", {}), ("restore/", {"generation": 1})],
)
def test_viewer_cannot_change_traffic(viewer_client, three_versions, path, body):
    response = viewer_client.post(RELEASE + path, body, format="json")

    assert response.status_code == 403
    assert Release.objects.count() == 1


def test_viewer_reads_the_current_release(viewer_client, three_versions):
    response = viewer_client.get(RELEASE)

    assert response.status_code == 200
    assert response.json()["release"]["routes"] == [{"version": 1, "weight": 100}]
    assert response.json()["workers"] == []
    assert response.json()["converged"] is False


def test_history_lists_every_change_newest_first(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    operator_client.post(RELEASE + "rollback/", {}, format="json")

    history = operator_client.get("/api/models/digits/releases/").json()

    assert [entry["action"] for entry in history] == ["rollback", "set_routes", "initial"]
    assert [entry["generation"] for entry in history] == [3, 2, 1]


def test_desired_state_routes_the_split_and_keeps_the_rollback_target_warm(operator_client, three_versions):
    split(operator_client, [{"version": 2, "weight": 100}])

    state = desired_state()

    digits = state["models"]["digits"]
    assert state["generation"] == 2
    assert [(route["version"], route["weight"]) for route in digits["routes"]] == [(2, 100)]
    assert [entry["version"] for entry in digits["warm"]] == [1]
    assert digits["routes"][0]["artifact_url"] == "/api/models/digits/versions/2/artifact"
    assert digits["routes"][0]["signature"]["inputs"][0]["name"] == "input"


def test_desired_state_keeps_no_version_warm_that_it_already_routes(operator_client, three_versions):
    # The rollback target (v1 at 100%) is the split's stable: routed, so not listed warm again.
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])

    digits = desired_state()["models"]["digits"]

    assert [route["version"] for route in digits["routes"]] == [1, 2]
    assert digits["warm"] == []


def test_audit_timeline_joins_uploads_and_traffic_changes(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    operator_client.post(RELEASE + "rollback/", {}, format="json")

    kinds = [event["kind"] for event in operator_client.get("/api/models/digits/audit/").json()]

    assert kinds == ["release", "release", "version_uploaded", "version_uploaded", "release", "version_uploaded"]


def test_shadow_route_is_accepted_with_zero_weight(operator_client, three_versions):
    response = split(operator_client, [{"version": 1, "weight": 100}, {"version": 3, "weight": 0, "shadow": 0.1}])

    assert response.status_code == 201
    assert response.json()["release"]["routes"][1] == {"version": 3, "weight": 0, "shadow": 0.1}


@pytest.mark.parametrize("shadow", [0, 5e-324, 0.00009, 1.5, True, "0.1"])
def test_a_shadow_below_one_request_in_ten_thousand_or_not_a_fraction_is_a_400(operator_client, three_versions, shadow):
    response = split(operator_client, [{"version": 1, "weight": 100}, {"version": 3, "weight": 0, "shadow": shadow}])

    assert response.status_code == 400
    assert "routes[1].shadow must be a fraction from 0.0001 (one request in 10,000) to 1" in response.json()["error"]
    assert Release.objects.count() == 1


def test_a_shadow_of_one_request_in_ten_thousand_is_accepted(operator_client, three_versions):
    response = split(operator_client, [{"version": 1, "weight": 100}, {"version": 3, "weight": 0, "shadow": 0.0001}])

    assert response.status_code == 201


def test_viewer_cannot_run_a_drill(viewer_client, three_versions):
    from registry.models import Drill

    response = viewer_client.post("/api/models/digits/drills/", {}, format="json")

    assert response.status_code == 403
    assert Drill.objects.count() == 0
    assert Release.objects.count() == 1


def test_drill_with_nothing_to_roll_back_is_a_conflict_and_recorded(operator_client, three_versions):
    response = operator_client.post("/api/models/digits/drills/", {}, format="json")

    assert response.status_code == 409
    assert "nothing to roll back to" in response.json()["error"]
    drills = operator_client.get("/api/models/digits/drills/").json()
    assert [(drill["status"], drill["error"].startswith("nothing to roll back to")) for drill in drills] == [("error", True)]
    assert Release.objects.count() == 1


def test_drill_without_live_workers_fails_and_says_why(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])

    drill = operator_client.post("/api/models/digits/drills/", {"roll_forward": False}, format="json").json()

    assert drill["status"] == "failed"
    assert drill["error"] == "no live workers to follow the rollback"
    assert current_routes(three_versions) == [{"version": 1, "weight": 100}]


def test_a_drill_restores_the_split_afterwards_by_default(operator_client, three_versions):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])

    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()

    assert drill["roll_forward"] is True
    assert current_routes(three_versions) == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("restore/", {"generation": 2**64}, "generation"),
        ("rollback/", {"expected_generation": 2**64}, "expected_generation"),
        ("restore/", {"generation": True}, "generation"),
        ("rollback/", {"reason": 42}, "reason"),
        ("drills/", {"roll_forward": "yes"}, "roll_forward"),
    ],
)
def test_out_of_range_or_mistyped_numbers_are_a_bad_request(operator_client, three_versions, path, body, field):
    url = "/api/models/digits/drills/" if path == "drills/" else RELEASE + path

    response = operator_client.post(url, body, format="json")

    assert response.status_code == 400, response.content
    assert response.json()["error"].startswith(f"{field}: ")
    assert Release.objects.count() == 1


@pytest.mark.parametrize("path", ["", "promote/", "rollback/", "restore/"])
def test_traffic_actions_read_json_only(operator_client, three_versions, path):
    response = operator_client.post(RELEASE + path, "routes=1", content_type="application/x-www-form-urlencoded")

    assert response.status_code == 415
    assert response.json()["error"] == 'Unsupported media type "application/x-www-form-urlencoded" in request. This endpoint takes application/json.'
    assert Release.objects.count() == 1


def test_release_answer_matches_its_documented_shape(operator_client, three_versions):
    body = operator_client.get(RELEASE).json()

    assert sorted(body) == ["archived", "converged", "failing_elsewhere", "live_converged", "model", "release", "rollback_ready", "rollback_returns_to", "unconfirmed_silent", "workers"]
    assert body["release"]["actor"] is None or isinstance(body["release"]["actor"], str)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/serving/acks", {"worker": "w1", "generation": 2**64, "digest": "0" * 64, "ok": True, "contract": CONTRACT_VERSION}),
        ("/api/serving/reports", {"worker": {"id": "w1", "pid": 2**40}, "generation": 1, "contract": CONTRACT_VERSION}),
        ("/api/serving/reports", {"worker": {"id": 7}, "generation": 1, "contract": CONTRACT_VERSION}),
    ],
)
def test_worker_posts_with_out_of_range_or_mistyped_values_are_a_bad_request(three_versions, settings, path, body):
    from rest_framework.test import APIClient

    from registry.models import Worker, WorkerAck

    worker = APIClient()
    worker.credentials(HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}")

    response = worker.post(path, body, format="json")

    assert response.status_code == 400, response.content
    assert (Worker.objects.count(), WorkerAck.objects.count()) == (0, 0)
