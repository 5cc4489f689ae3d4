"""The API's listening socket on the any-address of IPv6, ``::``."""

from __future__ import annotations

import socket

import pytest

from scheduler.api.server import listen


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="this machine has no dual-stack IPv6")
def test_listening_on_the_ipv6_any_address_takes_ipv4_connections_too() -> None:
    """deploy.md offers ``SCHEDULER_API_HOST`` ``0.0.0.0`` or ``::`` alike ("the kubelet probes, and
    the Service sends to, the pod's address"), but ``listen("::", port)`` calls
    ``socket.create_server`` without ``dualstack_ipv6``, which sets IPV6_V6ONLY: the socket takes
    IPv6 only, and on a pod (or machine) addressed by IPv4 every probe and request is refused,
    where an ordinary server bound to ``::`` on Linux (bindv6only 0) takes both."""
    server = listen("::", 0)
    try:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _ = server.accept()
            accepted.close()
    finally:
        server.close()
