"""``console.processes.wait_http``, which runstack and the browser tests use to wait for
a child: ready means the child answered, not whoever holds the port."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading

import pytest

from console.embedded_redis import free_port
from console.processes import wait_http


@pytest.fixture
def stranger_on_a_port():
    """An HTTP server of this test process (not the child's) answering 200 to anything."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_another_process_answering_on_the_childs_port_is_not_the_child_being_ready(stranger_on_a_port):
    # The port was free when runstack checked it; whoever took it meanwhile answered the
    # probe, and the stack printed "Ready" while its console was failing to bind.
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(1); sys.exit(3)"])
    try:
        with pytest.raises(RuntimeError, match="exited with 3 before answering"):
            wait_http(f"http://127.0.0.1:{stranger_on_a_port}/healthz", child, timeout_s=20)
    finally:
        child.kill()
        child.wait(10)


def test_a_child_that_listens_and_answers_is_ready():
    port = free_port()
    child = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/", child, timeout_s=20)
    finally:
        child.kill()
        child.wait(10)
