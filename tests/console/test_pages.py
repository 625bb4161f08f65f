"""Every page renders for every role, shows the truth, and offers only what a role may do."""

from __future__ import annotations

import pytest

from registry.actions import releases
from registry.fleet.state import issued_digest, issued_state
from registry.models import Drill, RegisteredModel
from serving.state_signing import model_digests
from tests.console.conftest import add_version, read_silence_as_made, report_from, served

PAGES = ["/", "/models/digits/", "/models/digits/versions/1/", "/workers/", "/drills/"]


@pytest.mark.parametrize("path", PAGES)
def test_pages_send_strangers_to_sign_in(client, digits, path):
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders_for_a_viewer(viewer_page, canary_digits, path):
    response = viewer_page.get(path)

    assert response.status_code == 200
    assert b"victor" in response.content


def test_sign_in_page_signs_in_and_lands_on_models(client, operator, digits):
    page = client.get("/login/")
    response = client.post("/login/", {"username": "olivia", "password": "pw-olivia"})

    assert page.status_code == 200
    assert b'for="id_username"' in page.content and b'for="id_password"' in page.content
    assert response.status_code == 302 and response["Location"] == "/"


def test_models_page_shows_stable_canary_split_and_live_figures(viewer_page, canary_digits):
    report_from("w1", generation=2, versions=[
        {"model": "digits", "version": 1, "requests": 90, "requests_per_s": 90.0, "errors": 0, "p99_ms": 4.0},
        {"model": "digits", "version": 2, "requests": 10, "requests_per_s": 10.0, "errors": 1, "p99_ms": 16.0},
    ])

    html = viewer_page.get("/").content.decode()

    assert 'class="tag tag-stable">v1</a>' in html
    assert 'class="tag tag-canary">v2</a> <span class="muted">10%</span>' in html
    assert "v1 · 90%" in html and "v2 · 10%" in html
    assert '<td class="num" data-field="requests_per_s">100</td>' in html
    assert '<td class="num" data-field="p99_ms">16.0 ms</td>' in html
    assert '<td class="num" data-field="error_rate">1%</td>' in html
    assert '<td class="num" data-field="client_error_rate">0%</td>' in html
    assert "✓ 1/1 converged" in html


def test_the_model_page_names_each_worker_still_converging_and_no_other(viewer_page, canary_digits):
    behind = canary_digits.current_release().generation - 1
    report_from("w1", generation=behind, versions=[])
    report_from("w2", generation=behind + 1, versions=[])

    html = viewer_page.get("/models/digits/").content.decode()

    assert f"Converging: w1 on gen {behind}.</span>" in html


def test_the_model_page_says_a_recently_silent_worker_has_not_confirmed_the_release(viewer_page, canary_digits):
    current = canary_digits.current_release().generation
    report_from("w1", generation=current, versions=[])
    report_from("w2", generation=current - 1, versions=[], seconds_ago=12)

    html = read_silence_as_made(viewer_page.get("/models/digits/").content.decode())

    assert "✓ All" not in html
    assert (f'Not converged: <span data-silent-worker="w2">w2 silent 12 s, it last proved generation {current - 1}: frozen, cut off or dead; '
            f"if it serves, it may serve what generation {current} replaced (taken for dead 60 s after its last report)</span>.</span>") in html


def test_the_health_badge_warns_of_a_recently_silent_worker_that_has_not_confirmed_the_release(viewer_page, canary_digits):
    # Every live worker converged, yet a silent one may still serve what the release replaced:
    # the badge said only "1 worker gone", as if nothing served but the live ones.
    current = canary_digits.current_release().generation
    report_from("w1", generation=current, versions=[])
    report_from("w2", generation=current - 1, versions=[], seconds_ago=12)
    words = (f"1 silent worker not confirmed on generation {current} (w2: silent 12 s, it last proved generation {current - 1}: "
             f"frozen, cut off or dead; if it serves, it may serve what generation {current} replaced (taken for dead 60 s after its "
             "last report))")

    models_html = read_silence_as_made(viewer_page.get("/").content.decode())
    model_html = read_silence_as_made(viewer_page.get("/models/digits/").content.decode())

    assert f'<span class="pill pill-warn" data-field="health">{words}</span>' in models_html
    assert '<span class="pill pill-warn model-health" id="model-health"' in model_html
    assert f">{words}</span>" in model_html


def test_the_model_page_says_a_worker_that_failed_to_apply_the_release_is_not_converging(viewer_page, canary_digits):
    # "Converging: w1 on gen 15 (applied but for digits …)" read as if it would get there
    # by itself; its canary's file was broken and it never would.
    worker = report_from("w1", generation=canary_digits.current_release().generation - 1, versions=[])
    worker.ok, worker.error = False, "applied but for digits (keeps the routes it served before): digits v2: artifact sha256 mismatch"
    worker.save()

    html = viewer_page.get("/models/digits/").content.decode()

    assert ("Not converged: w1 failed to apply it (applied but for digits (keeps the routes it served before): digits v2: artifact "
            "sha256 mismatch).</span>") in html


def test_models_page_says_what_is_wrong(viewer_page, canary_digits):
    report_from("w1", generation=1, versions=[])

    html = viewer_page.get("/").content.decode()

    assert "1 of 1 workers converging to generation 2" in html
    assert "pill-warn" in html


def test_models_page_turns_red_on_errors(viewer_page, canary_digits):
    report_from("w1", generation=2, versions=[{"model": "digits", "version": 2, "requests": 50, "requests_per_s": 50.0, "errors": 5}])
    served(canary_digits, 1, 450)
    served(canary_digits, 2, 50, errors=5)

    html = viewer_page.get("/").content.decode()

    assert '<span class="pill pill-bad" data-field="health">Server errors 10% on v2 (canary)</span>' in html


def test_model_page_lists_versions_with_status_uploader_size_and_metrics(viewer_page, canary_digits):
    html = viewer_page.get("/models/digits/").content.decode()

    assert 'data-version="2" data-status="ready"' in html
    assert "Ready" in html
    assert "1.95 KiB" in html  # v2 is 2000 bytes
    assert "<code title=\"" + f"{2:064x}" + "\">" + f"{2:064x}"[:12] in html
    assert '<span class="metric-key">accuracy</span> 0.92' in html


def test_model_page_offers_operators_every_traffic_control(operator_page, canary_digits):
    html = operator_page.get("/models/digits/").content.decode()

    assert 'action="/models/digits/split/"' in html
    assert "⟲ Roll back to v1 100%" in html
    assert 'href="/models/digits/promote/"' in html
    assert 'href="/models/digits/drill/"' in html
    assert 'id="upload-form"' in html
    for weight in (1, 10, 50, 100):
        assert f'name="preset" value="{weight}"' in html


def test_model_page_offers_viewers_no_controls(viewer_page, canary_digits):
    html = viewer_page.get("/models/digits/").content.decode()

    for control in ("/models/digits/split/", "/models/digits/rollback/", "/models/digits/promote/", "/models/digits/drill/", "upload-form", 'name="preset"'):
        assert control not in html
    assert "operators change traffic" in html


def test_rollback_confirmation_says_what_it_returns_to(operator_page, canary_digits):
    html = operator_page.get("/models/digits/rollback/").content.decode()

    assert "Traffic returns to <strong>v1 100% (generation 1)</strong>." in html
    assert "Now: v1 90%, v2 10% (generation 2)." in html


def test_a_fragment_answers_alone(viewer_page, canary_digits):
    response = viewer_page.get("/models/digits/?fragment=release-panel")

    assert response.status_code == 200
    assert b"<html" not in response.content
    assert b'data-generation="2"' in response.content


def test_version_page_shows_signature_report_metrics_and_download(viewer_page, digits):
    html = viewer_page.get("/models/digits/versions/1/").content.decode()

    assert "<code>input</code></td><td>FP32</td><td><code>[batch, 4]</code>" in html
    assert "<code>probabilities</code></td><td>FP32</td><td><code>[batch, 3]</code>" in html
    assert "<strong>parse</strong> parsed" in html
    assert 'href="/api/models/digits/versions/1/artifact"' in html
    assert "[0, 0, 0, 0]" in html  # the try-it example: one row of zeros


def test_try_it_on_a_version_that_takes_no_traffic_says_it_will_be_refused_and_why(viewer_page, digits):
    """Every try of a ready, unrouted version was a bare 404 ("no loaded version")."""
    unrouted = viewer_page.get("/models/digits/versions/2/").content.decode()
    routed = viewer_page.get("/models/digits/versions/1/").content.decode()

    assert 'id="try-unrouted"' not in routed
    assert 'id="try-unrouted">v2 takes no traffic now' in unrouted
    assert "Route it (a canary at 1%) to try it." in unrouted


def test_workers_page_highlights_a_worker_behind_and_fades_a_gone_one(viewer_page, canary_digits):
    report_from("current", generation=2, versions=[{"model": "digits", "version": 1, "requests_per_s": 12.0}])
    report_from("lagging", generation=1, versions=[])
    report_from("departed", generation=2, versions=[], seconds_ago=120)

    html = viewer_page.get("/workers/").content.decode()

    assert 'data-worker="current" data-generation="2" class="">' in html
    # A converged worker said so only by a green pill: the word and the digest it proves it by.
    assert (f'title="serving the content this console issued for generation 2 (digest {issued_digest(2)[:12]}…): converged">2 · converged'
            in html)
    assert 'data-worker="lagging" data-generation="1" class=" behind">' in html
    assert 'data-worker="departed" data-generation="2" class="gone">' in html
    assert "1 · behind" in html


def test_workers_page_lists_64_loaded_versions_of_a_worker_and_counts_the_rest(viewer_page, canary_digits):
    # A report may list 4,096 loaded versions, each shown as a link: five made-up worker ids,
    # one report each, made the page 1.9 MB and 2.5 s to render for the hour they stay listed.
    worker = report_from("hoarder", generation=2, versions=[])
    worker.loaded = [{"model": "digits", "version": number, "routed": True} for number in range(1, 4097)]
    worker.save()

    html = viewer_page.get("/workers/").content.decode()

    assert html.count('href="/models/digits/versions/') == 64
    assert '>digits v64</a> <span class="hint">and 4032 more</span>' in html
    assert len(html) < 100_000


def test_workers_page_shows_a_worker_that_said_it_stopped_as_stopped_not_gone(viewer_page, canary_digits):
    worker = report_from("retired", generation=2, versions=[])
    worker.last_report = {**worker.last_report, "state": "stopped"}
    worker.save()

    html = viewer_page.get("/workers/").content.decode()

    assert '<tr data-lifecycle="stopped" data-worker="retired" data-generation="2" class="stopped">' in html
    assert 'retired <span class="hint">stopped</span>' in html


def test_workers_page_never_calls_a_stopped_or_gone_worker_behind(viewer_page, canary_digits):
    stopped = report_from("retired", generation=1, versions=[])
    stopped.last_report = {**stopped.last_report, "state": "stopped"}
    stopped.save()
    report_from("departed", generation=1, versions=[], seconds_ago=120)

    html = viewer_page.get("/workers/").content.decode()

    assert 'data-worker="retired" data-generation="1" class="stopped">' in html
    assert 'data-worker="departed" data-generation="1" class="gone">' in html
    assert "· behind</span>" not in html  # a gone one's generation is "behind when last heard", in the past tense


def test_drills_page_lists_every_drill_with_its_result(viewer_page, canary_digits, operator):
    from django.utils import timezone

    started = timezone.now()
    Drill.objects.create(model=canary_digits, actor=operator, status="passed", started_at=started, finished_at=started + timezone.timedelta(seconds=0.5),
                         last_ack_s=0.142, confirmed_s=0.2, failed_requests=0, target_s=60.0, from_generation=2, to_generation=3, workers=[{"worker": "w1"}])

    html = viewer_page.get("/drills/").content.decode()

    assert "badge-passed" in html and "0.142 s" in html and "0.500 s" in html and "2 → 3" in html


def test_admins_get_the_users_link(admin_page, viewer_page, digits):
    assert b'href="/users/"' in admin_page.get("/").content
    assert b'href="/users/"' not in viewer_page.get("/").content


def test_confirmation_page_posts_plainly_without_javascript_enhancement(operator_page, canary_digits):
    html = operator_page.get("/models/digits/drill/").content.decode()

    assert '<form method="post" action="/models/digits/drill/" class="confirm">' in html
    assert 'name="roll_forward"' in html


def test_models_page_offers_operators_a_rollback_shortcut(operator_page, viewer_page, canary_digits):
    assert b'href="/models/digits/rollback/"' in operator_page.get("/").content
    assert b'href="/models/digits/rollback/"' not in viewer_page.get("/").content


def test_the_versions_table_shows_a_validating_and_a_rejected_version_with_its_reason(viewer_page, digits):
    add_version(digits, 3, status="validating", signature={}, validation_report={})
    add_version(digits, 4, status="rejected", status_reason="the ONNX checker refused the model: bad node", signature={})

    html = viewer_page.get("/models/digits/?fragment=versions-table").content.decode()

    assert '<span class="badge badge-validating" title="">Validating</span>' in html
    assert '<span class="badge badge-rejected" title="the ONNX checker refused the model: bad node">Rejected</span>' in html
    assert '<div class="hint status-reason">the ONNX checker refused the model: bad node</div>' in html


def test_the_page_of_a_version_not_ready_offers_no_download(viewer_page, digits):
    add_version(digits, 3, status="validating", signature={}, validation_report={})
    add_version(digits, 4, status="rejected", status_reason="the ONNX checker refused the model", signature={})

    validating = viewer_page.get("/models/digits/versions/3/").content.decode()
    rejected = viewer_page.get("/models/digits/versions/4/").content.decode()

    assert "Download .onnx" not in validating and "being validated" in validating
    assert "Download .onnx" not in rejected and "its artifact was not kept" in rejected
    assert "the ONNX checker refused the model" in rejected


def test_workers_page_calls_a_worker_whose_apply_failed_failing_not_behind(viewer_page, canary_digits):
    """One serving the current generation but for another model read "2 · behind"."""
    worker = report_from("partly", generation=2, versions=[])
    worker.ok, worker.error = False, "applied but for other (keeps the routes it served before): other v2: sha256 mismatch"
    worker.save()

    html = viewer_page.get("/workers/").content.decode()

    assert "2 · failing" in html and "· behind" not in html


def test_workers_page_shows_a_converged_workers_warning_that_its_state_was_not_saved(viewer_page, canary_digits):
    # Shown only for failing workers, a worker whose cache could not be written read as
    # converged with no word of it, and a restart during an outage served the old state.
    worker = report_from("unsaved", generation=canary_digits.current_release().generation, versions=[])
    worker.ok, worker.error = True, "applied, but not saved for a restart (/cache/applied-state.json: [Errno 28] No space left on device)"
    worker.save()

    html = viewer_page.get("/workers/").content.decode()

    assert '<p class="hint warn-text">applied, but not saved for a restart (/cache/applied-state.json: [Errno 28] No space left on device)</p>' in html


def test_the_model_page_says_its_workers_serve_it_and_how_many_fail_another_model(viewer_page, canary_digits):
    generation = canary_digits.current_release().generation
    worker = report_from("partly", generation=generation, versions=[])
    worker.last_report = {**worker.last_report, "digest": "e" * 64, "models": {"digits": model_digests(issued_state(generation))["digits"]}}
    worker.ok, worker.error = False, "applied but for other (keeps the routes it served before): other v2: sha256 mismatch"
    worker.save()

    html = viewer_page.get("/models/digits/").content.decode()

    assert f"✓ All 1 live worker serve generation {generation} of digits.</span>" in html
    assert "1 of them fails to apply another model" in html


def test_the_model_page_reads_no_more_queries_for_more_versions(viewer_page, canary_digits):
    # The split and rollout panels' load check read each version's row again: 33 queries
    # with two versions, 133 with fifty more.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as few:
        viewer_page.get("/models/digits/")
    for number in range(3, 13):
        add_version(canary_digits, number)
    with CaptureQueriesContext(connection) as many:
        viewer_page.get("/models/digits/")

    assert len(many.captured_queries) == len(few.captured_queries)


def _models_list_queries(client) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        assert client.get("/", {"fragment": "models-table"}).status_code == 200
    return len(captured.captured_queries)


def test_the_models_list_reads_a_silent_workers_proofs_once_for_all_models(viewer_page, digits, operator):
    """Judged model by model, a recently silent worker's last proof (a state recomputed per
    model) cost each row all the models again: 3,881 queries for 30 models."""
    def add_model(index: int) -> None:
        model = RegisteredModel.objects.create(name=f"model-{index}")
        releases.route_first_version(add_version(model, 1), operator)

    for index in range(2):
        add_model(index)
    report_from("w1", generation=digits.current_release().generation, versions=[])
    report_from("w2", generation=1, versions=[], seconds_ago=12)
    few = _models_list_queries(viewer_page)
    for index in range(2, 8):
        add_model(index)
    many = _models_list_queries(viewer_page)

    assert (many - few) / 6 <= 8, (few, many)  # a few queries a row (4 here), not all the models again (20 here before)
