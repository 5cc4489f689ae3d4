"""The gRPC transport (grpcio, asyncio): ``scheduler.v1.SchedulerService`` from the same method
table as HTTP, plus gRPC health checking and server reflection.

An error is the status code of its :class:`~scheduler.api.errors.ApiError`, its one-line message,
and a ``google.rpc.ErrorInfo`` (reason: the error's code string; metadata: its details) in the
status details, which ``grpc_status.rpc_status.from_call`` reads on the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from functools import partial
from typing import Any, cast

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from scheduler.api.auth import MAX_TOKEN_BYTES
from scheduler.api.errors import ApiError, Code, clear_frames, invalid
from scheduler.api.messages import (
    MAX_BATCH_REQUEST_BYTES,
    count_values,
    max_request_bytes,
    max_request_values,
    too_large,
)
from scheduler.api.metrics import REQUESTS
from scheduler.api.service import (
    LARGE_BODY_READ_S,
    LARGE_REQUEST_BYTES,
    LARGE_REQUEST_WAIT_S,
    METHODS,
    LargeRequests,
    SchedulerApi,
    take_within,
)
from scheduler.telemetry.tracing import TRACEPARENT_HEADER, TRACESTATE_HEADER, caller_context
from scheduler.v1 import scheduler_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["SchedulerService"].full_name
ERROR_DOMAIN = "scheduler.v1"
# The token and whatever else a client sends in its headers.
MAX_METADATA_BYTES = MAX_TOKEN_BYTES + 16 * 1024
# How many batch creates (the one method whose message may be over LARGE_REQUEST_BYTES) may be
# having their message read, or wait with it read for their turn, at once (see _ReadGate): 32 MiB
# each at most.
READ_BATCHES = 4


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


def _parser(message_type: type[Message], limit: int, values_limit: int, data: bytes) -> Message:
    """The request in ``data``, parsed only once its caller is authenticated (on the executor, as
    HTTP parses its body): one over ``limit`` is PAYLOAD_TOO_LARGE (refused in the call, so counted as
    its outcome), bytes that are no such request are INVALID_ARGUMENT, and so is a field this API
    does not know, at any depth, as HTTP refuses an unknown JSON field (a field a client adds is
    never silently dropped, nor part of an idempotency key's request). Its payloads may hold
    ``values_limit`` JSON values together, counted before any is converted to JSON data."""
    if len(data) > limit:
        raise too_large(limit)
    try:
        message = message_type.FromString(data)
    except (DecodeError, ValueError, RecursionError):
        raise invalid(f"the request is not a {message_type.__name__}") from None
    size = message.ByteSize()
    message.DiscardUnknownFields()
    if message.ByteSize() != size:
        raise invalid(f"the request has fields a {message_type.__name__} does not have")
    count_values(message, message_type.DESCRIPTOR, values_limit)
    return message


async def _only_message(context: grpc.aio.ServicerContext[Any, Any], message_type: type[Message]) -> bytes:
    """The one message of a unary call (its client sends one and half-closes with it). Read from the
    context, not the request iterator: that one's generator would hold the message, suspended in a
    cycle with it, until the cyclic collector ran."""
    message = await context.read()
    if message is grpc.aio.EOF:
        raise invalid(f"the call carries no {message_type.__name__}")
    return cast(bytes, message)


class _ReadGate:
    """Room for the messages of the methods that may carry one over LARGE_REQUEST_BYTES (a batch
    create), taken before the message is read. grpcio tells how large a message is only once it has
    received it whole, and a large one waits for its turn (LargeRequests) after that: so a message
    keeps its room until its turn begins, or until it is read if it is not large. At most
    READ_BATCHES messages are held received while they wait; the others wait unread, what their
    callers sent held back by HTTP/2's flow-control windows. Twenty 26 MiB batches at once on one
    connection took the API to 556 MiB, forty to 601 MiB (1,257 and 1,861 MiB when each waiting
    message was held received). The wait for room and the wait for the turn share
    LARGE_REQUEST_WAIT_S. A small batch cannot be told from a large one before it is read, so it may
    wait for room behind them; no other method does."""

    def __init__(self, large: LargeRequests, room: int = READ_BATCHES) -> None:
        self._large = large
        self._room = asyncio.Semaphore(room)

    async def read(
        self, context: grpc.aio.ServicerContext[Any, Any], method_name: str, message_type: type[Message]
    ) -> tuple[bytes, bool]:
        """The call's message, and whether its turn among the large requests was taken for it (to be
        given back once it is answered)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        await take_within(self._room, method_name, LARGE_REQUEST_WAIT_S)
        try:
            request = await self._message(context, method_name, message_type)
            if len(request) <= LARGE_REQUEST_BYTES or len(request) > max_request_bytes(method_name):
                return request, False
            # A large one waits for its turn here, on the loop, holding no call thread.
            await self._large.take(method_name, LARGE_REQUEST_WAIT_S - (loop.time() - started))
            return request, True
        finally:
            self._room.release()

    @staticmethod
    async def _message(
        context: grpc.aio.ServicerContext[Any, Any], method_name: str, message_type: type[Message]
    ) -> bytes:
        """The message, which must come within LARGE_BODY_READ_S, as a large HTTP body must once its
        turn is taken: a caller that stalls holds its room, and the batches behind it, no longer."""
        try:
            async with asyncio.timeout(LARGE_BODY_READ_S):
                return await _only_message(context, message_type)
        except TimeoutError:
            REQUESTS.labels(method_name, Code.INVALID_ARGUMENT.value).inc()
            raise invalid(f"the request did not arrive within {LARGE_BODY_READ_S:.0f} s") from None


def _unary(
    api: SchedulerApi, executor: Executor, name: str, gate: _ReadGate, large: LargeRequests
) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext[Any, Any]], Awaitable[Message]]:
    """A unary method served as client-streaming, which the wire cannot tell apart: grpcio receives
    a unary method's message before its handler runs, while a client-streaming handler receives it
    only when it reads. So a caller the method refuses is answered from its metadata alone, before
    its message, and what it sent meanwhile waits in HTTP/2's flow-control windows, never received
    whole: 100 calls of 30 MiB without a token, each on a connection of its own, cost the API 6 MB
    (as unary handlers, 20 such calls took it from 101 MB to 1,045 MB)."""
    message_type = METHODS[name].request
    limit = max_request_bytes(name)

    async def answer(context: grpc.aio.ServicerContext[Any, Any]) -> Message:
        metadata = context.invocation_metadata() or ()

        def values(wanted: str) -> list[str]:
            return [str(value) for key, value in metadata if key == wanted]

        authorization = api.authorization_of(name, values("authorization"))
        loop = asyncio.get_running_loop()
        principal = await loop.run_in_executor(executor, api.admit, name, authorization)
        if limit > LARGE_REQUEST_BYTES:
            request, turn_taken = await gate.read(context, name, message_type)
        else:
            request, turn_taken = await _only_message(context, message_type), False
        parse = partial(_parser, message_type, limit, max_request_values(name), request)
        trace_context = caller_context(values(TRACEPARENT_HEADER), values(TRACESTATE_HEADER))
        call = partial(api.call, name, authorization, parse, len(request), principal, trace_context)
        try:
            return await loop.run_in_executor(executor, call)
        finally:
            if turn_taken:
                large.give_back()

    async def call(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> Message:
        try:
            return await answer(context)
        except ApiError as error:
            clear_frames(error)
            status = status_of(error)
        # Aborted outside the handler: the abort's exception, which the call's state keeps, would
        # hold the error, and this frame.
        await context.abort_with_status(status)

    return call


def build_server(
    api: SchedulerApi, executor: Executor, large: LargeRequests | None = None
) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_BATCH_REQUEST_BYTES),
            ("grpc.max_send_message_length", MAX_BATCH_REQUEST_BYTES),
            # gRPC's default (8 KiB, refused at random up to 16 KiB) would refuse a token the API
            # takes (up to MAX_TOKEN_BYTES, as over HTTP) with RESOURCE_EXHAUSTED, not UNAUTHENTICATED.
            ("grpc.max_metadata_size", MAX_METADATA_BYTES),
            ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
            # gRPC binds with SO_REUSEPORT by default: a second API given the same port would start
            # and take half the connections. A port is one process's, as the HTTP port is.
            ("grpc.so_reuseport", 0),
            # With BDP probing, gRPC opens each stream's flow-control window to 4 MiB and more
            # (twice the bandwidth-delay product it measures), so that a batch create waiting unread
            # for room (_ReadGate) was received all the same: twenty of 26 MiB held 918 MiB, forty
            # 1,482 MiB. Without it a stream holds 64 KiB until its message is read, and a message
            # being read still has its window opened a MiB at a time as it comes.
            ("grpc.http2.bdp_probe", 0),
        ]
    )
    turns = large or LargeRequests()
    gate = _ReadGate(turns)
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.stream_unary_rpc_method_handler(
            _unary(api, executor, name, gate, turns),
            # No deserializer: the bytes are parsed on the executor, once the caller is authenticated,
            # never on the event loop both transports share.
            response_serializer=lambda message: message.SerializeToString(),
        )
        for name in METHODS
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    reflection.enable_server_reflection(
        [SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    return server, checker
