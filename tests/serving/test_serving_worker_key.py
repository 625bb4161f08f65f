"""A worker's key (serving/worker_key.py): new for each process with a default id; kept,
private, for an id fixed by SERVING_WORKER_ID, so a restarted worker is still its id's."""

from __future__ import annotations

import os
import re
import stat

import pytest

from serving.worker_key import worker_key

OTHER_KEY = "key-of-the-other-process-made-as-workers-do"  # 43 characters, as token_urlsafe(32)


def test_a_default_id_gets_a_new_key_each_time_and_leaves_no_file(tmp_path):
    first, second = worker_key("box-7-ab12", tmp_path, fixed_id=False), worker_key("box-7-ab12", tmp_path, fixed_id=False)

    assert first != second and len(first) >= 40
    assert list(tmp_path.iterdir()) == []


def test_a_fixed_id_keeps_its_key_across_restarts_in_a_private_file(tmp_path):
    first = worker_key("worker-0", tmp_path, fixed_id=True)

    assert worker_key("worker-0", tmp_path, fixed_id=True) == first
    [kept] = tmp_path.iterdir()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600


def test_two_fixed_ids_sharing_a_cache_directory_get_keys_of_their_own(tmp_path):
    assert worker_key("worker-0", tmp_path, fixed_id=True) != worker_key("worker-1", tmp_path, fixed_id=True)


def test_a_fixed_id_makes_its_cache_directory_when_it_does_not_exist_yet(tmp_path):
    cache = tmp_path / "not" / "yet"

    key = worker_key("worker-0", cache, fixed_id=True)

    assert [path.read_text() for path in cache.iterdir()] == [key]


def test_an_empty_key_file_left_by_a_crash_is_replaced_never_used_as_an_empty_key(tmp_path):
    first = worker_key("worker-0", tmp_path, fixed_id=True)
    [kept] = tmp_path.iterdir()
    kept.write_text("")  # what a crash between creating the file and writing it left behind

    key = worker_key("worker-0", tmp_path, fixed_id=True)

    assert key and key != first
    assert [path.read_text() for path in tmp_path.iterdir()] == [key]  # no temporary file left either
    assert worker_key("worker-0", tmp_path, fixed_id=True) == key


def test_an_id_that_looks_like_a_path_keeps_its_key_inside_the_cache_directory(tmp_path):
    cache = tmp_path / "cache"

    worker_key("../../escaped", cache, fixed_id=True)

    assert [path.parent for path in tmp_path.rglob("*") if path.is_file()] == [cache]


def test_of_two_processes_starting_with_one_fixed_id_the_key_linked_first_wins(tmp_path, monkeypatch):
    real_link = os.link

    def another_process_links_first(source, target):
        with open(target, "x") as other:
            other.write(OTHER_KEY)
        real_link(source, target)  # now FileExistsError, as in the race

    monkeypatch.setattr(os, "link", another_process_links_first)

    assert worker_key("worker-0", tmp_path, fixed_id=True) == OTHER_KEY
    assert [path.read_text() for path in tmp_path.iterdir()] == [OTHER_KEY]


@pytest.mark.parametrize("damaged", [b"two\nlines-of-a-key-that-would-break-its-header", b"\xff" * 50, b"k" * 100_000, b"short"],
                         ids=["a line break", "not text", "too long", "too short"])
def test_a_damaged_key_file_is_replaced_by_a_key_that_fits_a_header(tmp_path, damaged):
    worker_key("worker-0", tmp_path, fixed_id=True)
    [kept] = tmp_path.iterdir()
    kept.write_bytes(damaged)

    key = worker_key("worker-0", tmp_path, fixed_id=True)

    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", key)
    assert [path.read_text() for path in tmp_path.iterdir()] == [key]
