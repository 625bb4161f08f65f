"""The browser feed relays desired-state changes with routes and the state's digest only."""

from console.consumers import state_change
from serving.contract import DesiredState, ModelState, Route


def test_state_change_keeps_routes_generations_and_the_digest_only():
    state = DesiredState(generation=7, models={"digits": ModelState(generation=7, routes=(
        Route(version=1, weight=90, sha256="ab" * 32, artifact_url="/api/x"),
        Route(version=2, weight=10, sha256="cd" * 32, artifact_url="/api/y"),
    ))}, digest="ef" * 32)

    assert state_change(state) == {"kind": "state", "generation": 7, "digest": "ef" * 32,
                                   "models": {"digits": {"generation": 7, "routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}}}
