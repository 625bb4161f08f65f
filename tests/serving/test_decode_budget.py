"""Large bodies' decodes share one memory budget (serving/decode_budget.py): a decode waits
for room beside those under way, within its deadline; one costing more than the whole
budget runs alone rather than never."""

from __future__ import annotations

import asyncio
import time

import pytest

from serving.decode_budget import JSON_EXPANSION, DecodeBudget, DecodeQueueFull, DecodeTimedOut, decode_cost


def later(seconds: float) -> float:
    return time.monotonic() + seconds


async def hold_until(budget: DecodeBudget, cost: int, release: asyncio.Event, entered: list, name: str, body_bytes: int = 60) -> None:
    async with budget.hold(cost, later(5), body_bytes):
        entered.append(name)
        await release.wait()


def test_a_json_body_costs_its_expansion_and_a_binary_part_its_size():
    assert decode_cost(1000) == 1000 * JSON_EXPANSION
    assert decode_cost(1000, json_bytes=100) == 100 * JSON_EXPANSION + 900


def test_decodes_that_fit_together_run_together():
    async def scenario():
        budget, release, entered = DecodeBudget(100), asyncio.Event(), []
        tasks = [asyncio.create_task(hold_until(budget, 50, release, entered, name)) for name in "ab"]
        await asyncio.sleep(0.05)
        seen = list(entered)
        release.set()
        await asyncio.gather(*tasks)
        return seen, budget.held

    assert asyncio.run(scenario()) == (["a", "b"], 0)


def test_a_decode_that_does_not_fit_waits_for_the_one_under_way():
    async def scenario():
        budget, release, entered = DecodeBudget(100), asyncio.Event(), []
        first = asyncio.create_task(hold_until(budget, 80, release, entered, "first"))
        await asyncio.sleep(0.02)
        second = asyncio.create_task(hold_until(budget, 80, asyncio.Event(), entered, "second"))
        await asyncio.sleep(0.05)
        waiting = list(entered)
        release.set()
        await first
        await asyncio.sleep(0.02)
        second.cancel()
        return waiting, list(entered)

    assert asyncio.run(scenario()) == (["first"], ["first", "second"])


def test_a_decode_costing_more_than_the_whole_budget_runs_alone():
    async def scenario():
        budget = DecodeBudget(100)
        async with budget.hold(1_000, later(1)):
            return budget.held

    assert asyncio.run(scenario()) == 1_000


def test_a_decode_that_finds_no_room_before_its_deadline_is_refused_and_takes_nothing():
    async def scenario():
        budget, release, entered = DecodeBudget(100), asyncio.Event(), []
        first = asyncio.create_task(hold_until(budget, 80, release, entered, "first"))
        await asyncio.sleep(0.02)
        with pytest.raises(DecodeTimedOut):
            async with budget.hold(80, later(0.05)):
                pass
        held = budget.held
        release.set()
        await first
        return held, budget.held

    assert asyncio.run(scenario()) == (80, 0)


def test_a_decode_over_the_whole_budget_is_not_starved_by_smaller_ones_arriving_after_it():
    # It started only when none ran, and overlapping smaller ones kept that from happening until its deadline.
    async def scenario():
        budget, entered = DecodeBudget(100), []

        async def small(name: str) -> None:
            async with budget.hold(40, later(5)):
                entered.append(name)
                await asyncio.sleep(0.15)

        async def big() -> None:
            async with budget.hold(200, later(3)):
                entered.append("big")

        tasks = [asyncio.create_task(small("s0"))]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(big()))
        for index in range(1, 6):
            await asyncio.sleep(0.1)
            tasks.append(asyncio.create_task(small(f"s{index}")))
        await asyncio.gather(*tasks)
        return entered, budget.held

    entered, held = asyncio.run(scenario())

    assert entered[:2] == ["s0", "big"] and held == 0


def test_a_decode_that_would_wait_is_refused_at_once_when_the_bodies_waiting_fill_the_budget():
    # A waiting body is its (inflated) bytes in memory, counted nowhere else: 150 gzip bodies
    # of 8.4 MB each waited together and took a worker to 1.1 GB.
    async def scenario():
        budget, release, entered = DecodeBudget(100), asyncio.Event(), []
        running = asyncio.create_task(hold_until(budget, 100, release, entered, "running"))
        await asyncio.sleep(0.02)
        waiting = asyncio.create_task(hold_until(budget, 10, asyncio.Event(), entered, "waiting"))  # 60 body bytes waiting
        await asyncio.sleep(0.02)
        with pytest.raises(DecodeQueueFull):
            async with budget.hold(10, later(5), body_bytes=60):
                pass
        release.set()
        await running
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        return budget.waiting_bytes

    assert asyncio.run(scenario()) == 0
