"""The gRPC transport (grpcio, asyncio): ``scheduler.v1.SchedulerService`` from the same method
table as HTTP, plus gRPC health checking and server reflection.

An error is the status code of its :class:`~scheduler.api.errors.ApiError`, its one-line message,
and a ``google.rpc.ErrorInfo`` (reason: the error's code string; metadata: its details) in the
status details, which ``grpc_status.rpc_status.from_call`` reads on the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from scheduler.api.errors import ApiError, Code
from scheduler.api.service import METHODS, SchedulerApi
from scheduler.v1 import scheduler_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["SchedulerService"].full_name
ERROR_DOMAIN = "scheduler.v1"
MAX_MESSAGE_BYTES = 32 * 1024 * 1024


def status_of(error: ApiError) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(
        reason=error.code.value,
        domain=ERROR_DOMAIN,
        metadata={key: str(value) for key, value in error.details.items()},
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=error.grpc_status.value[0], message=error.message, details=[detail])
    converted: grpc.Status = rpc_status.to_status(status)
    return converted


def _deserializer(message_type: type[Message]) -> Callable[[bytes], Message | None]:
    """Bytes that are no request of this type become None, answered INVALID_ARGUMENT (grpcio would
    answer INTERNAL to a deserializer that raises)."""

    def parse(data: bytes) -> Message | None:
        try:
            return message_type.FromString(data)
        except (DecodeError, ValueError):
            return None

    return parse


def _unary(
    api: SchedulerApi, executor: Executor, name: str
) -> Callable[[Message | None, grpc.aio.ServicerContext[Any, Any]], Awaitable[Message]]:
    async def call(request: Message | None, context: grpc.aio.ServicerContext[Any, Any]) -> Message:
        try:
            if request is None:
                raise ApiError(
                    Code.INVALID_ARGUMENT, f"the request is not a {METHODS[name].request.__name__}"
                )
            authorization = next(
                (str(value) for key, value in context.invocation_metadata() or () if key == "authorization"),
                None,
            )
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(executor, api.call, name, authorization, request)
        except ApiError as error:
            await context.abort_with_status(status_of(error))
            raise  # abort_with_status raises; this line only satisfies the type checker

    return call


def build_server(api: SchedulerApi, executor: Executor) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC binds with SO_REUSEPORT by default: a second API given the same port would start
            # and take half the connections. A port is one process's, as the HTTP port is.
            ("grpc.so_reuseport", 0),
        ]
    )
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(
            _unary(api, executor, name),
            request_deserializer=_deserializer(method.request),
            response_serializer=lambda message: message.SerializeToString(),
        )
        for name, method in METHODS.items()
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    reflection.enable_server_reflection(
        [SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    return server, checker
