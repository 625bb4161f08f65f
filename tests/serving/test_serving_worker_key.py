"""A worker's key (serving/worker_key.py): new for each process with a default id; kept,
private, for an id fixed by SERVING_WORKER_ID, so a restarted worker is still its id's."""

from __future__ import annotations

import stat

from serving.worker_key import worker_key


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
