"""The browser feed relays desired-state changes with routes only."""

from console.consumers import state_change


def test_state_change_keeps_routes_and_generations_only():
    state = {"generation": 7, "models": {"digits": {"generation": 7, "routes": [
        {"version": 1, "weight": 90, "sha256": "ab", "artifact_url": "/api/x", "signature": {}},
        {"version": 2, "weight": 10, "sha256": "cd", "artifact_url": "/api/y", "signature": {}},
    ], "warm": [], "batching": {}}}}

    assert state_change(state) == {"kind": "state", "generation": 7, "models": {"digits": {"generation": 7, "routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}}}
