"""What one read of a long list costs the console: a model's audit timeline of N events.

    .venv/bin/python -m bench.list_bench [--events 300000] [--pages 20]

Fills a throwaway SQLite database (or the PostgreSQL at DATABASE_URL, into which it adds a
model ``audited`` and its events) and reads ``GET /api/models/audited/audit/`` in this
process through DRF's test client: the first answer's time, size and how much it grew the
process (``ru_maxrss``), then ``--pages`` more pages following ``Link: rel="next"``, then the
first answer of a rare kind (one event in a thousand is a drill), then the whole CSV export
through the console's ASGI application (its time and, on PostgreSQL, the sessions it opened).
Code that answers the whole list has no such link: only the first row is printed.
Bounded: a fixed number of events and pages, nothing on the network but the database.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEXT = re.compile(r'<([^>]+)>; rel="next"')


def setup(data_dir: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DATA_DIR", data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill(events: int):
    from registry.models import AuditEvent, RegisteredModel

    model, _ = RegisteredModel.objects.get_or_create(name="audited")
    missing = events - AuditEvent.objects.filter(model=model).count()
    # One in a thousand is a drill: a filtered page of a rare kind is read too.
    rows = (AuditEvent(model=model, kind="drill" if index % 1000 == 999 else "release", message="traffic changed by an operator " + "x" * 40,
                       data={"reason": "a reason typed with the change", "generation": index}) for index in range(max(missing, 0)))
    AuditEvent.objects.bulk_create(rows, batch_size=5000)
    from django.db import connection

    if connection.vendor == "postgresql":
        # As autovacuum would before long: without statistics the planner takes the table for
        # a few hundred rows, and each page of the CSV sorted every event left (44 s, not 7).
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE registry_auditevent")
    return model


def reader():
    from django.contrib.auth import get_user_model

    users = get_user_model().objects
    return users.filter(username="list-bench").first() or users.create_user("list-bench", password=None)


def client():
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(reader())
    return api


def timed(api, url: str):
    start = time.perf_counter()
    response = api.get(url)
    return response, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--fill-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fill_only:  # in a process of its own: the rows it built would set the peak the read is measured against
        setup(os.environ["DATA_DIR"])
        fill(args.events)
        return
    with tempfile.TemporaryDirectory(prefix="list-bench-") as data_dir:
        os.environ.setdefault("DATA_DIR", data_dir)
        subprocess.run([sys.executable, "-m", "bench.list_bench", "--fill-only", "--events", str(args.events)], check=True)
        setup(data_dir)
        api = client()
        url = "/api/models/audited/audit/"
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        first, first_s = timed(api, url)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        print(f"{'read':<28} {'items':>8} {'body MB':>8} {'time':>10} {'process grew':>13}")
        print(f"{'first answer':<28} {len(first.json()):>8} {len(first.content) / 1e6:>8.2f} {first_s * 1000:>8.0f} ms {grown_mb:>10.0f} MB")
        times, response = [], first
        for _ in range(args.pages):
            link = NEXT.search(response.get("Link", ""))
            if link is None:
                break
            response, took = timed(api, link[1])
            times.append(took)
        if times:
            print(f"{f'next {len(times)} pages (median, max)':<28} {len(response.json()):>8} {len(response.content) / 1e6:>8.2f} "
                  f"{statistics.median(times) * 1000:>5.0f}/{max(times) * 1000:.0f} ms")
        rare, rare_s = timed(api, url + "?kind=drill")
        print(f"{'first answer, ?kind=drill':<28} {len(rare.json()):>8} {len(rare.content) / 1e6:>8.2f} {rare_s * 1000:>8.0f} ms")
        size, export_s, sessions = csv_export(url)
        print(f"{'whole CSV, ASGI (sessions)':<28} {args.events:>8} {size / 1e6:>8.2f} {export_s * 1000:>8.0f} ms {sessions:>10}")


def csv_export(url: str) -> tuple[int, float, str]:
    """The whole CSV through the console's ASGI application, as uvicorn serves it, read as
    fast as it comes: bytes, seconds, and the PostgreSQL sessions it opened ("-" on SQLite)."""
    import asyncio

    from django.db import connection
    from rest_framework.authtoken.models import Token

    from console.asgi import application

    token = Token.objects.get_or_create(user=reader())[0].key
    sessions_before = _sessions()
    received, finished, asked = [0], asyncio.Event(), []

    async def receive():
        if asked:
            await finished.wait()
            return {"type": "http.disconnect"}
        asked.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.body":
            received[0] += len(message.get("body", b""))
            if not message.get("more_body"):
                finished.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http", "path": url,
             "raw_path": url.encode(), "query_string": b"format=csv", "root_path": "", "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 8000),
             "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Token {token}".encode())]}
    connection.close()
    start = time.perf_counter()
    asyncio.run(application(scope, receive, send))
    took = time.perf_counter() - start
    sessions_after = _sessions()
    opened = "-" if sessions_before is None else str(sessions_after - sessions_before - 1)  # less this count's own
    return received[0], took, opened


def _sessions() -> int | None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        count = cursor.fetchone()[0]
    connection.close()
    return count


if __name__ == "__main__":
    main()
