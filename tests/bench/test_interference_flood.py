"""The flood of bench/interference_bench.py: new connections to a port where a listen-queue
keeper refuses every one. The benchmark's figures mean something only if the flood is
really refused there (a 503 each, nothing accepted) at the rate asked."""

from __future__ import annotations

import time

from bench.interference_bench import Flood

REQUEST = b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"


def test_every_connection_of_the_flood_is_answered_503_at_the_rate_asked(tmp_path):
    flood = Flood(rate_per_s=400, duration_s=1.0, request=REQUEST, workdir=tmp_path)
    time.sleep(1.0)

    figures = flood.stop(duration_s=1.0)

    assert 360 <= figures.sent_per_s <= 440
    assert figures.refused_share >= 0.95  # the rest: queued at the stop, reset by the close
    assert figures.keeper_cores > 0
