"""What a gRPC tool needs without the proto file: server reflection lists and describes the service,
and gRPC health checking answers (no token needed for either)."""

from __future__ import annotations

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from scheduler.api.service import METHODS
from tests.api.conftest import ApiProcess


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
