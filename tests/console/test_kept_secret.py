"""The Django key and the worker token, when the environment gives none, are generated
once into DATA_DIR and read by every process started beside it (console/kept_secret.py)."""

from __future__ import annotations

import threading

from console.kept_secret import kept_secret


def made_at_once(path) -> tuple[str, str]:
    """What a first maker and one starting while the first still makes its secret read."""
    making, finish = threading.Event(), threading.Event()

    def slow_make() -> str:
        making.set()
        finish.wait(10)
        return "first-" + "a" * 40

    first: list[str] = []
    maker = threading.Thread(target=lambda: first.append(kept_secret(path, slow_make)))
    maker.start()
    making.wait(10)
    beside = kept_secret(path, lambda: "beside-" + "b" * 40)
    finish.set()
    maker.join(10)
    return first[0], beside


def test_processes_making_the_secret_at_once_read_the_same_whole_one(tmp_path):
    # Created empty and then written, the file was read in between: "DJANGO_SECRET_KEY is
    # only 0 characters long" for one of two workers started at once on a fresh DATA_DIR.
    first, beside = made_at_once(tmp_path / "secret_key")

    assert first == beside and len(first) > 40
    assert (tmp_path / "secret_key").read_text() == first
    assert [path.name for path in tmp_path.iterdir()] == ["secret_key"]  # nothing of the other left


def test_the_secret_kept_is_readable_by_its_owner_alone(tmp_path):
    kept_secret(tmp_path / "worker_token")

    assert oct((tmp_path / "worker_token").stat().st_mode & 0o777) == "0o600"


def test_a_secret_kept_before_is_read_not_made_again(tmp_path):
    (tmp_path / "secret_key").write_text("kept-" + "k" * 50 + "\n")

    assert kept_secret(tmp_path / "secret_key", lambda: "new") == "kept-" + "k" * 50
