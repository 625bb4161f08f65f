"""Routing: exact bucket bounds for every split, sticky keys, pinned versions, and which
versions a pinned request may reach."""

from __future__ import annotations

from collections import Counter

import pytest

from serving import traffic_split as router_module
from serving.errors import ModelNotFound, NotFound, NotReady, VersionNotFound
from serving.traffic_split import BUCKETS, Router, RoutingTable, VersionNotRouted, bucket_of, build_routes


def table(weights: dict[int, int], warm: tuple[int, ...] = (), shadows=(), *, allow_pinning_unrouted: bool = False) -> RoutingTable:
    targets = {version: f"v{version}" for version in (*weights, *warm)}
    return RoutingTable(7, {"digits": build_routes(weights, targets, shadows)}, allow_pinning_unrouted)


@pytest.fixture(scope="module")
def key_for_bucket() -> dict[int, str]:
    """One routing key per bucket (the first of k0, k1, … to land there): routing every
    bucket through the real key path gives exact counts instead of sampled ones."""
    keys: dict[int, str] = {}
    index = 0
    while len(keys) < BUCKETS:
        keys.setdefault(bucket_of(f"k{index}"), f"k{index}")
        index += 1
    return keys


def versions_by_bucket(routes: RoutingTable, key_for_bucket: dict[int, str]) -> list[str]:
    return [routes.resolve("digits", None, key_for_bucket[bucket]) for bucket in range(BUCKETS)]


def buckets_of(served: list[str], version: str) -> range | None:
    """The buckets that `version` serves, which must be one contiguous run."""
    found = [bucket for bucket, name in enumerate(served) if name == version]
    if not found:
        return None
    assert found == list(range(found[0], found[-1] + 1)), f"{version} serves scattered buckets"
    return range(found[0], found[-1] + 1)


def test_a_one_percent_canary_gets_exactly_the_last_hundred_buckets(key_for_bucket):
    served = versions_by_bucket(table({1: 99, 2: 1}), key_for_bucket)

    assert buckets_of(served, "v1") == range(0, 9_900)
    assert buckets_of(served, "v2") == range(9_900, 10_000)


def test_promoting_the_canary_to_full_weight_routes_every_bucket_to_it(key_for_bucket):
    served = versions_by_bucket(table({2: 100}, warm=(1,)), key_for_bucket)

    assert Counter(served) == {"v2": 10_000}


@pytest.mark.parametrize(("stable", "canary"), [(99, 1), (90, 10), (50, 50), (10, 90), (1, 99)])
def test_every_bucket_follows_the_weights_to_the_exact_percentage_point(key_for_bucket, stable, canary):
    served = versions_by_bucket(table({1: stable, 2: canary}), key_for_bucket)

    assert Counter(served) == {"v1": stable * 100, "v2": canary * 100}
    assert buckets_of(served, "v1") == range(0, stable * 100)


def test_a_three_way_split_keeps_both_one_percent_routes(key_for_bucket):
    served = versions_by_bucket(table({1: 98, 2: 1, 3: 1}), key_for_bucket)

    assert buckets_of(served, "v1") == range(0, 9_800)
    assert buckets_of(served, "v2") == range(9_800, 9_900)
    assert buckets_of(served, "v3") == range(9_900, 10_000)


def test_weights_that_do_not_sum_to_a_hundred_split_in_proportion_with_whole_buckets(key_for_bucket):
    served = versions_by_bucket(table({1: 1, 2: 2}), key_for_bucket)

    assert buckets_of(served, "v1") == range(0, 3_333)  # bound 1 * 10000 // 3, never a fraction
    assert buckets_of(served, "v2") == range(3_333, 10_000)


def test_zero_weight_versions_get_no_bucket_and_are_not_listed_as_routed(key_for_bucket):
    routes = build_routes({1: 100, 2: 0, 3: 0}, {1: "v1", 2: "v2", 3: "v3"})

    assert (routes.versions, routes.weights) == ((1,), (100,))
    assert Counter(versions_by_bucket(RoutingTable(7, {"digits": routes}), key_for_bucket)) == {"v1": 10_000}


def test_routes_list_versions_and_weights_in_version_order():
    routes = build_routes({3: 10, 1: 89, 2: 1}, {1: "v1", 2: "v2", 3: "v3"})

    assert (routes.versions, routes.weights) == ((1, 2, 3), (89, 1, 10))


def test_same_routing_key_gets_the_same_version_in_every_table_of_the_same_split():
    """Two tables built apart (as two swaps, or two workers) agree key by key."""
    first, second = table({1: 50, 2: 50}), table({1: 50, 2: 50})
    keys = [f"user-{index}" for index in range(2_000)]

    first_choice = [first.resolve("digits", None, key) for key in keys]

    assert first_choice == [second.resolve("digits", None, key) for key in keys]
    assert Counter(first_choice) == {"v1": sum(bucket_of(key) < 5_000 for key in keys), "v2": sum(bucket_of(key) >= 5_000 for key in keys)}


def test_bucket_of_is_a_fixed_function_of_the_key():
    """Pinned values: a hash that changes (Python's salted hash(), another digest size or
    byte order) would move every sticky client when workers of two releases serve together."""
    assert [bucket_of(key) for key in ["user-1", "user-42", "alice", "ключ", "a" * 1000]] == [3768, 598, 4729, 5712, 8168]


def test_buckets_cover_the_whole_range(key_for_bucket):
    assert sorted(key_for_bucket) == list(range(BUCKETS))
    assert all(0 <= bucket_of(f"x{index}") < BUCKETS for index in range(5_000))


def test_keys_keep_their_version_when_the_canary_grows():
    """A key on the canary at 10% stays on it at 50%: buckets are stable, bounds move."""
    small, large = table({1: 90, 2: 10}), table({1: 50, 2: 50})
    keys = [f"user-{index}" for index in range(2_000)]

    on_canary = [key for key in keys if small.resolve("digits", None, key) == "v2"]

    assert len(on_canary) == sum(bucket_of(key) >= 9_000 for key in keys)
    assert all(large.resolve("digits", None, key) == "v2" for key in on_canary)


def test_a_request_without_a_key_draws_from_the_same_buckets_as_keyed_ones(monkeypatch):
    """The random draw spans exactly the key buckets, so a weight means the same share
    for clients with and without a routing key."""
    draws = []

    def highest_bucket(stop):
        draws.append(stop)
        return stop - 1

    monkeypatch.setattr(router_module.random, "randrange", highest_bucket)

    assert table({1: 99, 2: 1}).resolve("digits", None) == "v2"
    assert table({1: 99, 2: 1}).resolve("digits", None, "") == "v2"  # an empty key is no key
    assert draws == [BUCKETS, BUCKETS]


def test_random_split_converges_to_the_weights():
    routes = table({1: 70, 2: 30})

    counts = Counter(routes.resolve("digits", None) for _ in range(20_000))

    assert counts["v2"] / 20_000 == pytest.approx(0.30, abs=0.015)


def test_a_pinned_routed_version_bypasses_the_weights():
    routes = table({1: 99, 2: 1})

    assert {routes.resolve("digits", 2, f"user-{index}") for index in range(50)} == {"v2"}
    assert {routes.resolve("digits", 1, f"user-{index}") for index in range(50)} == {"v1"}


@pytest.mark.parametrize(
    ("weights", "warm", "shadows", "pinned"),
    [
        ({1: 100}, (3,), (), 3),  # warm: the rollback target
        ({1: 100, 2: 0}, (), ((2, 0.5),), 2),  # a shadow
        ({1: 100, 2: 0}, (), (), 2),  # listed at weight 0
    ],
)
def test_pinning_a_version_that_takes_no_traffic_is_refused_by_default(weights, warm, shadows, pinned):
    routes = table(weights, warm, shadows)

    with pytest.raises(VersionNotRouted) as refused:
        routes.resolve("digits", pinned)

    assert isinstance(refused.value, NotFound) and refused.value.status == 404
    assert refused.value.message == (
        f"model 'digits' version {pinned} takes no traffic (it is only warm or a shadow); pinned requests may name only a routed version"
    )


def test_pinning_unrouted_versions_works_where_the_worker_allows_it():
    routes = table({1: 100, 2: 0}, warm=(3,), shadows=((2, 0.5),), allow_pinning_unrouted=True)

    assert routes.resolve("digits", 3) == "v3"
    assert routes.resolve("digits", 2) == "v2"
    assert {routes.resolve("digits", None) for _ in range(200)} == {"v1"}


def test_tables_refuse_pinning_unrouted_versions_unless_told():
    assert RoutingTable().allow_pinning_unrouted is False


def test_shadows_are_kept_only_for_loaded_versions():
    routes = build_routes({1: 100}, {1: "v1", 2: "v2"}, [(2, 0.25), (3, 1.0)])

    assert routes.shadows == ((2, 0.25),)


def test_unknown_model_and_version_are_refused_with_their_names():
    routes = table({1: 100})

    with pytest.raises(ModelNotFound) as unknown_model:
        routes.resolve("nope", None)
    with pytest.raises(VersionNotFound) as unknown_version:
        routes.resolve("digits", 9)

    assert unknown_model.value.message == "unknown model 'nope'"
    assert unknown_version.value.message == "model 'digits' has no loaded version '9': a worker loads only what the console routes"


def test_model_with_nothing_routed_is_not_ready():
    routes = table({1: 0}, warm=())

    with pytest.raises(NotReady) as not_ready:
        routes.resolve("digits", None)

    assert not_ready.value.message == "no version of this model is routed"


def test_a_new_router_serves_an_empty_table():
    router = Router()

    assert router.table.generation == 0
    with pytest.raises(ModelNotFound):
        router.table.resolve("digits", None)


def test_swap_replaces_the_table_by_reference():
    router, new = Router(), table({1: 100})

    router.swap(new)

    assert router.table is new
    assert router.table.generation == 7
