"""The browser's live feed: worker figures relayed from ``registry.live``."""

from __future__ import annotations

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from registry.live import LIVE_GROUP


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(LIVE_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(LIVE_GROUP, self.channel_name)

    async def live_report(self, event):
        await self.send_json({key: value for key, value in event.items() if key != "type"} | {"kind": "report"})
