"""The browser's live feed: worker figures relayed from ``registry.live``, and every
new desired state (the console's own ``serving`` broadcast) as a release change, so
pages re-render the split and convergence the moment an operator acts."""

from __future__ import annotations

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from registry.live import LIVE_GROUP
from registry.publish import SERVING_GROUP


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(LIVE_GROUP, self.channel_name)
        await self.channel_layer.group_add(SERVING_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(LIVE_GROUP, self.channel_name)
        await self.channel_layer.group_discard(SERVING_GROUP, self.channel_name)

    async def live_report(self, event):
        await self.send_json({key: value for key, value in event.items() if key != "type"} | {"kind": "report"})

    async def serving_apply(self, event):
        await self.send_json(state_change(event.get("state") or {}))


def state_change(state: dict) -> dict:
    """Routes and generations only: browsers need no artifact URLs or signatures."""
    models = {
        name: {"generation": model.get("generation"), "routes": [{"version": route["version"], "weight": route["weight"]} for route in model.get("routes") or []]}
        for name, model in (state.get("models") or {}).items()
    }
    return {"kind": "state", "generation": state.get("generation"), "models": models}
