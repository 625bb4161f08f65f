"""A stored artifact whose bytes changed after its upload (a disk, a hand): the console
streams it once, and from then on answers 503 saying its copy changed, until the file
changes again, where every worker downloaded it whole every 3 s and said only "sha256
mismatch" (an operator's fault run). Tests: the HTTP answers; the worker's words for a
refused download are in tests/serving/test_console_client*.py."""

from __future__ import annotations

import os

import pytest

from registry.artifacts import storage
from registry.models import ModelVersion

pytestmark = pytest.mark.django_db
ARTIFACT = "/api/models/digits/versions/1/artifact"


@pytest.fixture
def stored(three_versions):
    """digits v1's stored file, writable, and its bytes as uploaded."""
    path = storage.path_for(ModelVersion.objects.get(model__name="digits", number=1).sha256)
    os.chmod(path, 0o600)
    return path, path.read_bytes()


def downloaded(client) -> tuple[int, bytes]:
    response = client.get(ARTIFACT)
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return response.status_code, body


def test_an_unchanged_file_is_served_every_time(stored, worker_client):
    path, uploaded = stored

    assert downloaded(worker_client) == downloaded(worker_client) == (200, uploaded)


def test_a_file_whose_whole_download_did_not_match_its_sha256_is_a_503_saying_the_store_changed(stored, worker_client, settings):
    path, uploaded = stored
    path.write_bytes(b"not the bytes uploaded")
    assert downloaded(worker_client) == (200, b"not the bytes uploaded")  # nothing is hashed before a first stream

    response = worker_client.get(ARTIFACT)

    version = ModelVersion.objects.get(model__name="digits", number=1)
    assert response.status_code == 503
    assert response["Retry-After"] == "30"
    assert response.json()["error"] == (f"the stored artifact of digits v1 does not match its sha256 {version.sha256[:12]}…: the file at "
                                        f"sha256/{version.sha256[:2]}/{version.sha256} under ARTIFACT_ROOT changed after its upload; "
                                        "restore its bytes there (uploading them again does not replace it), or route digits away from v1")
    assert str(settings.ARTIFACT_ROOT) not in response.content.decode()  # the host's layout is for the console's log


def test_a_symbolic_link_in_place_of_a_stored_file_is_never_followed(stored, viewer_client, tmp_path):
    # Its target (/etc/passwd in an attack) was streamed with 200 to any reader.
    path, _ = stored
    secret = tmp_path / "secret"
    secret.write_text("root:x:0:0")
    path.unlink()
    path.symlink_to(secret)

    response = viewer_client.get(ARTIFACT)

    assert response.status_code == 503
    assert "changed after its upload" in response.json()["error"]
    assert b"root:x" not in response.content


def test_the_file_is_served_again_once_it_is_restored(stored, worker_client):
    path, uploaded = stored
    path.write_bytes(b"not the bytes uploaded")
    downloaded(worker_client)
    path.write_bytes(uploaded)

    assert downloaded(worker_client) == (200, uploaded)


def test_the_file_restored_with_its_old_times_is_served_again(stored, worker_client):
    """cp -p (or a bit flipped in place) keeps the inode, size and modification time: the
    good file answered 503 until the console restarted."""
    path, uploaded = stored
    before = path.stat()
    path.write_bytes(bytes([uploaded[0] ^ 1]) + uploaded[1:])
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    downloaded(worker_client)
    path.write_bytes(uploaded)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))

    assert downloaded(worker_client) == (200, uploaded)


def test_a_download_its_client_left_early_proves_nothing(stored, worker_client):
    path, _ = stored
    path.write_bytes(b"x" * (3 * 256 * 1024))
    response = worker_client.get(ARTIFACT)
    next(iter(response.streaming_content))  # one part, then gone (never read to its end)

    assert worker_client.get(ARTIFACT).status_code == 200


def test_the_model_page_says_which_ready_version_s_stored_file_changed(stored, worker_client, client, operator):
    # It read "Ready" while any worker that loaded it afresh refused it.
    path, uploaded = stored
    client.force_login(operator)
    before = client.get("/models/digits/").content.decode()
    path.write_bytes(b"not the bytes uploaded")
    downloaded(worker_client)

    after = client.get("/models/digits/").content.decode()

    words = "its stored file changed after upload: a worker that loads it now refuses it"
    assert words not in before
    assert after.count(words) == 1  # v1's row alone
