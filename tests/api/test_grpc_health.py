"""gRPC health says what ``/v1/health`` says, for the server (``""``) and for
``scheduler.v1.SchedulerService`` (what ``grpc_health_probe -service`` asks): SERVING while
PostgreSQL answers, NOT_SERVING within a few seconds once it does not, SERVING again once it does,
and NOT_SERVING as the API stops. PostgreSQL is put out of the API's reach by closing the port the
API knows it by, a port of the test's (tests.support.PostgreSQLPort)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.api.grpc_server import SERVICE
from tests.api.conftest import ApiProcess, ApiStack
from tests.support import PostgreSQLPort, wait_for

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


@contextlib.contextmanager
def forwarded(database_url: str) -> Iterator[tuple[PostgreSQLPort, str]]:
    """A port of the test's to the database of ``database_url``, up, and the URL that reaches it
    through it."""
    port = PostgreSQLPort(database_url)
    port.up()
    try:
        yield port, port.url(database_url)
    finally:
        port.down()


def test_both_names_say_serving(api: ApiProcess) -> None:
    assert statuses(api) == (SERVING, SERVING)


def test_health_follows_postgresql_out_of_reach_and_back(api_stack: ApiStack) -> None:
    with forwarded(api_stack.database_url) as (port, url):
        process = api_stack.start({"SCHEDULER_DATABASE_URL": url})
        assert statuses(process) == (SERVING, SERVING)
        port.down()
        wait_for(
            lambda: statuses(process) == (NOT_SERVING, NOT_SERVING), 15, "gRPC health to say NOT_SERVING"
        )
        assert http_health(process) == 503
        port.up()
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
