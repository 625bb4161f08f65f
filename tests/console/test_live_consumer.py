"""The browser feed relays desired-state changes with routes only."""

from console.consumers import state_change
from serving.contract import DesiredState, ModelState, Route


def test_state_change_keeps_routes_and_generations_only():
    state = DesiredState(generation=7, models={"digits": ModelState(generation=7, routes=(
        Route(version=1, weight=90, sha256="ab" * 32, artifact_url="/api/x"),
        Route(version=2, weight=10, sha256="cd" * 32, artifact_url="/api/y"),
    ))})

    assert state_change(state) == {"kind": "state", "generation": 7, "models": {"digits": {"generation": 7, "routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}}}
