"""POST page twins: act through the registry, say what happened, and refuse readers."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.contrib.messages import get_messages

from console import views
from registry.actions import releases
from registry.building.onnx_build import random_mlp, to_bytes
from registry.models import AuditEvent, Drill, DrillStatus, Job, ModelVersion, Release
from tests.fixtures.jobs import run_queued_jobs
from tests.fixtures.store import stored_files

CHANGES = [
    ("/models/digits/split/", {"canary_version": "2", "preset": "50", "expected_generation": "2"}),
    ("/models/digits/promote/", {"expected_generation": "2"}),
    ("/models/digits/rollback/", {"expected_generation": "2"}),
    ("/models/digits/drill/", {"expected_generation": "2"}),
    ("/models/digits/releases/1/restore/", {"expected_generation": "2"}),
]


def staged_files(root) -> list:
    """Uploads still waiting in the store's staging folder (should be none after a request)."""
    return [path for path in stored_files(root) if path.relative_to(root).parts[0] == "tmp"]


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def snapshot() -> tuple:
    return (list(Release.objects.values_list("generation", "routes")), ModelVersion.objects.count(), AuditEvent.objects.count(), Drill.objects.count())


@pytest.mark.parametrize(("path", "body"), CHANGES)
def test_viewer_post_is_refused_and_nothing_changes(viewer_page, canary_digits, path, body):
    before = snapshot()

    response = viewer_page.post(path, body)

    assert response.status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize("path", ["/models/digits/promote/", "/models/digits/rollback/", "/models/digits/drill/", "/models/digits/releases/1/restore/"])
def test_viewer_cannot_open_confirmations(viewer_page, canary_digits, path):
    assert viewer_page.get(path).status_code == 403


def test_viewer_upload_is_refused_and_leaves_no_file(viewer_page, digits, artifact_root):
    before = snapshot()
    upload = io.BytesIO(to_bytes(random_mlp([4, 3], seed=9)))
    upload.name = "forged.onnx"

    response = viewer_page.post("/models/digits/upload/", {"artifact": upload})

    assert response.status_code == 403
    assert snapshot() == before
    assert staged_files(artifact_root) == []


def test_stranger_post_goes_to_sign_in_and_nothing_changes(client, canary_digits):
    before = snapshot()

    response = client.post("/models/digits/rollback/")

    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert snapshot() == before


@pytest.mark.parametrize(("body", "routes"), [
    ({"canary_version": "2", "preset": "10", "weight": "33"}, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]),
    ({"canary_version": "2", "weight": "33"}, [{"version": 1, "weight": 67}, {"version": 2, "weight": 33}]),
    ({"canary_version": "2", "confirmed_weight": "100"}, [{"version": 2, "weight": 100}]),
])
def test_operator_sets_the_canary_share(operator_page, digits, body, routes):
    response = operator_page.post("/models/digits/split/", {**body, "expected_generation": "1"})

    assert response.status_code == 302 and response["Location"] == "/models/digits/"
    assert digits.current_release().routes == routes
    assert messages_of(response)[0].startswith("Generation 2: traffic is now")


def test_a_split_the_model_already_serves_is_refused_and_makes_no_generation(operator_page, digits):
    response = operator_page.post("/models/digits/split/", {"canary_version": "2", "weight": "0", "expected_generation": "1"},
                                  HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    assert response.json()["message"] == "digits already serves v1 100% (generation 1): nothing to change"
    assert digits.current_release().generation == 1


def test_split_without_a_share_is_refused_with_a_reason(operator_page, digits):
    response = operator_page.post("/models/digits/split/", {"canary_version": "2", "expected_generation": "1"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 400
    assert response.json() == {"level": "error", "message": "choose a preset or type the canary's share (0-100%)"}
    assert digits.current_release().generation == 1


def test_split_answers_a_fetch_with_json(operator_page, digits):
    response = operator_page.post("/models/digits/split/", {"canary_version": "2", "preset": "1", "expected_generation": "1"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 200
    assert response.json() == {"level": "success", "message": "Generation 2: traffic is now v1 99%, v2 1%. Workers are converging.", "generation": 2}


def test_rollback_returns_to_the_previous_split_and_is_audited(operator_page, canary_digits):
    response = operator_page.post("/models/digits/rollback/", {"reason": "p99 regressed", "expected_generation": "2"})

    release = canary_digits.current_release()
    assert release.routes == [{"version": 1, "weight": 100}]
    assert release.action == "rollback" and release.reason == "p99 regressed"
    assert messages_of(response) == ["Generation 3: traffic is now v1 100%. Workers are converging."]
    assert AuditEvent.objects.filter(kind="release", data__generation=3).exists()


def test_rollback_of_a_first_release_says_why(operator_page, digits):
    response = operator_page.post("/models/digits/rollback/", {"expected_generation": "1"})

    assert messages_of(response) == ["nothing to roll back to: generation 1 is the first release of digits"]
    assert digits.current_release().generation == 1


def test_restore_brings_back_an_earlier_split_from_its_release_page_and_is_audited(operator_page, canary_digits):
    response = operator_page.post("/models/digits/releases/1/restore/", {"reason": "back to v1 alone", "expected_generation": "2"})

    release = canary_digits.current_release()
    assert (release.generation, release.action, release.routes, release.reason) == (3, "restore", [{"version": 1, "weight": 100}], "back to v1 alone")
    assert release.rollback_target.generation == 2  # a rollback from here returns to the canary
    assert messages_of(response) == ["Generation 3: traffic is now v1 100%. Workers are converging."]
    assert AuditEvent.objects.filter(kind="release", data__generation=3).exists()


def test_an_earlier_release_page_offers_its_split_back_to_operators_only(operator_page, viewer_page, canary_digits):
    assert 'id="restore-button"' in operator_page.get("/models/digits/releases/1/").content.decode()
    assert 'id="restore-button"' not in viewer_page.get("/models/digits/releases/1/").content.decode()
    assert 'id="restore-button"' not in operator_page.get("/models/digits/releases/2/").content.decode()  # the one served


def test_a_release_page_whose_split_is_served_again_says_so_instead_of_offering_it(operator_page, canary_digits):
    operator_page.post("/models/digits/rollback/", {"expected_generation": "2"})  # generation 3: v1 100%, as generation 1

    html = operator_page.get("/models/digits/releases/1/").content.decode()

    assert 'id="restore-button"' not in html
    assert "No restore from here: digits already serves this split (v1 100%, generation 3)." in html


def test_a_release_page_whose_versions_are_gone_says_so_instead_of_offering_it(operator_page, canary_digits):
    ModelVersion.objects.filter(model=canary_digits, number=2).update(status="archived")
    operator_page.post("/models/digits/rollback/", {"expected_generation": "2"})

    html = operator_page.get("/models/digits/releases/2/").content.decode()

    assert 'id="restore-button"' not in html
    assert "No restore from here: v2 of digits is no longer ready (archived or rejected)." in html


def test_a_restore_the_console_would_not_offer_is_refused_naming_why(operator_page, canary_digits):
    before = snapshot()

    response = operator_page.post("/models/digits/releases/99/restore/", {"expected_generation": "2"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 400
    assert response.json()["message"] == "model digits has no release with generation 99"
    assert snapshot() == before


def test_promote_makes_the_canary_stable(operator_page, canary_digits):
    operator_page.post("/models/digits/promote/", {"expected_generation": "2"})

    release = canary_digits.current_release()
    assert (release.action, release.stable_version, release.routes) == ("promote", 2, [{"version": 2, "weight": 100}])


def worker_failing_to_load_v2():
    from django.utils import timezone

    from registry.models import Worker

    Worker.objects.create(worker_id="w-1", last_seen_at=timezone.now(), ok=False, error="digits v2: artifact sha256 mismatch",
                          loaded=[{"model": "digits", "version": 1, "routed": True, "ready": True}])


def test_the_promote_dialog_of_a_canary_no_worker_loaded_says_so_and_offers_force(operator_page, canary_digits):
    worker_failing_to_load_v2()

    html = operator_page.get("/models/digits/promote/").content.decode()

    assert "no worker serves v2: 1 of 1 live worker failed to load it (digits v2: artifact sha256 mismatch): promoted, the workers" in html
    assert 'name="force"' in html


def test_a_promote_of_a_canary_no_worker_loaded_is_refused_naming_the_page_s_force_then_made_when_forced(operator_page, canary_digits):
    worker_failing_to_load_v2()

    refused = operator_page.post("/models/digits/promote/", {"expected_generation": "2"}, HTTP_ACCEPT="application/json")
    forced = operator_page.post("/models/digits/promote/", {"expected_generation": "2", "force": "on", "reason": "file restored"},
                                HTTP_ACCEPT="application/json")

    assert refused.status_code == 409
    assert refused.json()["message"] == ("v2 not promoted: no worker serves v2: 1 of 1 live worker failed to load it (digits v2: artifact "
                                         "sha256 mismatch); the workers would go on serving what they serve now. Mend or replace the "
                                         "version, or tick Force and say why in the reason to do it anyway")
    assert forced.status_code == 200, forced.content
    assert canary_digits.current_release().routes == [{"version": 2, "weight": 100}]


def test_the_split_form_names_a_canary_no_worker_loaded_and_offers_force(operator_page, canary_digits):
    worker_failing_to_load_v2()

    html = operator_page.get("/models/digits/").content.decode()

    assert ('<p data-force-for="2">no worker serves v2: 1 of 1 live worker failed to load it (digits v2: artifact sha256 mismatch): '
            "routed, the workers would go on serving what they serve now.</p>") in html
    assert 'id="id_split_force"' in html


def test_the_restore_of_a_split_no_worker_could_load_offers_force_and_is_made_only_when_forced(operator_page, canary_digits, operator):
    releases.rollback(canary_digits, operator)  # generation 3: v1 alone; generation 2 gave v2 10 %
    worker_failing_to_load_v2()

    html = operator_page.get("/models/digits/releases/2/restore/").content.decode()
    refused = operator_page.post("/models/digits/releases/2/restore/", {"expected_generation": "3"}, HTTP_ACCEPT="application/json")
    forced = operator_page.post("/models/digits/releases/2/restore/", {"expected_generation": "3", "force": "on", "reason": "file back"},
                                HTTP_ACCEPT="application/json")

    assert ("v2: no worker serves v2: 1 of 1 live worker failed to load it (digits v2: artifact sha256 mismatch): restored, the workers "
            "would go on serving what they serve now.") in html
    assert 'id="id_restore_force"' in html
    assert refused.status_code == 409
    assert refused.json()["message"].endswith("or tick Force and say why in the reason to do it anyway")
    assert forced.status_code == 200, forced.content
    assert canary_digits.current_release().routes == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]


def test_a_page_reason_holding_control_characters_is_refused_and_nothing_changes(operator_page, canary_digits):
    response = operator_page.post("/models/digits/rollback/", {"expected_generation": "2", "reason": "\x1b[2J"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 400
    assert "must be one line of text without control characters or directional overrides (found U+001B)" in response.json()["message"]
    assert canary_digits.current_release().generation == 2


def test_drill_runs_and_reports_its_result(operator_page, canary_digits):
    response = operator_page.post("/models/digits/drill/", {"expected_generation": "2"}, HTTP_ACCEPT="application/json")

    drill = Drill.objects.get()
    assert response.json()["drill"] == drill.pk
    assert response.json()["level"] == "error"  # no live worker followed it
    assert response.json()["message"] == f"Drill #{drill.pk} failed: no live workers to follow the rollback."
    assert canary_digits.current_release().routes == [{"version": 1, "weight": 100}]


def test_a_passed_drills_notes_come_after_its_figures():
    # "Drill #1 passed: not measured: 1 worker gone before the drill" read as a contradiction.
    from console.views import _drill_words

    drill = Drill(pk=7, status=DrillStatus.PASSED, last_ack_s=0.03, failed_requests=0,
                  error="not measured: 1 worker gone before the drill (last report between 60 s and 1 h before it): w-old")

    assert _drill_words(drill) == ("Drill #7 passed: last ack after 0.030 s, 0 failed requests. Noted: not measured: 1 worker "
                                   "gone before the drill (last report between 60 s and 1 h before it): w-old.")


def test_double_clicked_rollback_rolls_back_once_and_says_why(operator_page, canary_digits):
    """Both posts carry generation 2, the one the page showed when it was clicked twice."""
    first = operator_page.post("/models/digits/rollback/", {"expected_generation": "2"})
    after_first = snapshot()

    second = operator_page.post("/models/digits/rollback/", {"expected_generation": "2"})

    assert messages_of(first) == ["Generation 3: traffic is now v1 100%. Workers are converging."]
    assert second.status_code == 302 and second["Location"] == "/models/digits/"
    message = messages_of(second)[-1]  # the first answer's message was never shown, so it is still queued
    assert message.startswith("generation 3 (rolled back by olivia at ")
    assert message.endswith(" UTC) replaced generation 2 you saw: nothing changed; reload and decide again")
    assert snapshot() == after_first


def test_double_clicked_rollback_answers_a_fetch_with_the_conflict(operator_page, canary_digits):
    operator_page.post("/models/digits/rollback/", {"expected_generation": "2"}, HTTP_ACCEPT="application/json")
    after_first = snapshot()

    response = operator_page.post("/models/digits/rollback/", {"expected_generation": "2"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    assert response.json()["level"] == "error"
    assert response.json()["current_generation"] == 3
    assert response.json()["message"].startswith("generation 3 (rolled back by olivia at ")
    assert snapshot() == after_first


@pytest.mark.parametrize(("path", "body"), CHANGES)
def test_every_traffic_form_refuses_a_stale_generation(operator_page, canary_digits, path, body):
    before = snapshot()

    response = operator_page.post(path, {**body, "expected_generation": "1"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    assert "replaced generation 1 you saw" in response.json()["message"]
    assert snapshot() == before


@pytest.mark.parametrize(("path", "body"), CHANGES)
def test_a_traffic_form_without_the_generation_changes_nothing(operator_page, canary_digits, path, body):
    before = snapshot()
    body = {key: value for key, value in body.items() if key != "expected_generation"}

    response = operator_page.post(path, body, HTTP_ACCEPT="application/json")

    assert response.status_code == 400
    assert "Generation you saw: missing from the form: reload the page and try again" in response.json()["message"]
    assert snapshot() == before


@pytest.mark.parametrize("path", ["/models/digits/", "/models/digits/rollback/", "/models/digits/promote/", "/models/digits/drill/",
                                  "/models/digits/releases/1/", "/models/digits/releases/1/restore/"])
def test_pages_render_the_generation_into_every_traffic_form(operator_page, canary_digits, path):
    html = operator_page.get(path).content.decode()

    assert '<input type="hidden" name="expected_generation" value="2">' in html


def test_operator_upload_registers_a_version_that_is_validated_after_the_answer(operator_page, digits, artifact_root):
    upload = io.BytesIO(to_bytes(random_mlp([4, 3], seed=11)))
    upload.name = "v3.onnx"

    response = operator_page.post("/models/digits/upload/", {"artifact": upload, "description": "bigger"})

    job = Job.objects.get(version__number=3)
    assert response.status_code == 302 and response["Location"] == "/models/digits/"
    assert messages_of(response) == [f"Version 3 uploaded; it is being validated (job #{job.pk}): the versions table shows whether it is ready or rejected."]
    assert (digits.versions.get(number=3).status, digits.versions.get(number=3).description) == ("validating", "bigger")
    assert staged_files(artifact_root) == []
    run_queued_jobs("validation")
    assert digits.versions.get(number=3).status == "ready"


def test_a_script_upload_through_the_page_twin_is_answered_202_with_its_job(operator_page, digits):
    upload = io.BytesIO(to_bytes(random_mlp([4, 3], seed=11)))
    upload.name = "v3.onnx"

    response = operator_page.post("/models/digits/upload/", {"artifact": upload}, HTTP_ACCEPT="application/json")

    assert response.status_code == 202
    body = response.json()
    assert (body["level"], body["version"], body["job"]) == ("success", 3, Job.objects.get(version__number=3).pk)


def test_refused_upload_says_why_and_leaves_nothing(operator_page, digits, artifact_root):
    before = stored_files(artifact_root)  # the stand-ins of the two versions' files
    upload = io.BytesIO(b"this is not an onnx model")
    upload.name = "broken.onnx"

    response = operator_page.post("/models/digits/upload/", {"artifact": upload}, HTTP_ACCEPT="application/json")

    assert response.status_code == 400
    assert response.json()["message"].startswith("Upload refused: ")
    assert AuditEvent.objects.filter(kind="upload_refused").count() == 1
    assert digits.versions.count() == 2
    assert Job.objects.count() == 0
    assert stored_files(artifact_root) == before


class FakeResponse:
    def __init__(self, status_code: int, body: dict):
        self.status_code, self._body = status_code, body

    def iter_bytes(self):
        yield json.dumps(self._body).encode()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_try_it_forwards_to_a_worker_and_shows_the_answer(viewer_page, digits, monkeypatch):
    sent = {}

    def fake_stream(method, url, json, timeout):
        sent.update(method=method, url=url, body=json)
        return FakeResponse(200, {"request_id": "r1", "model_version": 1, "outputs": {"probabilities": [0.1, 0.2, 0.7]}, "latency_ms": 1.25})

    monkeypatch.setattr(httpx, "stream", fake_stream)

    response = viewer_page.post("/models/digits/versions/1/try/", {"inputs": "[1, 2, 3, 4]"}, HTTP_ACCEPT="application/json")

    assert sent == {"method": "POST", "url": "http://127.0.0.1:8001/predict", "body": {"model_name": "digits", "version": 1, "inputs": [1, 2, 3, 4]}}
    assert response.json()["ok"] is True
    assert "Answered by v1 in 1.25 ms at the worker" in response.json()["html"]


def test_try_it_names_an_unreachable_worker(viewer_page, digits, monkeypatch):
    def refuse(method, url, json, timeout):
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(httpx, "stream", refuse)

    html = viewer_page.post("/models/digits/versions/1/try/", {"inputs": "[1, 2, 3, 4]"}).content.decode()

    assert "no answer from the worker at http://127.0.0.1:8001: connection refused" in html


@pytest.fixture
def worker_answering(settings):
    """worker_answering(body, drip_s=None) -> a real HTTP server, the console's
    SERVING_PUBLIC_URL, that answers every POST with ``body``: at once, or a byte every
    ``drip_s`` until the test ends."""
    servers, stop = [], threading.Event()

    def start(body: bytes, drip_s: float | None = None):
        class Answer(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if drip_s is None:
                        self.wfile.write(body)
                        return
                    for index in range(len(body)):
                        if stop.wait(drip_s):
                            return
                        self.wfile.write(body[index:index + 1])
                        self.wfile.flush()
                except OSError:  # the console stopped reading
                    pass

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        settings.SERVING_PUBLIC_URL = f"http://127.0.0.1:{server.server_port}"
        return server

    yield start
    stop.set()
    for server in servers:
        server.shutdown()
        server.server_close()


def test_try_it_refuses_an_answer_larger_than_the_form_shows_without_passing_it_on(viewer_page, digits, worker_answering):
    """An attacker (7 Dec), signed in as a viewer, sent 27 KB of inputs to a model whose
    output grows with the square of an input's width: the console read the worker's 200 MB
    answer whole, parsed it, and sent it back pretty-printed (444 MB), from 815 MB to a
    peak of 2.7 GB, 1.5 GB kept after."""
    answer = b'{"request_id": "r1", "model_version": 1, "outputs": {"y": [' + b"0.5, " * 400_000 + b'0.5]}, "latency_ms": 1.0}'
    worker_answering(answer)

    response = viewer_page.post("/models/digits/versions/1/try/", {"inputs": "[1, 2, 3, 4]"}, HTTP_ACCEPT="application/json")

    assert response.json()["ok"] is False
    assert response.json()["error"] == ("the worker's answer is larger than this form shows (1,048,576 bytes): "
                                        "ask the worker's /predict or /v2 API for it")
    assert len(response.content) < 10_000


def test_try_it_stops_reading_an_answer_that_drips_past_its_wait(viewer_page, digits, worker_answering, monkeypatch):
    """httpx's timeout bounds each read: a worker sending a byte every 0.3 s held the
    console's thread for as long as it went on."""
    monkeypatch.setattr(views, "TRY_TIMEOUT_S", 1.0)
    worker_answering(b'{"outputs": {}}' + b" " * 12, drip_s=0.3)  # whole after 8 s, each read well within 1 s

    response = viewer_page.post("/models/digits/versions/1/try/", {"inputs": "[1, 2, 3, 4]"}, HTTP_ACCEPT="application/json")

    assert response.json()["error"] == "the worker's answer took longer than this form waits (1 s) to arrive"


def test_try_it_shows_an_answer_within_what_the_form_shows(viewer_page, digits, worker_answering):
    worker_answering(b'{"request_id": "r1", "model_version": 1, "outputs": {"y": [' + b"0.5, " * 100_000 + b'0.5]}, "latency_ms": 1.0}')

    response = viewer_page.post("/models/digits/versions/1/try/", {"inputs": "[1, 2, 3, 4]"}, HTTP_ACCEPT="application/json")

    assert response.json()["ok"] is True
    assert len(response.json()["answer"]["outputs"]["y"]) == 100_001


def test_try_it_refuses_bad_json_before_sending(viewer_page, digits):
    response = viewer_page.post("/models/digits/versions/1/try/", {"inputs": "[1, 2"}, HTTP_ACCEPT="application/json")

    assert response.json()["ok"] is False
    assert response.json()["error"].startswith("Inputs (JSON): not valid JSON")


def test_try_it_refuses_inputs_longer_than_the_form_takes(viewer_page, digits):
    # 2.6 MB of "[]" grew to ~50 MB of Python lists per request, any viewer's to send.
    inputs = "[" + ",".join(["[]"] * (262_144 // 3 + 1)) + "]"

    response = viewer_page.post("/models/digits/versions/1/try/", {"inputs": inputs}, HTTP_ACCEPT="application/json")

    assert response.json()["ok"] is False
    assert response.json()["error"] == (f"Inputs (JSON): {len(inputs):,} characters is more than this form takes (262,144): "
                                        "send larger inputs to the worker's /predict or /v2 API")


def test_try_it_counts_the_whitespace_around_the_inputs_too(viewer_page, digits):
    inputs = "[[0.5, 0.5, 0.5, 0.5]]" + " " * 262_144

    response = viewer_page.post("/models/digits/versions/1/try/", {"inputs": inputs}, HTTP_ACCEPT="application/json")

    assert response.json()["error"].startswith(f"Inputs (JSON): {len(inputs):,} characters is more than this form takes")


def test_try_it_refuses_json_nested_past_the_decoder_s_depth(viewer_page, digits):
    response = viewer_page.post("/models/digits/versions/1/try/", {"inputs": "[" * 5000 + "]" * 5000}, HTTP_ACCEPT="application/json")

    assert response.json()["ok"] is False
    assert response.json()["error"] == "Inputs (JSON): not valid JSON: nested too deeply"


@pytest.mark.parametrize("inputs, named", [
    ("[[NaN, 2, 3, 4]]", "NaN is not a number JSON allows"),
    ("[[Infinity, 2]]", "Infinity is not a number JSON allows"),
    ("[[1e999, 2]]", "1e999 is out of range for a 64-bit float"),
    ("[" + "9" * 5000 + "]", "not valid JSON for the worker: Exceeds the limit"),
    ('["\\ud800"]', "lone surrogate"),
])
def test_try_it_refuses_inputs_the_worker_s_json_cannot_carry(viewer_page, digits, inputs, named):
    response = viewer_page.post("/models/digits/versions/1/try/", {"inputs": inputs}, HTTP_ACCEPT="application/json")

    assert response.status_code == 200 and response.json()["ok"] is False
    assert named in response.json()["error"]


def test_a_change_address_opened_in_the_browser_answers_the_error_page_not_an_empty_405(operator_page, canary_digits):
    # Chromium showed its own error page for the empty 405 of a typed /models/digits/split/.
    response = operator_page.get("/models/digits/split/")

    assert (response.status_code, response["Allow"]) == (405, "POST")
    assert response["Content-Length"] == str(len(response.content))  # a server sends no more than declared
    assert "This address is not a page" in response.content.decode()
    assert "It takes a form's submission (POST), not a visit: nothing was changed." in response.content.decode()


def test_a_change_sent_after_signing_out_elsewhere_is_not_made_and_the_sign_in_page_says_so(operator_page, canary_digits):
    # The next submit landed on a bare sign-in page, with nothing to say the change was lost.
    operator_page.logout()

    response = operator_page.post("/models/digits/rollback/", {"expected_generation": "2"}, follow=True)

    assert response.redirect_chain[-1][0].startswith("/login/?next=/models/digits/rollback/")
    assert ("If this page came up when you sent a change (you were signed out here or in another tab, or your session ended), that "
            "change was not carried out" in response.content.decode())
    assert canary_digits.current_release().generation == 2
