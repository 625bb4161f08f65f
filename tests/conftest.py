"""Suite-wide setup: fixtures are registered here; under CI the real services must answer."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

import pytest

pytest_plugins = ["tests.fixtures.personas", "tests.fixtures.onnx_files", "tests.fixtures.store", "tests.fixtures.jobs", "tests.fixtures.job_world",
                  "tests.fixtures.postgres_cluster", "tests.fixtures.netns", "tests.fixtures.quick_hashing",
                  "tests.fixtures.redis_server"]


def _reachable(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=3):
            return True
    except OSError:
        return False


def pytest_sessionstart(session):
    """Under CI a missing PostgreSQL or Redis fails the run; it is never skipped."""
    if os.environ.get("CI", "").lower() not in {"1", "true", "yes"}:
        return
    database_url = os.environ.get("DATABASE_URL", "")
    redis_url = os.environ.get("REDIS_URL", "")
    problems = []
    if not database_url.startswith("postgres"):
        problems.append(f"CI needs DATABASE_URL to name PostgreSQL, got {database_url!r}")
    elif not _reachable(database_url, 5432):
        problems.append(f"PostgreSQL at {database_url} is unreachable")
    if not redis_url or not _reachable(redis_url, 6379):
        problems.append(f"Redis at {redis_url!r} is unreachable")
    if problems:
        pytest.exit("; ".join(problems), returncode=3)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Browser tests last: Playwright's sync API keeps an event loop running in the main
    thread until its session fixture closes, which would break tests using asyncio.run."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)
