"""The persisted last-applied state: written atomically and privately, and never served
unless its digest matches its content and its signature is this worker's key's."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from serving_testkit import route, state

from serving.state_signing import sign_state, signing_key, state_digest
from serving.state_store import FILE_NAME, MAX_FILE_BYTES, PersistedStateRefused, StateStore

KEY = signing_key("worker-token-for-tests")
STATE = state(7, {"m": {"routes": [route(1, 100, Path("/models/m.onnx"), "ab" * 32)]}}, epoch="epoch-x")


@pytest.fixture
def store(tmp_path) -> StateStore:
    return StateStore(tmp_path / "cache", KEY)


def test_a_saved_state_loads_back_whole_with_its_digest(store):
    digest = store.save({**STATE, "digest": "ignored", "signature": "ignored"})

    loaded = store.load()

    assert digest == state_digest(STATE)
    assert {key: loaded[key] for key in STATE} == STATE
    assert loaded["digest"] == digest


def test_the_file_is_private_and_no_temporary_file_is_left(store):
    store.save(STATE)

    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert os.listdir(store.path.parent) == [FILE_NAME]


def test_no_file_loads_as_no_state(store):
    assert store.load() is None


def test_content_changed_on_disk_with_a_stale_digest_is_refused(store):
    store.save(STATE)
    document = json.loads(store.path.read_text())
    document["models"]["m"]["routes"][0]["weight"] = 0
    store.path.write_text(json.dumps(document))

    with pytest.raises(PersistedStateRefused, match=r"^the digest does not match the content \(the file changed after it was written\)$"):
        store.load()


def test_content_changed_with_a_recomputed_digest_is_refused_by_the_signature(store):
    store.save(STATE)
    document = json.loads(store.path.read_text())
    document["generation"] = 8
    document["digest"] = state_digest(document)
    store.path.write_text(json.dumps(document))

    with pytest.raises(PersistedStateRefused, match="the signature does not match"):
        store.load()


def test_a_state_signed_with_another_key_is_refused(store):
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(json.dumps(sign_state(STATE, signing_key("someone-elses-token"))).encode())

    with pytest.raises(PersistedStateRefused, match="the signature does not match"):
        store.load()


@pytest.mark.parametrize(("raw", "reason"), [(b"{not json", "is not JSON"), (b"[1, 2]", "does not hold a JSON object")])
def test_a_file_that_is_not_a_state_object_is_refused(store, raw, reason):
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(raw)

    with pytest.raises(PersistedStateRefused, match=reason):
        store.load()


def test_a_file_past_the_size_limit_is_refused_without_being_parsed(store):
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(b"[" * (MAX_FILE_BYTES + 1))  # parsed, it would nest 16 million deep

    with pytest.raises(PersistedStateRefused, match=f"is larger than {MAX_FILE_BYTES} bytes"):
        store.load()


def test_a_file_of_exactly_the_size_limit_is_read_whole_and_judged_on_its_content(store):
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(b" " * MAX_FILE_BYTES)

    with pytest.raises(PersistedStateRefused, match="is not JSON"):
        store.load()


def test_bytes_that_are_not_text_are_refused_as_not_json_not_a_crash(store):
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(b'{"generation": "\xff\xfe"}')

    with pytest.raises(PersistedStateRefused, match="is not JSON"):
        store.load()


def test_the_first_save_makes_the_cache_directory_private(tmp_path):
    store = StateStore(tmp_path / "not" / "yet", KEY)

    store.save(STATE)

    assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700
    assert store.load()["generation"] == 7


def test_a_state_that_cannot_be_encoded_leaves_the_previous_one_whole(store):
    store.save(STATE)

    with pytest.raises(TypeError):
        store.save({**STATE, "generation": 8, "models": {"m": {"routes": {1, 2}}}})  # a set is not JSON

    assert store.load()["generation"] == 7
    assert os.listdir(store.path.parent) == [FILE_NAME]


def test_a_worker_without_a_token_neither_saves_nor_loads(tmp_path):
    store = StateStore(tmp_path, None)

    with pytest.raises(PersistedStateRefused, match="^this worker has no worker token to sign its persisted state with$"):
        store.save(STATE)
    with pytest.raises(PersistedStateRefused, match="^this worker has no worker token to check its persisted state with$"):
        store.load()


def test_a_signed_state_of_another_contract_version_is_refused_saying_so(store):
    """Written by a worker of another version (before an upgrade): its routes may mean
    something else to this one."""
    store.path.parent.mkdir(parents=True, mode=0o700)
    store.path.write_bytes(json.dumps(sign_state({**STATE, "contract": 999}, KEY)).encode())
    store.path.chmod(0o600)

    with pytest.raises(PersistedStateRefused, match="^not a desired state of this worker's contract: contract: "):
        store.load()


# ---- the file must be the one this worker wrote: the signature alone cannot tell -------

def test_a_symbolic_link_to_an_older_signed_state_is_refused(store, tmp_path):
    older = tmp_path / "older-state.json"
    older.write_bytes(json.dumps(sign_state({**STATE, "generation": 3}, KEY)).encode())
    store.path.parent.mkdir()
    store.path.symlink_to(older)

    with pytest.raises(PersistedStateRefused, match="is a symbolic link"):
        store.load()


def test_a_fifo_in_place_of_the_file_is_refused_at_once_not_waited_on(store):
    import threading

    store.path.parent.mkdir()
    os.mkfifo(store.path)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(pytest.raises(PersistedStateRefused, store.load)), daemon=True)
    reader.start()
    reader.join(5)

    assert outcome, "load() blocked on the FIFO"
    assert "is not a regular file" in str(outcome[0].value)


@pytest.mark.parametrize("mode", [0o666, 0o620])
def test_a_file_other_users_could_have_written_is_refused(store, mode):
    store.save(STATE)
    store.path.chmod(mode)

    with pytest.raises(PersistedStateRefused, match="writable by other users"):
        store.load()


def test_a_file_in_a_directory_every_user_can_write_to_is_refused(store):
    store.save(STATE)
    store.path.parent.chmod(0o777)

    with pytest.raises(PersistedStateRefused, match="writable by every user"):
        store.load()


def test_a_file_or_link_left_at_a_temporary_name_is_never_written_through(store, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    store.path.parent.mkdir()
    (store.path.parent / f"{FILE_NAME}.{os.getpid()}.tmp").symlink_to(victim)  # the name the writes used to go to

    store.save(STATE)

    assert victim.read_text() == "untouched"
    assert not store.path.is_symlink() and stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert store.load()["generation"] == STATE["generation"]
