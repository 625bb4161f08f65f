"""Only the upload endpoints stage file parts, and only for an operator; whatever happens,
nothing staged outlives the request; bodies over the limit are refused unread."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client
from django.test.client import BOUNDARY, encode_multipart
from rest_framework.authtoken.models import Token

from registry import tasks
from registry.artifacts import storage
from registry.artifacts.upload_handler import MULTIPART_OVERHEAD_BYTES
from registry.models import AuditEvent, ModelVersion, RegisteredModel
from tests.fixtures.asgi_calls import call, http_scope
from tests.fixtures.jobs import run_queued_jobs
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db

MADE_UP_CSRF = _get_new_csrf_string()  # a well-formed cookie the attacker chose
OTHER_POST_PATHS = ["/api/models/", "/login/", "/logout/", "/models/digits/rollback/", "/models/digits/split/", "/models/digits/versions/1/try/"]
UPLOAD_PATHS = ["/api/models/digits/versions/", "/models/digits/upload/"]
# Pre-encoded bodies: not the test client's own constant, which would re-encode them.
MULTIPART_CONTENT = f"multipart/form-data; boundary={BOUNDARY}"


@pytest.fixture
def model(operator) -> RegisteredModel:
    return RegisteredModel.objects.create(name="digits", created_by=operator)


@pytest.fixture
def staging_writers(monkeypatch) -> list:
    """Every staging file opened during the test, so 'never staged' can be checked,
    not only 'cleaned up afterwards'."""
    opened = []
    original = storage.StagingWriter.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        opened.append(self.path)

    monkeypatch.setattr(storage.StagingWriter, "__init__", recording)
    return opened


def forging_client(user=None) -> Client:
    """CSRF enforced, with a made-up CSRF cookie and no matching token anywhere."""
    client = Client(enforce_csrf_checks=True)
    if user is not None:
        client.force_login(user)
    client.cookies["csrftoken"] = MADE_UP_CSRF
    return client


def multipart(good_onnx, **fields) -> bytes:
    with open(good_onnx, "rb") as handle:
        return encode_multipart(BOUNDARY, {"artifact": handle, "description": "x", **fields})


@pytest.mark.parametrize("path", UPLOAD_PATHS + OTHER_POST_PATHS)
def test_anonymous_multipart_post_with_a_made_up_csrf_cookie_stages_nothing(model, good_onnx, artifact_root, staging_writers, path):
    response = forging_client().post(path, multipart(good_onnx), content_type=MULTIPART_CONTENT)

    assert response.status_code in (302, 401, 403)
    assert staging_writers == []
    assert stored_files(artifact_root) == []
    assert ModelVersion.objects.count() == 0


@pytest.mark.parametrize("path", UPLOAD_PATHS + OTHER_POST_PATHS)
def test_viewer_multipart_post_stages_nothing(viewer, model, good_onnx, artifact_root, staging_writers, path):
    client = Client(enforce_csrf_checks=True)
    client.force_login(viewer)
    client.get("/")  # a real CSRF cookie and token: the viewer is who they say
    token = client.cookies["csrftoken"].value

    response = client.post(path, multipart(good_onnx, csrfmiddlewaretoken=token), content_type=MULTIPART_CONTENT, HTTP_X_CSRFTOKEN=token)

    assert response.status_code in (302, 403, 404, 415)  # 404: no such version to try; 415: a JSON-only endpoint
    assert staging_writers == []
    assert stored_files(artifact_root) == []
    assert ModelVersion.objects.count() == 0


def test_viewer_with_a_token_stages_nothing(viewer, model, good_onnx, artifact_root, staging_writers):
    client = Client(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=viewer).key}")

    response = client.post("/api/models/digits/versions/", multipart(good_onnx), content_type=MULTIPART_CONTENT)

    assert response.status_code == 403
    assert staging_writers == []
    assert stored_files(artifact_root) == []


@pytest.mark.parametrize("path", UPLOAD_PATHS)
def test_operator_session_upload_without_the_csrf_token_is_refused_and_leaves_nothing(operator, model, good_onnx, artifact_root, path):
    response = forging_client(operator).post(path, multipart(good_onnx), content_type=MULTIPART_CONTENT)

    assert response.status_code == 403
    assert stored_files(artifact_root) == []
    assert ModelVersion.objects.count() == 0


def test_operator_session_upload_with_a_wrong_header_token_stages_nothing(operator, model, good_onnx, artifact_root, staging_writers):
    client = forging_client(operator)

    response = client.post("/api/models/digits/versions/", multipart(good_onnx), content_type=MULTIPART_CONTENT, HTTP_X_CSRFTOKEN=_get_new_csrf_string())

    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]
    assert staging_writers == []


def test_operator_session_upload_with_the_header_token_registers_the_version(operator, model, good_onnx, artifact_root):
    """What the model page's script does: session cookie plus X-CSRFToken."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    client.get("/models/digits/")
    token = client.cookies["csrftoken"].value

    response = client.post("/api/models/digits/versions/", multipart(good_onnx), content_type=MULTIPART_CONTENT, HTTP_X_CSRFTOKEN=token)

    assert response.status_code == 202, response.content
    assert [path.parent.parent.name for path in stored_files(artifact_root)] == ["sha256"]
    run_queued_jobs("validation")
    assert ModelVersion.objects.get(model=model).status == "ready"


def test_operator_plain_form_upload_with_the_body_token_registers_the_version(operator, model, good_onnx, artifact_root):
    """The page without JavaScript: the token travels in the form."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    client.get("/models/digits/")
    token = client.cookies["csrftoken"].value

    response = client.post("/models/digits/upload/", multipart(good_onnx, csrfmiddlewaretoken=token), content_type=MULTIPART_CONTENT)

    assert response.status_code == 302
    assert ModelVersion.objects.filter(model=model).count() == 1
    assert [path.parent.parent.name for path in stored_files(artifact_root)] == ["sha256"]
    run_queued_jobs("validation")
    assert ModelVersion.objects.get(model=model).status == "ready"


def _too_many_fields_after_the_file(good_onnx) -> bytes:
    return multipart(good_onnx, extra_one="1", extra_two="2")


def _bad_base64_in_the_file(good_onnx) -> bytes:
    return (
        f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"artifact\"; filename=\"m.onnx\"\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n\r\n"
        f"{'QUJD' * 20000}!!!not-base64\r\n--{BOUNDARY}--\r\n"
    ).encode()


@pytest.mark.parametrize("path", UPLOAD_PATHS)
@pytest.mark.parametrize("body", [_too_many_fields_after_the_file, _bad_base64_in_the_file])
def test_a_body_that_fails_to_parse_after_staging_began_leaves_nothing(settings, operator_client, operator, model, good_onnx, artifact_root, staging_writers, path, body):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 2
    client = Client(HTTP_AUTHORIZATION=operator_client._credentials["HTTP_AUTHORIZATION"])
    client.force_login(operator)

    response = client.post(path, body(good_onnx), content_type=MULTIPART_CONTENT)

    assert response.status_code == 400
    assert staging_writers  # the parse failed after a file had started staging
    assert stored_files(artifact_root) == []
    assert ModelVersion.objects.count() == 0


class UnreadableBody:
    """A request body that fails the test if anyone reads it."""

    def read(self, *args):
        raise AssertionError("the body was read")

    readline = read


@pytest.mark.parametrize("path", UPLOAD_PATHS)
def test_a_declared_length_over_the_limit_is_413_before_the_body_is_read(settings, operator, model, artifact_root, staging_writers, path):
    settings.MAX_UPLOAD_BYTES = 1000
    client = Client(HTTP_ACCEPT="application/json")
    client.force_login(operator)

    response = client.generic("POST", path, CONTENT_TYPE=MULTIPART_CONTENT, CONTENT_LENGTH=str(1000 + MULTIPART_OVERHEAD_BYTES + 1), **{"wsgi.input": UnreadableBody()})

    assert response.status_code == 413
    body = response.json()
    assert "larger than the limit of 1000 bytes" in (body.get("error") or body["message"])
    assert staging_writers == []
    # The API's session passed DRF's CSRF check; the page's plain form has its token in the unread body.
    assert AuditEvent.objects.filter(kind="upload_refused").count() == (1 if path.startswith("/api/") else 0)


def test_a_page_upload_declared_over_the_limit_is_recorded_once_its_csrf_header_proves_it_came_from_the_page(settings, operator, model):
    settings.MAX_UPLOAD_BYTES = 1000
    client = Client(enforce_csrf_checks=True, HTTP_ACCEPT="application/json")
    client.force_login(operator)
    client.get("/models/digits/")
    declared = str(1000 + MULTIPART_OVERHEAD_BYTES + 1)

    forged = client.generic("POST", "/models/digits/upload/", CONTENT_TYPE=MULTIPART_CONTENT, CONTENT_LENGTH=declared,
                            HTTP_X_CSRFTOKEN=_get_new_csrf_string(), **{"wsgi.input": UnreadableBody()})
    response = client.generic("POST", "/models/digits/upload/", CONTENT_TYPE=MULTIPART_CONTENT, CONTENT_LENGTH=declared,
                              HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value, **{"wsgi.input": UnreadableBody()})

    assert (forged.status_code, response.status_code) == (403, 413)
    assert list(AuditEvent.objects.values_list("kind", "actor__username")) == [("upload_refused", "olivia")]


def test_a_file_part_past_the_limit_stops_staging_at_the_limit(settings, operator_client, model, good_onnx, artifact_root):
    """A length within the allowance, a file over it: the running count refuses it."""
    settings.MAX_UPLOAD_BYTES = good_onnx.stat().st_size - 1

    response = operator_client.post("/api/models/digits/versions/", multipart(good_onnx), content_type=MULTIPART_CONTENT)

    assert response.status_code == 413
    assert stored_files(artifact_root) == []


# ---------------------------------------------------------------- in front of Django (ASGI)


@pytest.mark.django_db(transaction=True)  # the gate reads the database from its own thread
@pytest.mark.parametrize("path", UPLOAD_PATHS)
def test_asgi_refuses_a_declared_length_over_the_limit_without_reading(settings, operator, path):
    from console.asgi import application

    settings.MAX_UPLOAD_BYTES = 1000
    token = Token.objects.create(user=operator).key
    scope = http_scope(path, [(b"content-length", str(1000 + MULTIPART_OVERHEAD_BYTES + 1).encode()), (b"authorization", f"Token {token}".encode())])

    sent, received = asyncio.run(call(application, scope, [{"type": "http.request", "body": b"x" * 10, "more_body": True}]))

    assert sent[0]["status"] == 413
    assert b"larger than the limit of" in sent[1]["body"]
    assert received == []


def test_asgi_cuts_off_a_chunked_body_at_the_limit(settings):
    from console.asgi import application

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    limit = 1000 + MULTIPART_OVERHEAD_BYTES
    chunks = [{"type": "http.request", "body": b"x" * 16384, "more_body": True} for _ in range(100)]
    scope = http_scope("/login/", [(b"transfer-encoding", b"chunked")])

    sent, received = asyncio.run(call(application, scope, chunks))

    assert [message["status"] for message in sent if message["type"] == "http.response.start"] == [413]
    assert len(received) == limit // 16384 + 1  # nothing read past the chunk that crossed the limit
    assert len(chunks) == 100 - len(received)


@pytest.mark.django_db(transaction=True)  # the gate reads the database from its own thread
def test_an_operators_chunked_upload_is_411_naming_the_missing_length_before_a_byte_is_read(operator):
    # Django's multipart parser reads nothing without a length: the upload was answered
    # "artifact: No file was submitted", naming the wrong problem.
    from console.asgi import application

    token = Token.objects.create(user=operator).key
    scope = http_scope("/api/models/digits/versions/", [(b"transfer-encoding", b"chunked"), (b"authorization", f"Token {token}".encode())])

    sent, received = asyncio.run(call(application, scope, [{"type": "http.request", "body": b"x" * 10, "more_body": True}]))

    assert sent[0]["status"] == 411
    assert b"an upload needs a Content-Length header" in sent[1]["body"]
    assert received == []


def test_asgi_limits_other_paths_to_the_form_size(settings):
    from console.asgi import application

    scope = http_scope("/login/", [(b"content-length", str(settings.DATA_UPLOAD_MAX_MEMORY_SIZE + MULTIPART_OVERHEAD_BYTES + 1).encode())])

    sent, received = asyncio.run(call(application, scope, []))

    assert sent[0]["status"] == 413
    assert received == []


BROWSER_FORM_ACCEPT = (b"accept", b"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")


@pytest.mark.django_db(transaction=True)  # a signed-in viewer: the gate reads the database from its own thread
def test_a_browser_form_post_over_the_form_size_gets_the_consoles_error_page_naming_the_limit(settings, viewer):
    # A try-it form of 2.6 MB showed its user raw JSON.
    from console.asgi import application

    size = settings.DATA_UPLOAD_MAX_MEMORY_SIZE + MULTIPART_OVERHEAD_BYTES
    scope = http_scope("/models/digits/versions/1/try/", [(b"content-length", str(size + 1).encode()), BROWSER_FORM_ACCEPT, _session_cookie(viewer)])

    sent, received = asyncio.run(call(application, scope, []))

    assert sent[0]["status"] == 413
    assert (b"content-type", b"text/html; charset=utf-8") in sent[0]["headers"]
    assert "<h1 id=\"error-title\">What you sent is too large</h1>" in sent[1]["body"].decode()
    assert f"the request body is larger than the limit of {size} bytes for any request but an operator&#x27;s upload. Nothing was changed." \
        in sent[1]["body"].decode()
    assert received == []


@pytest.mark.django_db(transaction=True)  # a signed-in viewer: the gate reads the database from its own thread
def test_an_api_call_over_the_form_size_gets_the_apis_json_even_from_a_browser(settings, viewer):
    from console.asgi import application

    size = settings.DATA_UPLOAD_MAX_MEMORY_SIZE + MULTIPART_OVERHEAD_BYTES
    scope = http_scope("/api/models/", [(b"content-length", str(size + 1).encode()), BROWSER_FORM_ACCEPT, _session_cookie(viewer)])

    sent, _ = asyncio.run(call(application, scope, []))

    assert (sent[0]["status"], json.loads(sent[1]["body"])) == (
        413, {"error": f"the request body is larger than the limit of {size} bytes for any request but an operator's upload"})


@pytest.mark.django_db(transaction=True)  # a signed-in viewer: the gate reads the database from its own thread
def test_a_page_scripts_fetch_over_the_form_size_gets_json_its_script_shows(settings, viewer):
    # The try-it form's script reads {"level", "message"}: a 3 MB paste showed "No answer."
    from console.asgi import application

    size = settings.DATA_UPLOAD_MAX_MEMORY_SIZE + MULTIPART_OVERHEAD_BYTES
    scope = http_scope("/models/digits/versions/1/try/", [(b"content-length", str(size + 1).encode()), (b"accept", b"application/json"),
                                                             _session_cookie(viewer)])

    sent, _ = asyncio.run(call(application, scope, []))

    words = f"the request body is larger than the limit of {size} bytes for any request but an operator's upload"
    assert (sent[0]["status"], json.loads(sent[1]["body"])) == (413, {"error": words, "level": "error", "message": words})


# ---------------------------------------------------------------- only an uploader's body is read past the form size

EVERY_UPLOAD_PATH = ["/api/models/digits/versions/", "/models/digits/upload/", "/api/models/digits/jobs/",
                     "/models/digits/jobs/new", "/api/models/digits/datasets/", "/models/digits/datasets/new"]
A_GIGABYTE = [(b"content-length", str(10**9).encode())]


def _past_the_form_size(settings) -> int:
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE + MULTIPART_OVERHEAD_BYTES + 1


def _session_cookie(user) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()


@pytest.mark.parametrize("path", EVERY_UPLOAD_PATH)
def test_an_anonymous_upload_sized_body_is_401_before_a_byte_is_read(path):
    from console.asgi import application

    sent, received = asyncio.run(call(application, http_scope(path, A_GIGABYTE),
                                       [{"type": "http.request", "body": b"x" * 10, "more_body": True}]))

    assert sent[0]["status"] == 401
    assert b"needs an operator's sign-in or API token" in sent[1]["body"]
    assert received == []


def test_an_anonymous_chunked_upload_is_cut_off_at_an_anonymous_requests_size():
    from console.asgi import application
    from console.body_limit import ANONYMOUS_BODY_BYTES

    chunks = [{"type": "http.request", "body": b"x" * 16384, "more_body": True} for _ in range(400)]
    scope = http_scope("/api/models/digits/versions/", [(b"transfer-encoding", b"chunked")])

    sent, received = asyncio.run(call(application, scope, chunks))

    assert [message["status"] for message in sent if message["type"] == "http.response.start"] == [401]
    assert len(received) == ANONYMOUS_BODY_BYTES // 16384 + 1  # not the form size, nor MAX_UPLOAD_BYTES


@pytest.mark.parametrize("path", ["/api/models/digits/versions/", "/login/"])
def test_a_body_declaring_both_a_length_and_chunked_encoding_is_400_before_a_byte_is_read(path):
    # The console's h11 reads such a body as chunked: declaring 10 bytes let an anonymous
    # client past the uploader check and spool an upload's worth before its 401.
    from console.asgi import application

    chunks = [{"type": "http.request", "body": b"x" * 16384, "more_body": True} for _ in range(400)]
    scope = http_scope(path, [(b"content-length", b"10"), (b"transfer-encoding", b"chunked")])

    sent, received = asyncio.run(call(application, scope, chunks))

    assert sent[0]["status"] == 400
    assert (b"connection", b"close") in sent[0]["headers"]
    assert b"both Content-Length and Transfer-Encoding" in sent[1]["body"]
    assert received == []


@pytest.mark.django_db(transaction=True)  # the gate reads the database from its own thread
def test_a_made_up_session_cookie_or_token_is_401_before_the_body_is_read():
    from console.asgi import application

    for credential in [(b"cookie", b"sessionid=madeupmadeupmadeupmadeupmadeup12"), (b"authorization", b"Token " + b"0" * 40)]:
        sent, received = asyncio.run(call(application, http_scope("/api/models/digits/versions/", [*A_GIGABYTE, credential]), []))

        assert sent[0]["status"] == 401, credential
        assert received == []


@pytest.mark.django_db(transaction=True)
def test_a_viewer_upload_sized_body_is_403_before_a_byte_is_read(viewer):
    from console.asgi import application

    token = Token.objects.create(user=viewer).key
    for credential in [(b"authorization", f"Token {token}".encode()), _session_cookie(viewer)]:
        sent, received = asyncio.run(call(application, http_scope("/api/models/digits/versions/", [*A_GIGABYTE, credential]), []))

        assert sent[0]["status"] == 403, credential
        assert b"operators and admins upload" in sent[1]["body"]
        assert received == []


@pytest.mark.django_db(transaction=True)
def test_an_operators_token_upload_declared_over_the_limit_is_413_naming_the_setting_and_recorded(settings, operator, model):
    from console.asgi import application

    settings.MAX_UPLOAD_BYTES = 1000
    token = Token.objects.create(user=operator).key
    headers = [(b"content-length", str(1000 + MULTIPART_OVERHEAD_BYTES + 1).encode()), (b"authorization", f"Token {token}".encode())]

    sent, received = asyncio.run(call(application, http_scope("/api/models/digits/versions/", headers), []))

    assert (sent[0]["status"], json.loads(sent[1]["body"])) == (413, {"error": "the request body is larger than the limit of 66536 bytes: "
                                                                               "MAX_UPLOAD_BYTES (1000) plus 65536 bytes of multipart framing"})
    assert received == []
    assert list(AuditEvent.objects.values_list("kind", "actor__username", "message")) == [
        ("upload_refused", "olivia", "Upload refused: the artifact is larger than the limit of 1000 bytes (MAX_UPLOAD_BYTES)")]


@pytest.mark.django_db(transaction=True)
def test_a_loop_of_uploads_declared_too_large_is_recorded_once_a_minute(settings, operator, model):
    # A 413 costs its client no body: a loop of them wrote 175 audit rows a second.
    from console.asgi import application

    settings.MAX_UPLOAD_BYTES = 1000
    token = Token.objects.create(user=operator).key
    headers = [(b"content-length", str(1000 + MULTIPART_OVERHEAD_BYTES + 1).encode()), (b"authorization", f"Token {token}".encode())]

    statuses = [asyncio.run(call(application, http_scope("/api/models/digits/versions/", headers), []))[0][0]["status"] for _ in range(5)]

    assert statuses == [413] * 5
    assert AuditEvent.objects.filter(kind="upload_refused").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", UPLOAD_PATHS)
def test_a_session_upload_declared_over_the_limit_is_recorded_only_with_the_pages_csrf_header(settings, operator, model, path):
    # The page's script uploads with its session and X-CSRFToken: its 413s were never
    # recorded. A plain form's token lies in the unread body: another site could have sent it.
    from console.asgi import application

    settings.MAX_UPLOAD_BYTES = 1000
    client = Client()
    client.force_login(operator)
    client.get("/models/digits/")
    csrf = client.cookies["csrftoken"].value
    cookies = f"sessionid={client.cookies['sessionid'].value}; csrftoken={csrf}".encode()
    declared = (b"content-length", str(1000 + MULTIPART_OVERHEAD_BYTES + 1).encode())

    forged, _ = asyncio.run(call(application, http_scope(path, [declared, (b"cookie", cookies)]), []))
    wrong, _ = asyncio.run(call(application, http_scope(path, [declared, (b"cookie", cookies),
                                                                  (b"x-csrftoken", _get_new_csrf_string().encode())]), []))
    assert not AuditEvent.objects.exists()
    page, _ = asyncio.run(call(application, http_scope(path, [declared, (b"cookie", cookies), (b"x-csrftoken", csrf.encode())]), []))

    assert [forged[0]["status"], wrong[0]["status"], page[0]["status"]] == [413, 413, 413]
    assert list(AuditEvent.objects.values_list("kind", "actor__username")) == [("upload_refused", "olivia")]


@pytest.mark.django_db(transaction=True)
def test_an_operator_upload_sized_body_is_read(settings, operator):
    from console.asgi import application

    size = _past_the_form_size(settings)
    token = Token.objects.create(user=operator).key
    for credential in [(b"authorization", f"Token {token}".encode()), _session_cookie(operator)]:
        chunks = [{"type": "http.request", "body": b"x" * size, "more_body": False}]
        headers = [(b"content-length", str(size).encode()), (b"content-type", b"application/octet-stream"), credential]

        sent, received = asyncio.run(call(application, http_scope("/api/models/digits/versions/", headers), chunks))

        assert received and received[0]["body"] == b"x" * size, (credential, sent)  # past the gate: Django read it
        assert not [message for message in sent if message.get("status") in (401, 403, 413)], credential


# ---------------------------------------------------------------- the sweep


def test_sweep_removes_stale_staged_files_only(settings, artifact_root):
    settings.STAGING_MAX_AGE_S = 600
    settings.INSPECTION_TIMEOUT_S = 120
    stale, fresh = storage.tmp_dir() / "stale.part", storage.tmp_dir() / "fresh.part"
    stale.write_bytes(b"left by a killed upload")
    fresh.write_bytes(b"an upload in progress")
    old = time.time() - 601
    os.utime(stale, (old, old))
    stored = storage.path_for("ab" * 32)
    stored.parent.mkdir(parents=True)
    stored.write_bytes(b"a stored artifact, however old")
    os.utime(stored, (old, old))

    removed = tasks.sweep_staging()

    assert removed == 1
    assert stored_files(artifact_root) == sorted([fresh, stored])
    assert tasks.sweep_staging() == 0  # idempotent


def test_sweep_never_removes_a_file_younger_than_twice_the_inspection_timeout(settings, artifact_root):
    settings.STAGING_MAX_AGE_S = 60
    settings.INSPECTION_TIMEOUT_S = 300
    being_inspected = storage.tmp_dir() / "inspected.part"
    being_inspected.write_bytes(b"bytes under inspection")
    five_minutes_ago = time.time() - 300
    os.utime(being_inspected, (five_minutes_ago, five_minutes_ago))

    assert tasks.sweep_staging() == 0
    assert being_inspected.exists()


def test_celery_beat_sweeps_staging_every_few_minutes(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["sweep-staging"]

    assert entry["task"] == "registry.tasks.sweep_staging"
    assert entry["schedule"] == 300.0
