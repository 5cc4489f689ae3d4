"""The API's errors: one code, one HTTP status and one gRPC status for each kind of refusal.

A client sees the code (a stable string), a one-line message and details; never a stack trace.
HTTP carries them in ``{"error": {"code", "message", "details", "timestamp"}}``; gRPC in the status
code and message, with the code string as the reason of a ``google.rpc.ErrorInfo`` in the status
details (and the details as its metadata).
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from enum import StrEnum

import grpc


class Code(StrEnum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # malformed: not JSON, a wrong type, an unknown field, a bad id
    INVALID_SCHEDULE = "INVALID_SCHEDULE"  # well-formed, but not a schedule that can be stored
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    NOT_FOUND = "NOT_FOUND"  # also for another app's objects, so that ids cannot be probed
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"  # HTTP only: a verb the path does not take
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"  # HTTP only: a body declared as other than JSON
    ALREADY_EXISTS = "ALREADY_EXISTS"  # a schedule key taken in its app
    VERSION_CONFLICT = "VERSION_CONFLICT"  # optimistic locking: the object changed since it was read
    FAILED_PRECONDITION = "FAILED_PRECONDITION"  # e.g. resuming a cancelled schedule
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"  # the same key with another request
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    RATE_LIMITED = "RATE_LIMITED"
    UNAVAILABLE = "UNAVAILABLE"  # PostgreSQL does not answer
    INTERNAL = "INTERNAL"


HTTP_STATUS: dict[Code, int] = {
    Code.INVALID_ARGUMENT: 400,
    Code.INVALID_SCHEDULE: 422,
    Code.UNAUTHENTICATED: 401,
    Code.PERMISSION_DENIED: 403,
    Code.NOT_FOUND: 404,
    Code.METHOD_NOT_ALLOWED: 405,
    Code.UNSUPPORTED_MEDIA_TYPE: 415,
    Code.ALREADY_EXISTS: 409,
    Code.VERSION_CONFLICT: 409,
    Code.FAILED_PRECONDITION: 409,
    Code.IDEMPOTENCY_KEY_REUSED: 409,
    Code.PAYLOAD_TOO_LARGE: 413,
    Code.RATE_LIMITED: 429,
    Code.UNAVAILABLE: 503,
    Code.INTERNAL: 500,
}

GRPC_STATUS: dict[Code, grpc.StatusCode] = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.INVALID_SCHEDULE: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Code.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.METHOD_NOT_ALLOWED: grpc.StatusCode.UNIMPLEMENTED,
    Code.UNSUPPORTED_MEDIA_TYPE: grpc.StatusCode.INVALID_ARGUMENT,  # never answered: gRPC has no media type
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.VERSION_CONFLICT: grpc.StatusCode.ABORTED,
    Code.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.IDEMPOTENCY_KEY_REUSED: grpc.StatusCode.ALREADY_EXISTS,
    Code.PAYLOAD_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Code.RATE_LIMITED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
}

Details = Mapping[str, str | int | float | bool]


class ApiError(Exception):
    """A refusal as the client sees it; ``message`` is one line and holds no secret or payload."""

    def __init__(self, code: Code, message: str, details: Details | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message.strip().splitlines()[0] if message.strip() else code.value
        self.details: dict[str, str | int | float | bool] = dict(details or {})

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    @property
    def grpc_status(self) -> grpc.StatusCode:
        return GRPC_STATUS[self.code]

    def __repr__(self) -> str:
        return f"ApiError({self.code.value}, {self.message!r})"


def not_found(what: str) -> ApiError:
    return ApiError(Code.NOT_FOUND, f"no {what}")


def invalid(message: str, **details: str | int | float | bool) -> ApiError:
    return ApiError(Code.INVALID_ARGUMENT, message, details)


def clear_frames(error: BaseException) -> None:
    """Drop what the frames ``error`` and the exceptions it arose from passed through hold (a
    request's body among it): some hold their exception, in a cycle with its traceback that only
    the cyclic collector would free (after refusing 60 bodies of 4 MiB three times, the API held
    680 MB; 260 MB once cleared, the rest glibc's). Both transports clear a refusal's frames."""
    cause: BaseException | None = error
    while cause is not None:
        traceback.clear_frames(cause.__traceback__)
        cause = cause.__context__
