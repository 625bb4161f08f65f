"""Workers' reports and acks as the console receives them, and what the API shows."""

from __future__ import annotations

import json
import math
import re

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from registry.api.permissions import WorkerTokenAuthentication
from registry.fleet.state import issued_digest, issued_state
from registry.models import (
    AuditEvent,
    Drill,
    ModelVersion,
    RegisteredModel,
    Release,
    Worker,
    WorkerAck,
)
from serving.contract import CONTRACT_VERSION, MAX_COUNT
from serving.state_signing import model_digests
from tests.fixtures.minutes import clear_of_a_minute_turn
from tests.registry.conftest import in_thread, wait_for_generation

pytestmark = pytest.mark.django_db


def ack(generation: int, ok: bool = True, **extra) -> dict:
    """An ack of the state the console issued as ``generation``."""
    return {"worker": "w-1", "generation": generation, "digest": issued_digest(generation), "ok": ok, "contract": CONTRACT_VERSION, **extra}


def report(generation=1, **extra):
    return {
        "worker": {"id": "w-1", "host": "box", "pid": 7, "url": "http://127.0.0.1:9", "device": "cpu"},
        "generation": generation,
        "loaded": [{"model": "digits", "version": 1, "routed": True, "ready": True}],
        "versions": [{"model": "digits", "version": 1, "requests": 5, "errors": 0, "latency_sum_s": 0.01,
                      "latency_buckets": {"0.001": 5, "+Inf": 5}, "batch_size_buckets": {"1": 5, "+Inf": 5}}],
        "contract": CONTRACT_VERSION,
        **extra,
    }


def test_reported_worker_is_listed_with_its_generation_and_last_report(worker_client, viewer_client):
    assert worker_client.post("/api/serving/reports", report(generation=3), format="json").status_code == 204

    workers = viewer_client.get("/api/workers/").json()

    assert [(row["worker_id"], row["generation"], row["device"]) for row in workers] == [("w-1", 3, "cpu")]
    assert workers[0]["last_report"]["versions"][0]["requests"] == 5


def test_a_worker_is_listed_with_the_digest_of_the_generation_it_is_listed_at_after_an_ack(worker_client, operator_client, viewer_client,
                                                                                             three_versions):
    worker_client.post("/api/serving/reports", report(generation=1, digest=issued_digest(1)), format="json")
    operator_client.post("/api/models/digits/release/", {"routes": [{"version": 2, "weight": 100}], "reason": "v2"}, format="json")
    worker_client.post("/api/serving/acks", ack(2), format="json")

    row = viewer_client.get("/api/workers/").json()[0]
    state = worker_client.get("/api/serving/state").json()

    assert (row["generation"], row["digest"]) == (2, issued_digest(2)) == (state["generation"], state["digest"])
    assert row["converged"] is True


def test_report_without_identity_is_refused(worker_client):
    response = worker_client.post("/api/serving/reports", {"generation": 1, "contract": CONTRACT_VERSION}, format="json")

    assert response.status_code == 400
    assert response.json()["error"].startswith("worker:")


@pytest.mark.parametrize(
    ("change", "field"),
    [({"loaded": "everything"}, "loaded"), ({"loaded": [{"model": "digits"}]}, "version"), ({"versions": [3]}, "versions"),
     ({"generation": "new"}, "generation"),
     # Lone surrogates: PostgreSQL refused the row (a 500); SQLite stored it and /api/workers/ answered 500 after.
     ({"models": {"\ud800x": "a" * 64}}, "models"), ({"versions": [{"model": "\ud800", "version": 1, "requests": 0}]}, "versions[0].model"),
     ({"models": {"digits": "a" * 64, "not a model": "b" * 64}}, "models['not a model']: must be a model name")],
)
def test_malformed_report_is_refused_and_nothing_recorded(worker_client, viewer_client, change, field):
    # json.dumps escapes what the test client's renderer cannot encode (a lone surrogate).
    response = worker_client.post("/api/serving/reports", json.dumps(report(**change)), content_type="application/json")

    assert response.status_code == 400
    assert field in response.content.decode()
    assert viewer_client.get("/api/workers/").json() == []


def test_reports_and_acks_need_the_worker_token(operator_client):
    assert operator_client.post("/api/serving/reports", report(), format="json").status_code == 401
    assert operator_client.post("/api/serving/acks", {"worker": "w", "generation": 1, "ok": True}, format="json").status_code == 401


def test_a_repeated_ack_is_stored_once(worker_client, three_versions):
    worker_client.post("/api/serving/reports", report(), format="json")
    body = ack(1, load_ms=12.5)

    assert worker_client.post("/api/serving/acks", body, format="json").status_code == 204
    assert worker_client.post("/api/serving/acks", body, format="json").status_code == 204

    assert WorkerAck.objects.filter(worker_id="w-1", generation=1).count() == 1


def test_failed_ack_marks_the_worker_not_converged(worker_client, operator_client, three_versions):
    worker_client.post("/api/serving/reports", report(generation=1), format="json")
    operator_client.post("/api/models/digits/release/", {"routes": [{"version": 2, "weight": 100}]}, format="json")

    worker_client.post("/api/serving/acks", ack(2, ok=False, error="sha256 mismatch"), format="json")

    body = operator_client.get("/api/models/digits/release/").json()
    assert body["converged"] is False
    assert body["workers"][0] | {"last_seen_at": None} == {
        "worker_id": "w-1", "generation": 1, "converged": False, "state": "failed to apply: sha256 mismatch", "ok": False, "error": "sha256 mismatch",
        "rollback_warm": True, "last_seen_at": None,
    }


def test_a_failed_acks_error_is_kept_to_its_first_2000_characters(worker_client, operator_client, three_versions):
    """An audit's 40 acks of 2.5 MB errors grew the database by 201 MB and /api/workers/ to 97 MB."""
    worker_client.post("/api/serving/reports", report(generation=1), format="json")
    operator_client.post("/api/models/digits/release/", {"routes": [{"version": 2, "weight": 100}]}, format="json")

    response = worker_client.post("/api/serving/acks", ack(2, ok=False, error="E" * 100_000), format="json")

    assert response.status_code == 204
    assert WorkerAck.objects.get(generation=2).error == "E" * 2000 + "…"


def test_a_minutes_histogram_keeps_at_most_64_bounds_however_many_reports_name_new_ones(worker_client, three_versions):
    """Reports of 31 new bounds each grew one roll-up row without end (every report rewrites it)."""
    for flood in range(5):
        bounds = {f"{flood}.{index:02d}": 1 for index in range(31)}
        flooded = report(versions=[{"model": "digits", "version": 1, "requests": 1, "errors": 0, "latency_sum_s": 0.01,
                                    "latency_buckets": {**bounds, "+Inf": 1}, "batch_size_buckets": {"+Inf": 1}}])
        assert worker_client.post("/api/serving/reports", flooded, format="json").status_code == 204

    minutes = list(ModelVersion.objects.get(number=1).metric_minutes.all())  # one, or two across a minute's turn
    assert max(len(minute.latency_buckets) for minute in minutes) <= 64
    assert sum(minute.latency_buckets["+Inf"] for minute in minutes) == 5  # the total still counts every report


def test_version_metric_history_lists_the_per_minute_rollups(worker_client, operator_client, three_versions):
    clear_of_a_minute_turn()  # both reports in one minute's row
    worker_client.post("/api/serving/reports", report(), format="json")
    worker_client.post("/api/serving/reports", report(), format="json")

    history = operator_client.get("/api/models/digits/versions/1/metrics/").json()

    assert len(history) == 1
    assert (history[0]["requests"], history[0]["latency_buckets"]) == (10, {"0.001": 10, "+Inf": 10})


def test_a_minute_s_totals_stay_at_the_largest_count_the_contract_allows_instead_of_failing_the_report(worker_client, operator_client, three_versions):
    huge = {"model": "digits", "version": 1, "requests": MAX_COUNT, "errors": MAX_COUNT // 2, "client_errors": 0, "latency_sum_s": 1e308,
            "latency_buckets": {"0.001": MAX_COUNT, "+Inf": MAX_COUNT}, "batch_size_buckets": {"1": MAX_COUNT, "+Inf": MAX_COUNT}}

    clear_of_a_minute_turn()  # both reports in one minute's row
    statuses = [worker_client.post("/api/serving/reports", report(versions=[huge]), format="json").status_code for _ in range(2)]

    [minute] = operator_client.get("/api/models/digits/versions/1/metrics/").json()
    assert statuses == [204, 204]
    assert (minute["requests"], minute["errors"], minute["latency_buckets"]) == (MAX_COUNT, MAX_COUNT - 1, {"0.001": MAX_COUNT, "+Inf": MAX_COUNT})
    assert math.isfinite(minute["latency_sum_s"])


def test_an_ack_from_a_worker_that_never_reported_is_refused_and_stored_nowhere(worker_client, three_versions):
    response = worker_client.post("/api/serving/acks", ack(1, ok=False, error="sha256 mismatch"), format="json")

    assert response.status_code == 400
    assert response.json() == {"error": "worker 'w-1' has not reported: a worker reports before it acks"}
    assert (WorkerAck.objects.count(), Worker.objects.count()) == (0, 0)


def test_an_ack_for_a_generation_never_issued_is_refused_and_stored_nowhere(worker_client, three_versions):
    worker_client.post("/api/serving/reports", report(generation=1), format="json")

    response = worker_client.post("/api/serving/acks", {**ack(1), "generation": 10**12}, format="json")

    assert response.status_code == 400
    assert response.json() == {"error": f"generation {10**12} was never issued by this console"}
    assert WorkerAck.objects.count() == 0
    assert Worker.objects.get().generation == 1


def test_an_ack_naming_another_digest_is_refused_and_stored_nowhere(worker_client, three_versions):
    worker_client.post("/api/serving/reports", report(generation=1), format="json")

    response = worker_client.post("/api/serving/acks", {**ack(1), "digest": "ab" * 32}, format="json")

    assert response.status_code == 400
    assert response.json() == {"error": "digest abababababab… is not the state this console issued as generation 1"}
    assert WorkerAck.objects.count() == 0


@pytest.mark.parametrize(
    ("change", "field"),
    [({"digest": None}, "digest"), ({"digest": "AB" * 32}, "digest"), ({"digest": "ab" * 32 + "\n"}, "digest"),
     ({"generation": -1}, "generation"), ({"ok": "maybe"}, "ok"), ({"worker": "w" * 101}, "worker"),
     ({"epoch": "e" * 33}, "epoch"), ({"epoch": 5}, "epoch"), ({"load_ms": -1.0}, "load_ms")],
)
def test_a_malformed_ack_is_refused_naming_the_field_and_stored_nowhere(worker_client, three_versions, change, field):
    worker_client.post("/api/serving/reports", report(generation=1), format="json")

    response = worker_client.post("/api/serving/acks", {**ack(1), **change}, format="json")

    assert response.status_code == 400
    assert response.json()["error"].startswith(f"{field}:")
    assert WorkerAck.objects.count() == 0


@pytest.mark.parametrize(("change", "field"), [({"digest": "xyz"}, "digest"), ({"epoch": "e" * 33}, "epoch")])
def test_a_report_with_a_malformed_digest_or_epoch_is_refused(worker_client, change, field):
    response = worker_client.post("/api/serving/reports", report(**change), format="json")

    assert response.status_code == 400
    assert response.json()["error"].startswith(f"{field}:")
    assert Worker.objects.count() == 0


def test_a_worker_serving_another_epoch_counts_as_serving_nothing_of_ours(worker_client, viewer_client, three_versions):
    worker_client.post("/api/serving/reports", report(generation=50, epoch="another-database", digest="ab" * 32), format="json")

    assert [row["generation"] for row in viewer_client.get("/api/workers/").json()] == [0]


# ---- the worker token's reach ---------------------------------------------------------


def _api_routes():
    """(route, view class) for every API endpoint in the URLconf, so new ones are covered."""
    from django.urls import URLResolver, get_resolver

    def walk(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern), getattr(pattern.callback, "cls", None)

    return [(route, view) for route, view in walk(get_resolver().url_patterns) if route.startswith("api/")]


def _is_worker_endpoint(view) -> bool:
    """Views that opt in to the worker token; everything else must not know it."""
    return any(auth is WorkerTokenAuthentication for auth in getattr(view, "authentication_classes", []))


MANAGEMENT_ROUTES = [route for route, view in _api_routes() if not _is_worker_endpoint(view)]


def _fill(route: str) -> str:
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda match: {"name": "digits"}.get(match.group(1), "1"), route)


def _snapshot() -> tuple:
    return tuple(model.objects.count() for model in (RegisteredModel, ModelVersion, Release, Drill, AuditEvent, Worker, WorkerAck, User))


@pytest.mark.parametrize("route", MANAGEMENT_ROUTES)
@pytest.mark.parametrize("method", ["get", "post", "put", "patch", "delete"])
def test_the_worker_token_gets_nothing_an_anonymous_client_would_not_on_management_endpoints(worker_client, stranger_client, route, method):
    RegisteredModel.objects.create(name="digits")  # authentication comes first: the model need not have versions
    before = _snapshot()
    body = {"name": "planted", "routes": [{"version": 2, "weight": 100}], "generation": 1, "reason": "x"}

    as_worker = getattr(worker_client, method)(_fill(route), body, format="json")
    as_anonymous = getattr(stranger_client, method)(_fill(route), body, format="json")

    assert as_worker.status_code == as_anonymous.status_code
    assert as_worker.status_code in (401, 403) or (method == "get" and as_worker.status_code == 200)
    assert _snapshot() == before


def test_the_management_endpoints_are_all_covered():
    assert {"api/models/", "api/models/<slug:name>/release/rollback/", "api/models/<slug:name>/drills/", "api/workers/"} <= set(MANAGEMENT_ROUTES)
    assert "api/serving/acks" not in MANAGEMENT_ROUTES


def test_a_worker_identity_is_refused_by_the_management_permission_even_if_authenticated(rf):
    from registry.api.permissions import IsOperatorOrReadOnly, WorkerUser

    for method in ("get", "post"):
        request = getattr(rf, method)("/api/models/")
        request.user = WorkerUser()
        assert IsOperatorOrReadOnly().has_permission(request, None) is False


@pytest.mark.parametrize("persona", ["operator_client", "viewer_client"])
def test_people_cannot_send_acks_or_reports_and_nothing_is_stored(request, persona, three_versions):
    client = request.getfixturevalue(persona)

    assert client.post("/api/serving/reports", report(), format="json").status_code == 401
    assert client.post("/api/serving/acks", ack(1), format="json").status_code == 401
    assert (Worker.objects.count(), WorkerAck.objects.count()) == (0, 0)


def test_only_staff_people_read_the_serving_state(viewer_client, admin_user, three_versions):
    from tests.fixtures.personas import _client_for

    assert viewer_client.get("/api/serving/state").status_code == 403
    assert _client_for(admin_user).get("/api/serving/state").status_code == 200


def test_the_worker_token_reads_state_and_artifacts_and_sends_acks_and_reports(worker_client, three_versions):
    assert worker_client.get("/api/serving/state").status_code == 200
    assert worker_client.get("/api/models/digits/versions/1/artifact").status_code == 200
    assert worker_client.post("/api/serving/reports", report(), format="json").status_code == 204
    assert worker_client.post("/api/serving/acks", ack(1), format="json").status_code == 204


# ---- drills: acks and reports only, never a worker-reported URL ------------------------


@pytest.fixture
def reported_host():
    from tests.fixtures.recording_host import RecordingHost

    host = RecordingHost()
    yield host
    host.close()


@pytest.fixture
def canary(operator_client, three_versions):
    operator_client.post("/api/models/digits/release/", {"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}, format="json")
    return three_versions


def reported_at(url: str, generation: int, **extra) -> dict:
    body = report(generation=generation, digest=issued_digest(generation), requests_failed_total=0, **extra)
    return {**body, "worker": {**body["worker"], "url": url}}


def test_a_drill_sends_nothing_to_worker_reported_urls_and_fails_without_acks(worker_client, operator_client, canary, reported_host, settings):
    settings.DRILL_ACK_TIMEOUT_S = 0.3
    worker_client.post("/api/serving/reports", reported_at(reported_host.url, 2), format="json")

    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()

    assert (drill["status"], drill["error"]) == ("failed", "1 of 1 workers never confirmed serving generation 3: w-1 (no ack before the timeout)")
    assert reported_host.received == []


def test_a_worker_that_stops_reporting_during_a_drill_is_named_so_and_its_roll_forward_is_not_waited_for(worker_client, operator_client,
                                                                                                         canary, settings):
    # Killed just after the click, it read "no ack before the timeout", like a slow worker,
    # and the drill's answer waited a second DRILL_ACK_TIMEOUT_S for its roll forward's ack.
    import time

    settings.DRILL_ACK_TIMEOUT_S, settings.WORKER_GONE_AFTER_S = 2, 1
    worker_client.post("/api/serving/reports", reported_at("", 2), format="json")
    started = time.monotonic()

    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()

    assert time.monotonic() - started < 2 * settings.DRILL_ACK_TIMEOUT_S - 0.5  # the measure, not the roll forward too
    assert drill["status"] == "failed"
    assert re.fullmatch(r"no ack before the timeout: it stopped reporting \(its last report came 0\.\d s before the click\)",
                        drill["workers"][0]["error"]), drill["workers"][0]["error"]
    assert drill["forward_generation"] == 4


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_just_after_its_ack_is_named_as_stopped_and_not_waited_for_by_the_roll_forward(worker_client, operator_client,
                                                                                                        canary, settings):
    # Acks come 30-50 ms after the click, so a kill "just after the click" lands here: the
    # answer took 20 s and the row read like a slow worker's (an operator's second run).
    import time

    settings.DRILL_ACK_TIMEOUT_S, settings.WORKER_GONE_AFTER_S = 2, 1
    worker_client.post("/api/serving/reports", reported_at("", 2), format="json")

    def ack_then_die():
        wait_for_generation(3)
        worker_client.post("/api/serving/acks", ack(3, load_ms=1.0), format="json")  # and never reports again

    worker = in_thread(ack_then_die)
    started = time.monotonic()
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(timeout=10)

    assert time.monotonic() - started < 2 * settings.DRILL_ACK_TIMEOUT_S - 0.5  # the measure, not the roll forward too
    assert re.fullmatch(r"acked, but no report showed it serving generation 3 \(or a later state that kept the rollback\) before the "
                        r"timeout: it stopped reporting \(its last report came 0\.\d s (before|after) the click\)", drill["workers"][0]["error"])
    assert drill["error"].endswith("rolled forward to generation 4, but 1 of 1 workers did not follow it within 2 s: "
                                   "w-1 (it had stopped reporting: not waited for)"), drill["error"]


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_too_late_in_the_measure_to_be_gone_is_named_as_quiet_not_slow(worker_client, operator_client, canary, settings):
    # Killed later than DRILL_ACK_TIMEOUT_S - WORKER_GONE_AFTER_S after the click, it was
    # not yet gone when the measure ended and its row read "no ack before the timeout" alone.
    import time

    settings.DRILL_ACK_TIMEOUT_S, settings.WORKER_GONE_AFTER_S = 2.5, 2
    worker_client.post("/api/serving/reports", reported_at("", 2), format="json")
    last_report = {}

    def report_then_die():
        wait_for_generation(3)
        until = time.monotonic() + 1.0
        while time.monotonic() < until:  # reports the old state for a second after the click, never acking: quiet at the end, not gone
            last_report["sent"] = timezone.now()
            worker_client.post("/api/serving/reports", reported_at("", 2), format="json")
            last_report["answered"] = timezone.now()
            time.sleep(0.2)

    worker = in_thread(report_then_die)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(timeout=10)

    error = drill["workers"][0]["error"]
    said = re.fullmatch(r"no ack before the timeout: it has not reported for (\d+\.\d) s \(its last report came (\d+\.\d) s after the click\)", error)
    assert said, error
    # Quiet (the wording says not gone) at the measure's end; its last report when the worker thread
    # sent it, as a loaded box paced it: four reports 0.2 s apart came up to 1.4 s after the click
    # under 0.3 s stalls, and "0\.\d s after the click" failed.
    assert float(said[1]) >= settings.WORKER_GONE_AFTER_S / 2 - 0.05, error
    click = Drill.objects.get(pk=drill["id"]).started_at
    assert (last_report["sent"] - click).total_seconds() - 0.05 <= float(said[2]) <= (last_report["answered"] - click).total_seconds() + 0.05, (
        error, last_report, click)


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_dies_while_the_roll_forward_waits_for_it_is_named_so_and_no_longer_waited_for(worker_client, operator_client,
                                                                                                       canary, settings):
    # Killed just after it confirmed the rollback (an operator's fault run), it held the
    # drill's answer the whole DRILL_ACK_TIMEOUT_S and read "no ack".
    import time

    settings.DRILL_ACK_TIMEOUT_S, settings.WORKER_GONE_AFTER_S = 4, 1.5
    worker_client.post("/api/serving/reports", reported_at("", 2), format="json")

    def follow_the_rollback_then_die():
        deadline = time.monotonic() + 8
        wait_for_generation(3)
        worker_client.post("/api/serving/acks", ack(3, load_ms=1.0), format="json")
        while not Release.objects.filter(generation=4).exists() and time.monotonic() < deadline:
            worker_client.post("/api/serving/reports", reported_at("", 3), format="json")
            time.sleep(0.1)

    worker = in_thread(follow_the_rollback_then_die)
    started = time.monotonic()
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(timeout=10)

    assert time.monotonic() - started < settings.DRILL_ACK_TIMEOUT_S - 0.5
    assert drill["workers"][0]["error"] == ""
    assert drill["error"].endswith("rolled forward to generation 4, but 1 of 1 workers did not follow it within 4 s: "
                                   "w-1 (it stopped reporting during the roll forward: no longer waited for)"), drill["error"]


@pytest.mark.django_db(transaction=True)
def test_a_workers_failed_requests_are_counted_to_the_end_of_the_measure_not_to_its_confirmation(worker_client, operator_client,
                                                                                                  canary, settings):
    # Its row read 0 from the report that confirmed it, while its next report, inside the
    # measure, counted 29 refused clients (an operator's fault run, a frozen worker).
    import time

    settings.DRILL_ACK_TIMEOUT_S = 1.5
    worker_client.post("/api/serving/reports", reported_at("", 2), format="json")
    slow = reported_at("", 2)
    worker_client.post("/api/serving/reports", {**slow, "worker": {**slow["worker"], "id": "w-slow"}}, format="json")

    def confirm_then_fail():
        wait_for_generation(3)
        worker_client.post("/api/serving/acks", ack(3, load_ms=1.0), format="json")
        worker_client.post("/api/serving/reports", reported_at("", 3), format="json")
        time.sleep(0.5)
        failing = worker_client.post("/api/serving/reports", {**reported_at("", 3), "requests_failed_total": 29}, format="json")
        assert failing.status_code == 204, failing.content

    worker = in_thread(confirm_then_fail)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(timeout=10)

    rows = {row["worker"]: row for row in drill["workers"]}
    assert rows["w-1"]["confirmed_s"] is not None
    assert rows["w-1"]["failed_requests"] == 29


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_died_after_confirming_and_before_the_roll_forward_is_said_to_have_died_before_it(worker_client, operator_client,
                                                                                                         canary, settings):
    # Killed 7 s in, 3 s before the roll forward, it was said to have stopped "during" it.

    settings.DRILL_ACK_TIMEOUT_S, settings.WORKER_GONE_AFTER_S = 2.5, 3
    worker_client.post("/api/serving/reports", reported_at("", 2), format="json")
    silent = reported_at("", 2)
    worker_client.post("/api/serving/reports", {**silent, "worker": {**silent["worker"], "id": "w-silent"}}, format="json")

    def confirm_then_die():
        wait_for_generation(3)
        worker_client.post("/api/serving/acks", ack(3, load_ms=1.0), format="json")
        worker_client.post("/api/serving/reports", reported_at("", 3), format="json")  # and never again

    worker = in_thread(confirm_then_die)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(timeout=10)

    assert {row["worker"]: row["error"] for row in drill["workers"]}["w-1"] == ""
    assert re.search(r"w-1 \(its reports stopped 0\.\d s after the click, before the roll forward: no longer waited for\)",
                     drill["error"]), drill["error"]


def test_a_worker_that_keeps_reporting_without_acking_is_not_called_quiet(worker_client, operator_client, canary, settings):
    settings.DRILL_ACK_TIMEOUT_S, settings.WORKER_GONE_AFTER_S = 0.4, 2

    worker_client.post("/api/serving/reports", reported_at("", 2), format="json")
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()

    assert drill["workers"][0]["error"] == "no ack before the timeout"


def test_garbage_acks_are_refused_and_the_drill_still_finishes(worker_client, operator_client, canary, settings):
    settings.DRILL_ACK_TIMEOUT_S = 0.3
    worker_client.post("/api/serving/reports", reported_at("", 2), format="json")
    garbage = [{"worker": "w-1"}, {**ack(3), "generation": 3}, {**ack(2), "generation": 3, "digest": "f" * 64}, [1, 2], "ack"]

    statuses = [worker_client.post("/api/serving/acks", body, format="json").status_code for body in garbage]
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()

    assert statuses == [400] * len(garbage)
    assert WorkerAck.objects.count() == 0
    assert drill["status"] == "failed"
    assert drill["error"] == "1 of 1 workers never confirmed serving generation 3: w-1 (no ack before the timeout)"
    assert Drill.objects.get().finished_at is not None


def test_a_drill_whose_measurement_breaks_is_finished_as_failed_with_the_reason(worker_client, operator_client, canary, monkeypatch, settings):
    from registry.actions import drills

    settings.DRILL_ACK_TIMEOUT_S = 0.3  # its roll forward waits this long for an ack no one sends
    worker_client.post("/api/serving/reports", reported_at("", 2), format="json")

    def broken(*args, **kwargs):
        raise ValueError("a report no one expected")

    monkeypatch.setattr(drills, "watch_workers", broken)

    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()

    assert (drill["status"], drill["error"]) == ("failed", "the drill could not be measured: a report no one expected")
    assert Drill.objects.get().finished_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_drill_passes_on_acks_and_reports_of_the_rolled_back_state_alone(worker_client, operator_client, canary, reported_host, settings):
    import time

    settings.DRILL_ACK_TIMEOUT_S = 10
    worker_client.post("/api/serving/reports", reported_at(reported_host.url, 2), format="json")

    def follow_the_rollback():
        """What a worker does: ack the state it applied, then report serving it."""
        deadline = time.monotonic() + 10
        wait_for_generation(3)
        worker_client.post("/api/serving/acks", ack(3, load_ms=1.0), format="json")
        worker_client.post("/api/serving/reports", reported_at(reported_host.url, 3), format="json")
        while not Release.objects.filter(generation=4).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        worker_client.post("/api/serving/acks", ack(4, load_ms=1.0), format="json")  # the roll forward, followed

    worker = in_thread(follow_the_rollback)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(timeout=15)

    assert drill["status"] == "passed", drill
    assert [(row["worker"], row["ok"], row["error"], row["failed_requests"]) for row in drill["workers"]] == [("w-1", True, "", 0)]
    assert drill["confirmed_s"] >= drill["last_ack_s"] > 0
    assert drill["error"] == "", drill  # the roll forward was followed too: nothing to say
    assert reported_host.received == []


def test_an_ack_of_another_database_s_epoch_is_refused_and_stored_nowhere(worker_client, three_versions):
    worker_client.post("/api/serving/reports", report(generation=1), format="json")

    response = worker_client.post("/api/serving/acks", {**ack(1), "epoch": "another-epoch"}, format="json")

    assert response.status_code == 400
    assert response.json()["error"].startswith("epoch 'another-epoch' is not this console's")
    assert WorkerAck.objects.count() == 0


def test_a_report_of_another_epoch_is_not_counted_as_converged_even_with_a_matching_digest(worker_client, operator_client, three_versions):
    worker_client.post("/api/serving/reports", report(generation=1, digest=issued_digest(1), epoch="another-epoch"), format="json")

    worker = operator_client.get("/api/workers/").json()[0]

    assert worker["converged"] is False


def test_a_report_of_another_epoch_is_not_counted_converged_for_a_model_even_with_its_digest(worker_client, operator_client, three_versions):
    digits = model_digests(issued_state(1))["digits"]
    worker_client.post("/api/serving/reports", report(generation=1, digest=None, epoch="another-epoch", models={"digits": digits}), format="json")

    assert operator_client.get("/api/models/digits/release/").json()["workers"][0]["converged"] is False
