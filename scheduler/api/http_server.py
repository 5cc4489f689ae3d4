"""The HTTP/JSON transport: FastAPI routes from the route table, each parsing its request into the
RPC's request message (path, query, ``Idempotency-Key`` header and JSON body, by protobuf's JSON
mapping) and answering the response message in the same mapping, or the error body.

The application service is synchronous (PostgreSQL through a pool): calls run on the executor
shared with the gRPC transport, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from opentelemetry.context import Context
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match
from starlette.routing import Route as PlainRoute
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from scheduler.api.auth import Principal
from scheduler.api.errors import ApiError, Code, clear_frames, invalid
from scheduler.api.messages import (
    MAX_PAGE,
    as_dict,
    check_times,
    count_values,
    max_request_bytes,
    max_request_values,
    too_large,
)
from scheduler.api.metrics import REQUESTS
from scheduler.api.openapi import document
from scheduler.api.routes import ROUTES, Route
from scheduler.api.service import (
    LARGE_BODY_READ_S,
    LARGE_REQUEST_BYTES,
    METHODS,
    LargeRequests,
    SchedulerApi,
)
from scheduler.telemetry.tracing import TRACEPARENT_HEADER, TRACESTATE_HEADER, caller_context

_INTEGER_RE = re.compile(r"-?[0-9]{1,12}")
# How long any body may take to arrive from the moment it is first read (a large one: from its turn,
# LARGE_BODY_READ_S): a sender that stalls holds what it sent, and a call, for no longer.
BODY_READ_S = 20.0
# How long a request's head may take, from the connection's opening or the request's first byte.
# uvicorn times out only the idle wait between requests: a connection that never sends a complete
# head (or trickles it a byte at a time) would otherwise hold its socket and memory for ever.
HEAD_READ_S = 20.0


class HeadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request head is not complete within
    HEAD_READ_S."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # the next request on a kept-alive connection
            self._await_head()

    def on_headers_complete(self) -> None:
        self._head_arrived()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._head_timer = self.loop.call_later(HEAD_READ_S, self._head_late)

    def _head_arrived(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            # The head of a request pipelined behind one still being answered: that answer must
            # not be cut off, so the next request's head gets its time once it is sent.
            self._await_head()
            return
        if not self.transport.is_closing():
            self.transport.close()


def error_response(error: ApiError) -> JSONResponse:
    body = {
        "error": {
            "code": error.code.value,
            "message": error.message,
            "details": error.details,
            "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        }
    }
    headers: dict[str, str] = {}
    if error.code == Code.RATE_LIMITED:
        headers["Retry-After"] = str(error.details.get("retry_after_seconds", 1))
    if error.code == Code.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = 'Bearer realm="scheduler"'
    return JSONResponse(body, status_code=error.http_status, headers=headers)


def parse_message(data: dict[str, Any], message_type: type[Message], values_limit: int) -> Message:
    """``data`` by protobuf's JSON mapping; one line naming the field as the client wrote it
    (``retry_config.max_attempts``, ``schedules[2].run_at``), never its value, otherwise. Its
    payloads may hold ``values_limit`` JSON values together, counted before they are converted."""
    check_times(data, message_type.DESCRIPTOR)
    count_values(data, message_type.DESCRIPTOR, values_limit)
    message = message_type()
    try:
        json_format.ParseDict(data, message)
    except (json_format.ParseError, ValueError, TypeError, RecursionError):
        found = _refused_field(data, message_type)
        if found is None:
            raise invalid("the request does not match the API's JSON form") from None
        where, unknown = found
        if unknown:
            raise invalid(f"unknown field {where[:120]!r}", field=where[:120]) from None
        raise invalid(f"field {where!r} has a value of the wrong type or form", field=where) from None
    return message


def _refused_field(data: Any, message_type: type[Message], path: str = "") -> tuple[str, bool] | None:
    """Where protobuf's parser refuses ``data``: the path of the first field it refuses, as the
    client wrote it, and whether it is unknown; None if ``data`` itself is not an object. Each
    field is parsed alone, so this costs a second parse, and only for a request refused."""
    if not isinstance(data, dict):
        return None
    descriptor = message_type.DESCRIPTOR
    for name, value in data.items():
        where = f"{path}{name}"
        field = descriptor.fields_by_name.get(name) or descriptor.fields_by_camelcase_name.get(name)
        if field is None:
            return where, True
        try:
            json_format.ParseDict({name: value}, message_type())
            continue
        except (json_format.ParseError, ValueError, TypeError, RecursionError):
            pass
        # Into the API's own messages only: a payload's keys are its values, never said.
        if field.message_type is None or not field.message_type.full_name.startswith("scheduler."):
            return where, False
        # protobuf's pure-Python and upb descriptors declare no common type.
        item_descriptor: Any = field.message_type
        item_type = message_factory.GetMessageClass(item_descriptor)
        if not field.is_repeated:
            return _refused_field(value, item_type, f"{where}.") or (where, False)
        if not isinstance(value, list):
            return where, False
        for index, item in enumerate(value):
            try:
                json_format.ParseDict(item, item_type())
            except (json_format.ParseError, ValueError, TypeError, RecursionError):
                return _refused_field(item, item_type, f"{where}[{index}].") or (f"{where}[{index}]", False)
        return where, False
    return None


def _query_value(field: Any, text: str) -> Any:
    """A query parameter's text as the JSON value of ``field`` (a FieldDescriptor)."""
    if field.type == FieldDescriptor.TYPE_INT32:
        # Digits only: Python's int() also reads "5_0", " 5 ", "+5" and other scripts' digits.
        if not _INTEGER_RE.fullmatch(text):
            raise invalid(f"query parameter {field.name!r} must be an integer", field=field.name)
        return int(text)
    if field.type == FieldDescriptor.TYPE_BOOL:
        if text.lower() not in ("true", "false", "1", "0"):
            raise invalid(f"query parameter {field.name!r} must be true or false", field=field.name)
        return text.lower() in ("true", "1")
    return text  # strings, and Timestamps in RFC 3339 (parsed with the message)


@dataclass(frozen=True, slots=True)
class _Received:
    """A request as it came, before any parsing: parsed on the executor, once authenticated."""

    body: bytes
    path: dict[str, str]
    query: dict[str, str]
    idempotency_key: str | None
    idempotency_keys: int
    """How many Idempotency-Key headers came: two are refused, once the caller is authenticated."""
    unexpected_query: tuple[str, ...] = ()
    """Query parameters the route does not take, or given more than once: refused, never dropped
    (a misspelt ``limt`` would otherwise answer a full page, a filter left out everything)."""
    content_type: str | None = None


class _LargeTurn:
    """A request's turn among those with a large body (a batch create): taken as its body grows past
    LARGE_REQUEST_BYTES, so that the others wait before reading on (TCP holds their senders) rather
    than pile up in memory; the rest of its body must then come within LARGE_BODY_READ_S. Its caller
    was admitted before any of its body was read: a refused one never waits for, nor holds, it."""

    def __init__(self, large: LargeRequests, method: str) -> None:
        self._large = large
        self.method = method
        self.taken = False

    async def take(self, deadline: asyncio.Timeout) -> None:
        if self.taken:
            return
        deadline.reschedule(None)  # the wait for the turn has its own bound (LARGE_REQUEST_WAIT_S)
        await self._large.take(self.method)
        self.taken = True
        deadline.reschedule(asyncio.get_running_loop().time() + LARGE_BODY_READ_S)

    def give_back(self) -> None:
        if self.taken:
            self.taken = False
            self._large.give_back()


def _has_body(request: Request) -> bool:
    """Whether a body follows the head: in HTTP/1.1 only with a length or a transfer coding."""
    return "transfer-encoding" in request.headers or request.headers.get("content-length", "0") != "0"


async def _read_body(request: Request, limit: int, turn: _LargeTurn) -> bytes:
    """The request's body, or a refusal counted as the call's outcome (as :meth:`SchedulerApi.call`
    counts those of the calls it answers): too large, too slow, or left behind by its caller."""
    try:
        return await _body(request, limit, turn)
    except ApiError as error:
        if error.code != Code.UNAVAILABLE:  # a wait for a large request's turn, counted as it ended
            REQUESTS.labels(turn.method, error.code.value).inc()
        raise


async def _body(request: Request, limit: int, turn: _LargeTurn) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        # Bounded as a whole, not per chunk: a sender that trickles a byte at a time would
        # otherwise hold its connection, and what it sent, for as long as it likes.
        async with asyncio.timeout(BODY_READ_S) as deadline:
            if declared is not None and declared.isdigit() and int(declared) > LARGE_REQUEST_BYTES:
                await turn.take(deadline)
            async for chunk in request.stream():  # counted as it comes: a chunked body declares no length
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                if size > LARGE_REQUEST_BYTES:
                    await turn.take(deadline)
                chunks.append(chunk)
    except TimeoutError:
        allowed = LARGE_BODY_READ_S if turn.taken else BODY_READ_S
        raise invalid(f"the request body did not arrive within {allowed:.0f} s") from None
    except ClientDisconnect:
        # The client went before its body did: answered (to no one) and counted as a bad request,
        # rather than an error of the API's with a traceback.
        raise invalid("the client closed the connection before the request body arrived") from None
    return b"".join(chunks)


async def _receive(route: Route, request: Request, turn: _LargeTurn) -> _Received:
    counts = Counter(name for name, _ in request.query_params.multi_items())
    return _Received(
        # Read for every route: a body sent to one that takes none (a DELETE's version) is refused.
        body=await _read_body(request, max_request_bytes(route.method), turn),
        path={name: request.path_params[name] for name in route.path_fields},
        query={name: request.query_params[name] for name in route.query if name in request.query_params},
        idempotency_key=request.headers.get("idempotency-key"),
        idempotency_keys=len(request.headers.getlist("idempotency-key")),
        unexpected_query=tuple(name for name, n in counts.items() if name not in route.query or n > 1),
        content_type=request.headers.get("content-type"),
    )


def _json_declared(content_type: str | None) -> bool:
    """Whether a body declared as ``content_type`` may be read as JSON: application/json or a
    ``+json`` type, in UTF-8 (RFC 8259) if a charset is said. A body with no Content-Type is read
    as JSON: some clients send none, and what it holds is then checked as JSON anyway."""
    if content_type is None:
        return True
    media, *parameters = content_type.split(";")
    media = media.strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        return False
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


def _request_message(route: Route, received: _Received) -> Message:
    """The RPC's request from what came: the JSON body, the path, the query and the header."""
    method = METHODS[route.method]
    fields = method.request.DESCRIPTOR.fields_by_name
    data: dict[str, Any] = {}
    if received.unexpected_query:
        name = received.unexpected_query[0][:80]
        if name in route.query:
            raise invalid(f"query parameter {name!r} is given more than once", field=name)
        takes = f"it takes {', '.join(route.query)}" if route.query else "it takes none"
        raise invalid(f"{route.verb} {route.path} has no query parameter {name!r} ({takes})", field=name)
    if received.idempotency_key is not None and "idempotency_key" not in fields:
        # Refused, not ignored: a client that sends one expects a retry to be answered, not done again.
        raise invalid(f"{route.verb} {route.path} takes no Idempotency-Key header", header="Idempotency-Key")
    if received.idempotency_keys > 1:
        raise invalid("the Idempotency-Key header is given more than once", header="Idempotency-Key")
    if received.body.strip() and not route.body:
        where = f"; {', '.join(route.query)} go in the query" if route.query else ""
        raise invalid(f"{route.verb} {route.path} takes no body{where}")
    if received.body.strip() and not _json_declared(received.content_type):
        # Refused rather than read as JSON whatever it says: a form (curl -d without --json) or
        # a body in another charset was not meant as this request, and would be misread.
        shown = (received.content_type or "")[:80]
        raise ApiError(
            Code.UNSUPPORTED_MEDIA_TYPE,
            f"{route.verb} {route.path} takes a JSON body (Content-Type: application/json), not {shown!r}",
        )
    if received.body.strip():
        try:
            data = json.loads(received.body, object_pairs_hook=_object_of_unique_keys)
        except RecursionError:
            raise invalid("the request body is nested too deeply") from None
        except _RepeatedKey:
            # Which key is not said: it may be a payload's, and payloads never reach an error text.
            raise invalid("an object in the request body has a key twice") from None
        except ValueError as exc:
            # Valid JSON that Python refuses to read: an integer of more than 4,300 digits.
            too_long = "digits" in str(exc) and not isinstance(exc, json.JSONDecodeError)
            shown = (
                "a number in the request body has too many digits"
                if too_long
                else "the request body is not JSON"
            )
            raise invalid(shown) from None
        if not isinstance(data, dict):
            raise invalid("the request body must be a JSON object")
    for name in route.path_fields + route.query:
        if name in data:
            where = "path" if name in route.path_fields else "query"
            raise invalid(f"{name} is given in the {where}, not in the body", field=name)
    data |= received.path
    for name, text in received.query.items():
        data[name] = _query_value(fields[name], text)
        if name == "limit" and data[name] == 0:  # in the message, 0 would mean "not given": the default
            shown = f"limit must be 1 to {MAX_PAGE}, got 0 (leave it out for the default)"
            raise invalid(shown, field="limit")
    key = received.idempotency_key
    if key is not None:
        if data.get("idempotency_key", key) != key:
            raise invalid("the Idempotency-Key header and the body's idempotency_key differ")
        data["idempotency_key"] = key
    return parse_message(data, method.request, max_request_values(route.method))


class _RepeatedKey(ValueError):
    pass


def _object_of_unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused when a key is in it twice: Python would keep the last value, and a
    proxy or a firewall in front that keeps the first would judge another request than the API
    serves (RFC 8259 leaves the meaning of such an object open)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _RepeatedKey
    return found


def _endpoint(
    api: SchedulerApi, executor: Executor, route: Route, large: LargeRequests
) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        loop = asyncio.get_running_loop()
        turn = _LargeTurn(large, route.method)
        principal: Principal | None = None
        try:
            authorization = api.authorization_of(route.method, request.headers.getlist("authorization"))
            if _has_body(request):
                # Before any of the body is read: uvicorn stops reading one the application has not
                # asked for once it holds 64 KiB of it, so a caller who may not call the method
                # costs about 0.1 MB however large a body it sends (180 of 4 MiB: 20 MB, against
                # 730 MB when they were read first). A request without a body is checked once, by
                # the call.
                principal = await loop.run_in_executor(executor, api.admit, route.method, authorization)
            received = await _receive(route, request, turn)
            trace_context = caller_context(
                request.headers.getlist(TRACEPARENT_HEADER), request.headers.getlist(TRACESTATE_HEADER)
            )
            # Parsing, the call and the answer's JSON run in one job on the executor, never on the loop
            # both transports share.
            answer = partial(_answer, api, route, authorization, received, principal, trace_context)
            body = await loop.run_in_executor(executor, answer)
        except ApiError as error:
            clear_frames(error)
            return error_response(error)
        finally:
            turn.give_back()
        return Response(body, media_type="application/json")

    endpoint.__name__ = route.method
    return endpoint


def _answer(
    api: SchedulerApi,
    route: Route,
    authorization: str | None,
    received: _Received,
    admitted: Principal | None,
    trace_context: Context | None,
) -> bytes:
    parse = partial(_request_message, route, received)
    response = api.call(route.method, authorization, parse, len(received.body), admitted, trace_context)
    return json.dumps(as_dict(response), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


class _Segment(Convertor[str]):
    regex = "[^/:]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("segment", _Segment())


def _allowed_methods(app: FastAPI, request: Request) -> str:
    """The methods of every route whose path matches the request's. Starlette names those of the
    first matching route only, and a path has a route per method here."""
    matching = (
        route
        for route in app.router.routes  # FastAPI's routes, and its /openapi.json and /docs
        if isinstance(route, PlainRoute) and route.matches(request.scope)[0] == Match.PARTIAL
    )
    return ", ".join(sorted({method for route in matching for method in route.methods or ()}))


def create_app(
    api: SchedulerApi, executor: Executor, serving: Callable[[], bool], large: LargeRequests | None = None
) -> FastAPI:
    """The ASGI application; ``serving()`` answers /v1/health (it may block: it runs on a thread of
    its own, not on ``executor``)."""
    app = FastAPI(
        title="scheduler.v1.SchedulerService",
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
        # /v1/schedules/ is no route: a 404 in the error body, not a redirect built from the Host header.
        redirect_slashes=False,
    )
    spec = document()
    app.openapi = lambda: spec  # type: ignore[method-assign]
    large = large or LargeRequests()
    for route in ROUTES:
        # A path parameter is one segment up to a colon: /v1/schedules/{id}:pause is never
        # /v1/schedules/{id} with an id ending in ":pause", whatever the method.
        path = route.path.replace("}", ":segment}")
        # HEAD answers as GET does, without the body (RFC 9110 9.3.2): uvicorn drops it.
        verbs = [route.verb, "HEAD"] if route.verb == "GET" else [route.verb]
        endpoint = _endpoint(api, executor, route, large)
        app.add_api_route(path, endpoint, methods=verbs, include_in_schema=False)

    async def health(request: Request) -> Response:
        # Not on the calls' executor: a probe must not wait behind calls queued for the database.
        ok = await asyncio.to_thread(serving)
        return JSONResponse({"status": "SERVING" if ok else "NOT_SERVING"}, status_code=200 if ok else 503)

    app.add_api_route("/v1/health", health, methods=["GET", "HEAD"], include_in_schema=False)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            allowed = _allowed_methods(app, request) or (exc.headers or {}).get("Allow", "")
            answer = error_response(
                ApiError(
                    Code.METHOD_NOT_ALLOWED,
                    f"no {request.method[:20]} on {request.url.path[:200]} (it takes {allowed or 'none'})",
                )
            )
            if allowed:
                answer.headers["Allow"] = allowed
            return answer
        return error_response(ApiError(Code.NOT_FOUND, f"no such path {request.url.path[:200]}"))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        return error_response(ApiError(Code.INTERNAL, "internal error; the server's log has the details"))

    return app
