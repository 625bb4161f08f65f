"""What Triton's statistics (serving.metrics.InferenceStats) add to a worker, timed alone:
the fold at each flush of the pending request records, and the fold once per batch.
End-to-end req/s on a shared 2-core box moves by more than this costs, so it is timed
directly (best of 7).

    .venv/bin/python -m bench.triton_stats_cost
"""

from __future__ import annotations

import timeit
from collections import Counter as Tally

from serving.metrics import PENDING_LIMIT, InferenceStats


def per_request_ns(codes: list[int]) -> float:
    stats, latencies, tally = InferenceStats(), [0.001] * len(codes), Tally(codes)
    best = min(timeit.repeat(lambda: stats.answered(codes, latencies, tally, 0.001 * len(codes)), number=200, repeat=7))
    return best / 200 / len(codes) * 1e9


def per_batch_ns() -> float:
    stats = InferenceStats()
    return min(timeit.repeat(lambda: stats.batch_ran(8, 8, 0.004, 0.0005, 1.0), number=100_000, repeat=7)) / 100_000 * 1e9


def main() -> None:
    rows = [
        ("flush of 2,048 answers, none failed", f"{per_request_ns([200] * PENDING_LIMIT):.1f} ns per request"),
        ("flush of 2,048 answers, 1 % failed", f"{per_request_ns([503 if i % 100 == 0 else 200 for i in range(PENDING_LIMIT)]):.1f} ns per request"),
        ("one batch run", f"{per_batch_ns():.0f} ns per batch"),
    ]
    print("| what is folded | cost |\n|---|---|")
    for what, cost in rows:
        print(f"| {what} | {cost} |")


if __name__ == "__main__":
    main()
