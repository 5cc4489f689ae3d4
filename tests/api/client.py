"""The API as a client sees it, through either transport, for the tests.

:class:`HttpCaller` and :class:`GrpcCaller` take the same call (an RPC's name and its request in
protobuf's JSON form) and return the same :class:`Outcome` (the response's JSON form, or the error's
code string), so a test can run one sequence of calls on both transports and compare.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import grpc
import httpx
import jwt
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from scheduler.api.routes import ROUTES, Route
from scheduler.api.service import METHODS
from scheduler.v1 import scheduler_pb2_grpc

SECRET = "tests-only-hs256-secret-of-at-least-32-bytes"
ADMIN = "SCHEDULER_ADMIN"
USER = "SCHEDULER_USER"
VIEWER = "SCHEDULER_VIEWER"
ROUTE_OF: dict[str, Route] = {route.method: route for route in ROUTES}


def token(
    subject: str = "alice",
    roles: tuple[str, ...] = (ADMIN,),
    apps: list[str] | None = None,
    secret: str = SECRET,
    ttl_s: float = 3600,
    **claims: Any,
) -> str:
    now = int(time.time())
    body: dict[str, Any] = {"sub": subject, "iat": now, "exp": now + int(ttl_s), "roles": list(roles)}
    if apps is not None:
        body["apps"] = apps
    return jwt.encode(body | claims, secret, algorithm="HS256")


@dataclass
class Outcome:
    code: str
    """OK, or the error's code string (the HTTP body's error.code, the gRPC ErrorInfo's reason)."""
    body: dict[str, Any] = field(default_factory=dict)
    """The response's JSON form, or the error body's ``error`` object (HTTP) / message (gRPC)."""
    http_status: int | None = None
    grpc_status: grpc.StatusCode | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.code == "OK"


class HttpCaller:
    name = "http"

    def __init__(self, base_url: str) -> None:
        # TCP_NODELAY: httpx writes a request's head and body apart, and without it Nagle's algorithm
        # holds the body until the server's delayed ACK, 40 ms a request.
        transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        self.client = httpx.Client(base_url=base_url, timeout=30, trust_env=False, transport=transport)

    def call(
        self, method: str, request: dict[str, Any], bearer: str | None, headers: dict[str, str] | None = None
    ) -> Outcome:
        route = ROUTE_OF[method]
        rest = dict(request)
        path = route.path
        for name in route.path_fields:
            path = path.replace("{" + name + "}", quote(str(rest.pop(name, "")), safe=""))
        params = {name: _query(rest.pop(name)) for name in route.query if name in rest}
        sent = dict(headers or {})
        if bearer is not None:
            sent["Authorization"] = f"Bearer {bearer}"
        response = self.client.request(
            route.verb, path, params=params, json=rest if route.body else None, headers=sent
        )
        data = response.json()
        if response.status_code == 200:
            return Outcome("OK", data, http_status=200, headers=dict(response.headers))
        return Outcome(
            data["error"]["code"],
            data["error"],
            http_status=response.status_code,
            headers=dict(response.headers),
        )

    def close(self) -> None:
        self.client.close()


def _query(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class GrpcCaller:
    name = "grpc"

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                # A batch's answer holds its payloads: as large as the request (gRPC's default is 4 MiB).
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ],
        )
        # The generated stub is untyped; each call's request and response are the proto's messages.
        self.stub: Any = scheduler_pb2_grpc.SchedulerServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def call(
        self, method: str, request: dict[str, Any], bearer: str | None, headers: dict[str, str] | None = None
    ) -> Outcome:
        spec = METHODS[method]
        message = json_format.ParseDict(request, spec.request())
        metadata = [] if bearer is None else [("authorization", f"Bearer {bearer}")]
        try:
            response = getattr(self.stub, method)(message, metadata=metadata, timeout=30)
        except grpc.RpcError as error:
            return grpc_error(error)
        return Outcome(
            "OK",
            json_format.MessageToDict(
                response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            ),
            grpc_status=grpc.StatusCode.OK,
        )

    def close(self) -> None:
        self.channel.close()


def grpc_error(error: grpc.RpcError) -> Outcome:
    status = rpc_status.from_call(error)
    reason, details = "", {}
    if status is not None:
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                reason, details = info.reason, dict(info.metadata)
    code: grpc.StatusCode = error.code()
    message: str = error.details() or ""
    return Outcome(reason or code.name, {"message": message, "details": details}, grpc_status=code)
