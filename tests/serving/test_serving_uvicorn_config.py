"""How the worker process hands its app to uvicorn."""

from __future__ import annotations

import serving.worker as worker_module
from serving.worker import Worker
from serving_testkit import make_config


def test_the_app_is_served_without_uvicorns_forwarded_headers_middleware(tmp_path, monkeypatch):
    # The worker reads neither the client address nor the scheme; the middleware would only
    # scan every request's headers and add a coroutine to each request.
    configs = []

    class CapturedServer:
        exit_status = 0

        def __init__(self, config, drain, keepers=None):
            configs.append(config)

        def run(self) -> None:
            pass

    monkeypatch.setattr(worker_module, "DrainingServer", CapturedServer)

    Worker(make_config(tmp_path)).serve("127.0.0.1", 0)

    (config,) = configs
    assert config.proxy_headers is False
    config.load()
    assert type(config.loaded_app).__name__ == "ServingApp"  # not wrapped in ProxyHeadersMiddleware
