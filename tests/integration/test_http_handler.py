"""``builtin:http`` against real HTTP servers on the loopback interface.

Loopback is exactly what the handler refuses by default, so these tests allow-list it where they
want a request to go through, and count the connections each server accepted to show that a refused
target is refused before any connection. No traffic leaves 127.0.0.0/8 and no DNS is needed beyond
``localhost`` (plus an injected resolver for made-up names).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from scheduler.worker.handlers import HandlerError, HandlerRegistry, NonRetryableError
from scheduler.worker.http_handler import MAX_BODY_BYTES, HttpHandler, TargetRefused
from tests.unit.handler_fixtures import job_context

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    """A stdlib HTTP server in a thread that records every connection and request it gets."""

    host: str
    httpd: ThreadingHTTPServer = field(init=False)
    connections: int = 0
    requests: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.httpd.server_address[1]}"


class _Routes(BaseHTTPRequestHandler):
    server: _RecordingHTTPServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        record = self.server.record
        record.requests.append(
            Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        )
        url = urlsplit(self.path)
        query = {key: values[0] for key, values in parse_qs(url.query).items()}
        if url.path == "/ok":
            self._reply(200, b"hello")
        elif url.path.startswith("/status/"):
            self._reply(int(url.path.removeprefix("/status/")), b"status body")
        elif url.path == "/slow":
            record.release.wait(10)
            self._reply(200, b"late")
        elif url.path == "/redirect":
            self._reply(int(query.get("code", "302")), b"", location=query["to"])
        elif url.path == "/loop":
            self._reply(302, b"", location="/loop")
        elif url.path == "/echo":
            seen = {"method": self.command, "body": body.decode(), "type": self.headers.get("content-type")}
            self._reply(200, json.dumps(seen).encode())
        elif url.path == "/big":
            self._reply(200, b"a" * (MAX_BODY_BYTES + 10_000))
        else:
            self._reply(404, b"no route")

    def _reply(self, status: int, body: bytes, location: str | None = None) -> None:
        self.send_response(status)
        if location is not None:
            self.send_header("Location", location)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _RecordingHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    record: Server

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.record.connections += 1
        return True


@pytest.fixture
def start_server() -> Iterator[Any]:
    started: list[Server] = []

    def start(host: str = "127.0.0.1") -> Server:
        record = Server(host)
        httpd = _RecordingHTTPServer((host, 0), _Routes)
        httpd.record = record
        record.httpd = httpd
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        started.append(record)
        return record

    yield start
    for record in started:
        record.release.set()
        record.httpd.shutdown()
        record.httpd.server_close()


@pytest.fixture
def server(start_server: Any) -> Server:
    record: Server = start_server()
    return record


def call(payload: dict[str, Any], allowlist: Sequence[str] = (), **options: Any) -> Any:
    return asyncio.run(HttpHandler(allowlist, **options)(job_context(payload)))


def test_success_returns_status_and_body(server: Server) -> None:
    handler = HandlerRegistry(["127.0.0.1"]).resolve("builtin:http")
    assert HandlerRegistry.is_async(handler)
    result = asyncio.run(handler(job_context({"url": f"{server.url}/ok", "headers": {"X-Trace": "t1"}})))
    assert result == {"status": 200, "body": "hello"}
    [seen] = server.requests
    assert seen.headers["x-trace"] == "t1"
    assert seen.headers["idempotency-key"] == "key-1"
    assert seen.headers["host"] == server.url.removeprefix("http://")


def test_a_4xx_is_not_retried(server: Server) -> None:
    with pytest.raises(NonRetryableError) as failed:
        call({"url": f"{server.url}/status/404?token=hunter2"}, ["127.0.0.1"])
    # The origin only: a path or query may hold a secret (a webhook's token), and this text is
    # logged, stored and published.
    assert str(failed.value) == f"HTTP 404 Not Found from {server.url}/…"
    assert failed.value.error_class == "HTTP404"


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_408_429_and_5xx_are_retried(server: Server, status: int) -> None:
    with pytest.raises(HandlerError) as failed:
        call({"url": f"{server.url}/status/{status}"}, ["127.0.0.1"])
    assert failed.value.retryable
    assert str(failed.value).startswith(f"HTTP {status} ")


def test_a_timeout_is_retried(server: Server) -> None:
    started = time.monotonic()
    with pytest.raises(HandlerError) as failed:
        call({"url": f"{server.url}/slow", "timeout": 0.3}, ["127.0.0.1"])
    assert failed.value.retryable and failed.value.error_class == "Timeout"
    assert time.monotonic() - started < 5


def test_a_refused_connection_is_retried() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(HandlerError) as failed:
        call({"url": f"http://127.0.0.1:{port}/"}, ["127.0.0.1"])
    assert failed.value.retryable and failed.value.error_class == "ConnectError"


def test_loopback_is_refused_before_connecting_unless_allow_listed(server: Server) -> None:
    with pytest.raises(TargetRefused) as refused:
        call({"url": f"{server.url}/ok"})
    assert str(refused.value) == (
        "refused: 127.0.0.1 is a loopback address (allow-list it with SCHEDULER_HTTP_ALLOWLIST)"
    )
    assert not refused.value.retryable
    assert server.connections == 0


def test_a_name_resolving_to_loopback_is_refused_unless_allow_listed(server: Server) -> None:
    url = server.url.replace("127.0.0.1", "localhost") + "/ok"
    with pytest.raises(
        TargetRefused, match=r"refused: localhost resolves to 127\.0\.0\.1, a loopback address"
    ):
        call({"url": url})
    assert server.connections == 0
    assert call({"url": url}, ["localhost"]) == {"status": 200, "body": "hello"}
    assert server.requests[0].headers["host"] == url.removeprefix("http://").removesuffix("/ok")


def test_a_redirect_to_a_private_address_is_refused_without_connecting(
    server: Server, start_server: Any
) -> None:
    # 127.0.0.2 is loopback too, so a second server there shows whether anything connected.
    inner = start_server("127.0.0.2")
    for target in (f"{inner.url}/ok", "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/"):
        with pytest.raises(TargetRefused, match="refused: "):
            call({"url": f"{server.url}/redirect?to={target}"}, ["127.0.0.1"])
    assert inner.connections == 0
    assert len(server.requests) == 3
    # Allow-listing the network lets the same redirect through.
    assert call({"url": f"{server.url}/redirect?to={inner.url}/ok"}, ["127.0.0.0/8"])["body"] == "hello"


def test_a_redirect_to_another_scheme_is_refused(server: Server) -> None:
    with pytest.raises(TargetRefused, match="only http and https"):
        call({"url": f"{server.url}/redirect?to=file:///etc/passwd"}, ["127.0.0.1"])


def test_redirects_are_followed_at_most_five_times(server: Server) -> None:
    with pytest.raises(NonRetryableError, match="more than 5 redirects"):
        call({"url": f"{server.url}/loop"}, ["127.0.0.1"])
    assert len(server.requests) == 6


def test_a_cross_origin_redirect_drops_credentials(server: Server, start_server: Any) -> None:
    inner = start_server("127.0.0.2")
    payload = {
        "url": f"{server.url}/redirect?to={inner.url}/ok",
        "headers": {"Authorization": "Bearer s3cret", "X-Api-Key": "k3y", "Accept": "text/plain"},
    }
    assert call(payload, ["127.0.0.0/8"])["status"] == 200
    assert server.requests[0].headers["authorization"] == "Bearer s3cret"
    assert server.requests[0].headers["x-api-key"] == "k3y"
    # A credential under any name stays with the origin it was written for; the request's own go on.
    assert "authorization" not in inner.requests[0].headers
    assert "x-api-key" not in inner.requests[0].headers
    assert inner.requests[0].headers["accept"] == "text/plain"


def test_303_turns_a_post_into_a_get_and_307_keeps_it(server: Server) -> None:
    post = {"method": "POST", "body": {"n": 1}}
    after_303 = call({"url": f"{server.url}/redirect?code=303&to=/echo", **post}, ["127.0.0.1"])
    assert json.loads(after_303["body"]) == {"method": "GET", "body": "", "type": None}
    after_307 = call({"url": f"{server.url}/redirect?code=307&to=/echo", **post}, ["127.0.0.1"])
    assert json.loads(after_307["body"]) == {"method": "POST", "body": '{"n":1}', "type": "application/json"}


def test_the_body_is_cut_at_64_kib(server: Server) -> None:
    result = call({"url": f"{server.url}/big"}, ["127.0.0.1"])
    assert result["body"] == "a" * MAX_BODY_BYTES


def test_the_connection_goes_to_the_checked_address_not_a_second_lookup(server: Server) -> None:
    # A rebinding DNS server answers the check with an allowed address and later with another one.
    # The handler asks once and connects to what it checked: httpx never resolves the name (it could
    # not: "pinned.test" exists only in this resolver), yet the server sees the name as Host.
    answers = [["127.0.0.1"], ["10.0.0.1"]]
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> Sequence[str]:
        asked.append(host)
        return answers[min(len(asked), len(answers)) - 1]

    port = server.httpd.server_address[1]
    result = call({"url": f"http://pinned.test:{port}/ok"}, ["127.0.0.1/32"], resolver=rebinding)
    assert result == {"status": 200, "body": "hello"}
    assert asked == ["pinned.test"]
    assert server.requests[0].headers["host"] == f"pinned.test:{port}"
