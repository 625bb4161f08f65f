from django.urls import path, re_path

from console.consumers import LiveConsumer, NoSuchSocket

websocket_urlpatterns = [path("ws/live/", LiveConsumer.as_asgi()), re_path(r"", NoSuchSocket.as_asgi())]
