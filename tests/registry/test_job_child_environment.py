"""What a job's child process (``python -m serving.jobs``, which loads uploaded models) is
given of the Celery process's environment: the worker settings it needs, no secret, and
not where a secret is kept."""

from __future__ import annotations

from registry.jobs.child import environment

SECRETS = {"DATABASE_URL": "postgres://u:leaked@db/x", "DJANGO_SECRET_KEY": "leaked-key", "REDIS_URL": "redis://:leaked@r:6379/0",
           "SERVING_WORKER_TOKEN": "leaked-token", "SERVING_WORKER_TOKEN_FILE": "/run/secrets/worker_token",
           "CONSOLE_METRICS_TOKEN": "leaked-metrics-token"}


def test_a_job_child_gets_the_serving_settings_but_no_secret_nor_the_file_holding_one(monkeypatch, tmp_path):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SERVING_INTRA_OP_THREADS", "2")

    given = environment(str(tmp_path))

    assert not set(SECRETS) & set(given)
    assert "/run/secrets" not in repr(given)
    assert given["SERVING_INTRA_OP_THREADS"] == "2"
    assert given["HOME"] == given["TMPDIR"] == str(tmp_path)
