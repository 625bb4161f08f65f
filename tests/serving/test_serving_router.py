"""Routing: weighted split, sticky keys, pinned versions, warm-but-unrouted versions."""

from __future__ import annotations

from collections import Counter

import pytest

from serving.errors import ModelNotFound, NotReady, VersionNotFound
from serving.router import Router, RoutingTable, bucket_of, build_routes


def table(weights: dict[int, int], warm: tuple[int, ...] = ()) -> RoutingTable:
    targets = {version: f"v{version}" for version in (*weights, *warm)}
    return RoutingTable(7, {"digits": build_routes(weights, targets)})


def test_same_routing_key_always_gets_the_same_version():
    routes = table({1: 50, 2: 50})

    chosen = {routes.resolve("digits", None, "user-42") for _ in range(100)}

    assert len(chosen) == 1


def test_split_over_many_keys_converges_to_the_weights():
    routes = table({1: 90, 2: 10})

    counts = Counter(routes.resolve("digits", None, f"user-{index}") for index in range(20_000))

    assert counts["v2"] / 20_000 == pytest.approx(0.10, abs=0.01)


def test_random_split_converges_to_the_weights():
    routes = table({1: 70, 2: 30})

    counts = Counter(routes.resolve("digits", None) for _ in range(20_000))

    assert counts["v2"] / 20_000 == pytest.approx(0.30, abs=0.015)


def test_keys_keep_their_version_when_the_canary_grows():
    """A key on the canary at 10% stays on it at 50%: buckets are stable, bounds move."""
    small, large = table({1: 90, 2: 10}), table({1: 50, 2: 50})
    keys = [f"user-{index}" for index in range(2_000)]

    on_canary = [key for key in keys if small.resolve("digits", None, key) == "v2"]

    assert all(large.resolve("digits", None, key) == "v2" for key in on_canary)


def test_explicit_version_bypasses_the_weights():
    routes = table({1: 100, 2: 0})

    assert {routes.resolve("digits", 2, f"user-{index}") for index in range(50)} == {"v2"}


def test_warm_unrouted_version_serves_pinned_requests_only():
    routes = table({1: 100}, warm=(3,))

    assert routes.resolve("digits", 3) == "v3"
    assert {routes.resolve("digits", None) for _ in range(200)} == {"v1"}


def test_unknown_model_and_version_are_refused():
    routes = table({1: 100})

    with pytest.raises(ModelNotFound):
        routes.resolve("nope", None)
    with pytest.raises(VersionNotFound):
        routes.resolve("digits", 9)


def test_model_with_nothing_routed_is_not_ready():
    routes = table({1: 0}, warm=())

    with pytest.raises(NotReady):
        routes.resolve("digits", None)


def test_swap_replaces_the_table_by_reference():
    router, new = Router(), table({1: 100})

    router.swap(new)

    assert router.table is new
    assert router.table.generation == 7


def test_buckets_are_stable_and_in_range():
    assert bucket_of("user-1") == bucket_of("user-1")
    assert all(0 <= bucket_of(f"k{index}") < 10_000 for index in range(1_000))
