"""A real OTLP/HTTP trace receiver for tests: what a collector would get from a component.

It serves ``POST /v1/traces`` (``application/x-protobuf``, gzip or deflate when the request says
so) on 127.0.0.1 at an ephemeral port, decodes each ``ExportTraceServiceRequest`` and keeps its
spans as plain dicts. Point a process at it with ``OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint``.
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypedDict

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

TRACES_PATH = "/v1/traces"
_PROTOBUF = "application/x-protobuf"
# Index = the OTLP enum's number (SPAN_KIND_INTERNAL = 1 …), name = opentelemetry.trace.SpanKind's.
_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
_STATUS = ("unset", "ok", "error")


class ReceivedEvent(TypedDict):
    name: str
    attributes: dict[str, Any]


class ReceivedSpan(TypedDict):
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    name: str
    kind: str  # internal, server, client, producer, consumer
    attributes: dict[str, Any]
    events: list[ReceivedEvent]
    links: list[tuple[str, str]]  # (trace_id, span_id)
    status: str  # unset, ok, error
    status_message: str
    service_name: str
    resource: dict[str, Any]
    scope: str
    start_ns: int
    end_ns: int


SpansPredicate = Callable[[list["ReceivedSpan"]], bool]


class Receiver:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._spans: list[ReceivedSpan] = []
        self._requests = 0
        self._encodings: list[str] = []
        self._changed = threading.Condition()

    def spans(self) -> list[ReceivedSpan]:
        with self._changed:
            return list(self._spans)

    @property
    def requests(self) -> int:
        """Export requests received, including any that failed to decode."""
        with self._changed:
            return self._requests

    @property
    def content_encodings(self) -> list[str]:
        """The ``Content-Encoding`` of each accepted export request ("" for none)."""
        with self._changed:
            return list(self._encodings)

    def wait_for(self, predicate: SpansPredicate, timeout_s: float = 10.0) -> list[ReceivedSpan]:
        """The spans once ``predicate`` holds for them; ``AssertionError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not predicate(list(self._spans)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    names = [(span["service_name"], span["name"]) for span in self._spans]
                    raise AssertionError(f"no matching spans after {timeout_s}s; received {names}")
                self._changed.wait(remaining)
            return list(self._spans)

    def _count_request(self) -> None:
        with self._changed:
            self._requests += 1
            self._changed.notify_all()

    def _add(self, spans: list[ReceivedSpan], encoding: str) -> None:
        with self._changed:
            self._spans.extend(spans)
            self._encodings.append(encoding)
            self._changed.notify_all()


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver_ref: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            receiver = receiver_ref[0]
            receiver._count_request()
            if self.path.rstrip("/") != TRACES_PATH:
                self._answer(404, b"", "text/plain")
                return
            if self.headers.get("Content-Type", "").split(";")[0].strip() != _PROTOBUF:
                self._answer(415, b"only application/x-protobuf", "text/plain")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                request = ExportTraceServiceRequest.FromString(_decompress(body, self.headers))
            except Exception as error:  # a malformed body is the client's fault: answer 400
                self._answer(400, str(error).encode(), "text/plain")
                return
            receiver._add(decode_spans(request), self.headers.get("Content-Encoding") or "")
            self._answer(200, ExportTraceServiceResponse().SerializeToString(), _PROTOBUF)

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test's output is for the test

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver_ref.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver_ref[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def decode_spans(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=_KINDS[span.kind] if span.kind < len(_KINDS) else str(span.kind),
                        attributes=_attributes(span.attributes),
                        events=[
                            ReceivedEvent(name=event.name, attributes=_attributes(event.attributes))
                            for event in span.events
                        ],
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        status=_STATUS[span.status.code] if span.status.code < len(_STATUS) else "",
                        status_message=span.status.message,
                        service_name=str(resource.get("service.name", "")),
                        resource=resource,
                        scope=scope_spans.scope.name,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


def _decompress(body: bytes, headers: Message) -> bytes:
    encoding = (headers.get("Content-Encoding") or "").strip().lower()
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    return body


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)
