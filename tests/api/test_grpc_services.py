"""What a gRPC tool needs without the proto file: server reflection lists and describes the service,
and gRPC health checking answers (no token needed for either). The gRPC port is one process's. And
gRPC reads a request as HTTP does: parsed only for an authenticated caller, within the same size,
no field the API does not have, a token of the same length."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
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
from scheduler.v1 import scheduler_pb2 as pb
from tests.api.client import Outcome, grpc_error, token
from tests.api.conftest import ApiProcess, ApiStack
from tests.api.test_transports import schedules_named
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


def _raw(api: ApiProcess, method: str, data: bytes, bearer: str | None) -> Outcome:
    """``data`` sent as ``method``'s request as it is, with ``bearer`` or no token."""
    metadata = () if bearer is None else (("authorization", f"Bearer {bearer}"),)
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(api.grpc_target, options=options) as channel:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            f"/scheduler.v1.SchedulerService/{method}"
        )
        try:
            answer = call(data, metadata=metadata, timeout=60)
        except grpc.RpcError as error:
            return grpc_error(error)
    return Outcome("OK", {"bytes": len(answer)}, grpc_status=grpc.StatusCode.OK)


def _unknown_field(number: int, value: bytes) -> bytes:
    """Field ``number`` of wire type 2 (bytes) holding ``value``: a field no message of ours has."""
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_a_request_is_parsed_only_for_an_authenticated_caller(api: ApiProcess) -> None:
    """Bytes that are no request, or a large one, without a token: UNAUTHENTICATED as over HTTP,
    never a parse (which ran on the event loop both transports share)."""
    for data in (b"\x0a\xff", pb.ListSchedulesRequest(app="x" * 1000).SerializeToString() * 1000):
        outcome = _raw(api, "ListSchedules", data, None)
        assert outcome.code == "UNAUTHENTICATED", outcome
    assert _raw(api, "ListSchedules", b"\x0a\xff", token()).code == "INVALID_ARGUMENT"


def test_a_request_over_4_mib_is_refused_as_over_http(api_stack: ApiStack, api: ApiProcess) -> None:
    name = f"big-{uuid.uuid4().hex[:8]}"
    request = pb.CreateScheduleRequest(app="alpha", handler="builtin:noop", name=name)
    request.payload.struct_value.update({"blob": "x" * 1024})
    data = request.SerializeToString() + _unknown_field(99, b"x" * (5 * 1024 * 1024))
    outcome = _raw(api, "CreateSchedule", data, token())
    assert (outcome.code, outcome.grpc_status) == ("PAYLOAD_TOO_LARGE", grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert outcome.body["details"] == {"limit_bytes": str(4 * 1024 * 1024)}
    assert schedules_named(api_stack, name) == 0


@pytest.mark.parametrize("where", ["top", "nested"])
def test_a_field_the_api_does_not_have_is_refused_not_dropped(
    api_stack: ApiStack, api: ApiProcess, where: str
) -> None:
    """HTTP refuses an unknown JSON field; gRPC refuses an unknown field number, at any depth (one
    a newer client sets would otherwise be silently ignored)."""
    name = f"unknown-{uuid.uuid4().hex[:8]}"
    request = pb.CreateScheduleRequest(app="alpha", handler="builtin:noop", name=name)
    extra = _unknown_field(99, b"a field from a newer proto")
    if where == "top":
        data = request.SerializeToString() + extra
    else:
        retry = pb.RetryConfig(max_attempts=2).SerializeToString() + extra
        data = request.SerializeToString() + _unknown_field(
            pb.CreateScheduleRequest.DESCRIPTOR.fields_by_name["retry_config"].number, retry
        )
    outcome = _raw(api, "CreateSchedule", data, token())
    assert (outcome.code, outcome.grpc_status) == ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT)
    assert "fields a CreateScheduleRequest does not have" in outcome.body["message"]
    assert schedules_named(api_stack, name) == 0
    assert _raw(api, "CreateSchedule", request.SerializeToString(), token()).ok


def test_a_token_of_11_kb_is_read_as_over_http(api: ApiProcess) -> None:
    """gRPC's default header limit (8 KiB, refused at random up to 16 KiB) would refuse a token the
    API takes, and with RESOURCE_EXHAUSTED rather than an answer about the token."""
    bearer = token(junk="x" * 8 * 1024)  # about 11 KB once encoded
    assert 10_000 < len(bearer) < 16 * 1024
    assert _raw(api, "ListSchedules", pb.ListSchedulesRequest().SerializeToString(), bearer).ok
    too_long = token(junk="x" * 20 * 1024)
    outcome = _raw(api, "ListSchedules", pb.ListSchedulesRequest().SerializeToString(), too_long)
    assert outcome.code == "UNAUTHENTICATED", outcome
