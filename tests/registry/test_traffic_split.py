"""The split a canary share makes (``registry.domain.traffic.canary_split``): the stable version
gets the rest, and 0% and 100% are single routes, so no version is kept loaded for a
share of nothing."""

from __future__ import annotations

import pytest

from registry.domain.traffic import InvalidRoutes, canary_split, check_routes


def test_a_zero_share_routes_the_stable_version_alone():
    assert canary_split(stable_version=1, canary_version=2, canary_weight=0) == [{"version": 1, "weight": 100}]


def test_a_full_share_routes_the_canary_alone():
    assert canary_split(stable_version=1, canary_version=2, canary_weight=100) == [{"version": 2, "weight": 100}]


@pytest.mark.parametrize("share", [1, 33, 99])
def test_a_partial_share_gives_the_stable_version_the_rest(share):
    assert canary_split(stable_version=1, canary_version=2, canary_weight=share) == [{"version": 1, "weight": 100 - share}, {"version": 2, "weight": share}]


@pytest.mark.parametrize("share", [0, 10, 100])
def test_without_a_stable_version_the_canary_takes_all_traffic(share):
    assert canary_split(stable_version=None, canary_version=2, canary_weight=share) == [{"version": 2, "weight": 100}]


def test_every_share_makes_a_split_the_route_checks_accept():
    for share in range(101):
        check_routes(canary_split(stable_version=1, canary_version=2, canary_weight=share), ready_versions={1, 2})


@pytest.mark.parametrize("routes", [[{"version": 1, "weight": 90}], [{"version": 1, "weight": 60}, {"version": 2, "weight": 30}],
                                    [{"version": 1, "weight": 0}, {"version": 2, "weight": 0, "shadow": 0.5}]])
def test_a_split_whose_weights_sum_to_less_than_100_is_refused(routes):
    # Short of 100 is as wrong as past it: the rest of the traffic would go nowhere a worker could name.
    with pytest.raises(InvalidRoutes, match="weights must sum to 100, got"):
        check_routes(routes, ready_versions={1, 2})


def test_a_shadow_route_that_also_names_a_weight_is_refused():
    # Not read as a shadow with its weight dropped: the operator asked for v2 to answer 30% of clients.
    with pytest.raises(InvalidRoutes, match=r"routes\[1\] is a shadow: its weight must be 0"):
        check_routes([{"version": 1, "weight": 100}, {"version": 2, "weight": 30, "shadow": 0.5}], ready_versions={1, 2})
