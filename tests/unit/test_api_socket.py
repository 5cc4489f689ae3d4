"""The API's HTTP socket: what every connection accepted from it inherits."""

from __future__ import annotations

import socket

from scheduler.api.server import listen


def test_connections_accepted_by_the_api_send_at_once() -> None:
    """An answer is written in two sends (its head, then its body): with Nagle's algorithm on, the
    second waited for the client's delayed acknowledgement, about 40 ms under every call on a
    kept-alive connection. asyncio turns it off only for a socket made with IPPROTO_TCP, which
    socket.create_server's is not, so the listening socket carries TCP_NODELAY for them."""
    server = listen("127.0.0.1", 0)
    with server, socket.create_connection(server.getsockname()[:2]):
        accepted, _ = server.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
