"""A client of the console has ``CONSOLE_CLIENT_WAIT_S`` to send a request head and to start
its body: a connection that sends nothing, or part of a head, or a body that stops, is
closed instead of held for ever (20,000 such connections held 20,000 of the console's file
descriptors). A real console process, with the command line every deployment gives it."""

from __future__ import annotations

import json
import re
import socket
import time

import httpx
import pytest
from django.db import connection
from websockets.sync.client import connect as websocket_connect

from tools.stack import running_stack

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

WAIT_S = 1.0


@pytest.fixture
def console(tmp_path, settings):
    with running_stack(tmp_path, settings, connection.settings_dict, SECURE_COOKIES="false", CONSOLE_CLIENT_WAIT_S=str(WAIT_S)) as stack:
        yield stack.console


def open_socket(console) -> socket.socket:
    host, port = console.url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)), timeout=10)
    return client


def read_until_closed(client: socket.socket) -> tuple[bytes, float]:
    """What the console sent before closing, and how long after this call it closed."""
    started, received = time.monotonic(), b""
    while chunk := client.recv(65536):
        received += chunk
    return received, time.monotonic() - started


def test_a_connection_that_sends_nothing_is_closed_after_the_client_wait(console):
    with open_socket(console) as client:
        received, after_s = read_until_closed(client)

    assert received == b""
    assert WAIT_S * 0.9 <= after_s < WAIT_S + 3


def test_a_part_sent_request_head_is_answered_408_and_closed(console):
    with open_socket(console) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        received, after_s = read_until_closed(client)

    assert received.startswith(b"HTTP/1.1 408 ")
    assert json.loads(received.split(b"\r\n\r\n", 1)[1]) == {
        "error": "the request head did not arrive whole within 1 seconds (CONSOLE_CLIENT_WAIT_S); the connection is closed"}
    assert after_s < WAIT_S + 3


def test_a_kept_alive_connection_has_the_same_deadline_for_its_next_head(console):
    with open_socket(console) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while not answer.endswith(b'{"status": "ok"}'):  # the head and the body may come in two reads
            answer += client.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ")
        client.sendall(b"GET /healthz HTTP/1.1\r\n")  # uvicorn's keep-alive timer stops at the first byte
        received, after_s = read_until_closed(client)

    assert received.startswith(b"HTTP/1.1 408 ")
    assert after_s < WAIT_S + 3


def test_a_body_that_stops_arriving_is_answered_408_and_closed(console):
    with open_socket(console) as client:
        client.sendall(b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                       b"Content-Length: 1000\r\n\r\nusername=")
        received, after_s = read_until_closed(client)

    assert received.startswith(b"HTTP/1.1 408 ")
    assert b"the request body arrived slower than 500 bytes a second" in received
    assert after_s < WAIT_S + 3


def test_a_request_sent_whole_is_answered_however_long_its_client_took_to_connect(console):
    with open_socket(console) as client:
        time.sleep(WAIT_S / 2)
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        received, _ = read_until_closed(client)

    assert received.startswith(b"HTTP/1.1 200 ")


def test_the_live_feed_stays_open_past_the_client_wait(console, operator):
    with httpx.Client(base_url=console.url, timeout=10) as browser:
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', browser.get("/login/").text).group(1)
        browser.post("/login/", data={"username": "olivia", "password": "pw-olivia", "csrfmiddlewaretoken": token})
        cookie = f"sessionid={browser.cookies['sessionid']}"

    with websocket_connect(console.url.replace("http://", "ws://") + "/ws/live/", origin=console.url,
                           additional_headers={"Cookie": cookie}, open_timeout=10) as feed:
        time.sleep(WAIT_S * 2.5)

        assert feed.ping().wait(timeout=5)  # the head's deadline is not the socket's
