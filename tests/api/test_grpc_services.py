"""What a gRPC tool needs without the proto file: server reflection lists and describes the service,
and gRPC health checking answers (no token needed for either). And the gRPC port is one process's."""

from __future__ import annotations

import asyncio
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import grpc
import httpx
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from bench.chaos_stack import free_port
from scheduler.api.grpc_server import build_server
from scheduler.api.service import METHODS, SchedulerApi
from tests.api.conftest import ApiProcess, ApiStack
from tests.support import SCHEDULER


def test_reflection_describes_every_rpc_and_health_says_serving(api: ApiProcess) -> None:
    with grpc.insecure_channel(api.grpc_target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {"scheduler.v1.SchedulerService", "grpc.health.v1.Health"} <= services
        service = DescriptorPool(database).FindServiceByName("scheduler.v1.SchedulerService")
        assert {method.name for method in service.methods} == set(METHODS)
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_a_second_api_on_a_taken_grpc_port_is_one_clear_line(api_stack: ApiStack, api: ApiProcess) -> None:
    taken = api.grpc_target.rsplit(":", 1)[1]
    ports = ["--port", str(free_port()), "--grpc-port", taken, "--metrics-port", str(free_port())]
    done = subprocess.run(
        [SCHEDULER, "run", "api", *ports], env=api_stack.env, capture_output=True, text=True, timeout=60
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0, done.stderr
    assert len(lines) == 1 and taken in lines[0] and "--grpc-port" in lines[0], done.stderr
    assert httpx.get(f"{api.http_url}/v1/health", timeout=5, trust_env=False).status_code == 200


def test_the_grpc_server_does_not_share_its_port(api: ApiProcess) -> None:
    """Two API processes starting at once both find the port free before either binds it; the one
    that binds second must fail rather than share the port (gRPC's default is SO_REUSEPORT)."""

    async def bind_again() -> None:
        with ThreadPoolExecutor(1) as executor:
            # Nothing is called: the server is only bound, never started.
            server, _ = build_server(cast(SchedulerApi, None), executor)
            try:
                server.add_insecure_port(api.grpc_target)
            finally:
                await server.stop(0)

    with pytest.raises(RuntimeError, match="Failed to bind"):
        asyncio.run(bind_again())
