"""Whether an address can be listened on, asked as uvicorn would bind it."""

from __future__ import annotations

import socket

from serving.listen_check import is_taken, listen_problem


def test_a_port_another_socket_listens_on_is_taken():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        problem = listen_problem("127.0.0.1", taken.getsockname()[1])

    assert problem is not None and is_taken(problem)


def test_a_free_port_has_no_problem():
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]

    assert listen_problem("127.0.0.1", port) is None


def test_all_ipv6_addresses_are_free_beside_an_ipv4_listener_on_the_same_port():
    # uvloop binds "::" with IPV6_V6ONLY, beside 0.0.0.0; the probe refused it as taken.
    with socket.create_server(("0.0.0.0", 0)) as ipv4:
        assert listen_problem("::", ipv4.getsockname()[1]) is None
