"""gRPC health says what ``/v1/health`` says, for the server (``""``) and for
``scheduler.v1.SchedulerService`` (what ``grpc_health_probe -service`` asks): SERVING while
PostgreSQL answers, NOT_SERVING within a few seconds once it does not, SERVING again once it does,
and NOT_SERVING as the API stops. PostgreSQL is put out of the API's reach by closing the port the
API knows it by, a forwarder of the test's."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.chaos_stack import free_port
from scheduler.api.grpc_server import SERVICE
from tests.api.conftest import ApiProcess, ApiStack
from tests.support import wait_for

NAMES = ("", SERVICE)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def statuses(api: ApiProcess) -> tuple[int, ...]:
    with grpc.insecure_channel(api.grpc_target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return tuple(
            stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status for name in NAMES
        )


def http_health(api: ApiProcess) -> int:
    return httpx.get(f"{api.http_url}/v1/health", timeout=10, trust_env=False).status_code


class Forwarder:
    """A local port that forwards every connection to ``target`` while it is open; closed, it ends
    the connections it forwards and refuses new ones, as a PostgreSQL out of reach would."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        with self._lock:
            ends = [self._listener, *self._open] if self._listener else self._open
            self._listener, self._open = None, []
        for end in ends:
            _end(end)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return
            with self._lock:
                self._open += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    _end(sink)


def _end(end: socket.socket) -> None:
    with contextlib.suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept() or recv() on it
    end.close()


@contextlib.contextmanager
def forwarded(database_url: str) -> Iterator[tuple[Forwarder, str]]:
    """A forwarder to the database of ``database_url``, open, and the URL that reaches it through it."""
    url = urlsplit(database_url)
    forwarder = Forwarder((url.hostname or "127.0.0.1", url.port or 5432))
    forwarder.open()
    netloc = url.netloc.rsplit("@", 1)[0] + "@" if "@" in url.netloc else ""
    try:
        yield forwarder, urlunsplit(url._replace(netloc=f"{netloc}127.0.0.1:{forwarder.port}"))
    finally:
        forwarder.close()


def test_both_names_say_serving(api: ApiProcess) -> None:
    assert statuses(api) == (SERVING, SERVING)


def test_health_follows_postgresql_out_of_reach_and_back(api_stack: ApiStack) -> None:
    with forwarded(api_stack.database_url) as (forwarder, url):
        process = api_stack.start({"SCHEDULER_DATABASE_URL": url})
        assert statuses(process) == (SERVING, SERVING)
        forwarder.close()
        wait_for(
            lambda: statuses(process) == (NOT_SERVING, NOT_SERVING), 15, "gRPC health to say NOT_SERVING"
        )
        assert http_health(process) == 503
        forwarder.open()
        wait_for(lambda: statuses(process) == (SERVING, SERVING), 15, "gRPC health to say SERVING again")
        assert http_health(process) == 200
        assert process.stop() == 0, process.component.output()[-3000:]


def test_the_service_turns_not_serving_as_the_api_stops(api_stack: ApiStack) -> None:
    """A watcher (a load balancer's health check) hears it before the server goes."""
    process = api_stack.start()
    with grpc.insecure_channel(process.grpc_target) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=60
        )
        assert next(watch).status == SERVING
        process.component.proc.terminate()
        assert next(watch).status == NOT_SERVING
        watch.cancel()
    assert process.component.proc.wait(60) == 0, process.component.output()[-3000:]
