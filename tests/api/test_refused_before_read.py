"""A caller the method refuses costs the API the head of its request, not its body: over HTTP it is
answered 401 or 403 before its body is read, over gRPC from its metadata before its message is
received, however much it sends. 180 such HTTP requests of 4 MiB took the API from 101 MB to 835 MB
when bodies were read first, and 20 such gRPC calls of 30 MiB to 1,045 MB. An admitted body that
stalls is answered within 20 s of its read beginning, and a message refused once received is not
kept.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from scheduler.api.grpc_server import SERVICE
from scheduler.api.http_server import BODY_READ_S, HEAD_READ_S
from scheduler.api.messages import MAX_REQUEST_BYTES
from scheduler.v1 import scheduler_pb2 as pb
from tests.api.client import VIEWER, Outcome, grpc_error, token
from tests.api.conftest import ApiProcess
from tests.support import wait_for

MIB = 1024 * 1024
# What a refused caller may cost the API, all of them together: far below what their bodies hold.
ALLOWANCE_BYTES = 64 * MIB
# Who the methods refuse: no token, a token signed with another key, a role that may not create.
REFUSED = {
    "no token": (None, 401, "UNAUTHENTICATED"),
    "another key": ("another-key", 401, "UNAUTHENTICATED"),
    "a viewer": ("viewer", 403, "PERMISSION_DENIED"),
}


def bearer_of(kind: str | None) -> str | None:
    if kind == "another-key":
        return token(secret="another-secret-that-is-also-32-bytes-long")
    if kind == "viewer":
        return token(subject="looker", roles=(VIEWER,))
    return None


def rss_bytes(api: ApiProcess) -> int:
    for line in Path(f"/proc/{api.component.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/<pid>/status")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]


def post_head(api: ApiProcess, path: str, declared: int, bearer: str | None) -> socket.socket:
    """A connection on which the head of ``POST path`` with a body of ``declared`` bytes was sent."""
    host, port = api.http_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    authorization = "" if bearer is None else f"Authorization: Bearer {bearer}\r\n"
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n{authorization}"
        f"Content-Length: {declared}\r\n\r\n".encode()
    )
    return sock


def send_body(sock: socket.socket, size: int) -> None:
    chunk = b" " * 65536
    while size > 0:
        sock.sendall(chunk[:size])
        size -= len(chunk)


def read_answer(sock: socket.socket, timeout_s: float) -> Answer:
    """The response on ``sock``; fails if none has come within ``timeout_s``."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            more = sock.recv(65536)
            assert more, f"the connection closed without an answer: {data[:200]!r}"
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {
            name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])
        }
        while len(body) < int(headers["content-length"]):
            body += sock.recv(65536)
    except TimeoutError:
        raise AssertionError(f"no answer within {timeout_s:g} s") from None
    return Answer(int(lines[0].split()[1]), headers, json.loads(body))


@pytest.mark.parametrize("who", REFUSED)
def test_an_http_caller_the_method_refuses_is_answered_before_its_body_is_sent(
    api: ApiProcess, who: str
) -> None:
    kind, status, code = REFUSED[who]
    with post_head(api, "/v1/schedules", MAX_REQUEST_BYTES - 100, bearer_of(kind)) as sock:
        sock.sendall(b'{"app": "alpha", ')  # and nothing more
        answer = read_answer(sock, 10)
    assert (answer.status, answer.body["error"]["code"]) == (status, code), answer
    assert set(answer.body["error"]) == {"code", "message", "details", "timestamp"}


def test_the_bodies_of_http_callers_refused_are_not_held(api: ApiProcess) -> None:
    """The reviewer's attack, smaller: each declares 4 MiB and sends all of it but the last byte."""
    declared = MAX_REQUEST_BYTES - 100
    before = rss_bytes(api)
    with ExitStack() as stack:
        sockets = [stack.enter_context(post_head(api, "/v1/schedules", declared, None)) for _ in range(60)]
        for sock in sockets:
            send_body(sock, declared - 1)
        time.sleep(1)  # for what was sent to reach the API
        grown = rss_bytes(api) - before
        assert grown < ALLOWANCE_BYTES, f"60 refused callers of 4 MiB took {grown / MIB:.0f} MB"
        answers = [read_answer(sock, 10) for sock in sockets]
    assert {(a.status, a.body["error"]["code"]) for a in answers} == {(401, "UNAUTHENTICATED")}


def test_an_admitted_body_that_stalls_is_answered_within_its_bound(api: ApiProcess) -> None:
    with post_head(api, "/v1/schedules", 1000, token(subject="stalls-small")) as sock:
        sock.sendall(b'{"app": "alpha", ')  # and nothing more
        started = time.monotonic()
        answer = read_answer(sock, BODY_READ_S + 15)
        waited = time.monotonic() - started
    assert (answer.status, answer.body["error"]["code"]) == (400, "INVALID_ARGUMENT"), answer
    assert f"did not arrive within {BODY_READ_S:.0f} s" in answer.body["error"]["message"]
    assert BODY_READ_S - 1 < waited < BODY_READ_S + 15


def wait_closed(sock: socket.socket, timeout_s: float) -> None:
    """Until the API closed ``sock``; fails if it is still open after ``timeout_s``."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        raise AssertionError(f"still open after {timeout_s:g} s") from None
    except ConnectionResetError:
        pass


def test_a_connection_whose_request_head_does_not_come_is_closed(api: ApiProcess) -> None:
    """A connection that sends nothing, and one that trickles its head a byte at a time, are closed
    HEAD_READ_S after they opened: idle sockets cannot pile up until the API runs out of them."""
    host, port = api.http_url.removeprefix("http://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=30) as silent,
        socket.create_connection((host, int(port)), timeout=30) as trickling,
    ):
        started = time.monotonic()
        waited: dict[str, float] = {}

        def watch_silent() -> None:
            wait_closed(silent, HEAD_READ_S + 30)
            waited["silent"] = time.monotonic() - started

        watcher = threading.Thread(target=watch_silent)
        watcher.start()
        trickling.sendall(b"GET /v1/schedules HTTP/1.1\r\nHost: api\r\nX-Slow: ")
        while time.monotonic() - started < HEAD_READ_S + 5:
            try:
                trickling.sendall(b"a")  # a byte a second: each keeps the connection busy, not alive
            except OSError:
                break
            time.sleep(1)
        wait_closed(trickling, 30)
        waited["trickling"] = time.monotonic() - started
        watcher.join()
    assert all(HEAD_READ_S - 1 < w < HEAD_READ_S + 15 for w in waited.values()), waited
    assert set(waited) == {"silent", "trickling"}
    answer = http_get_health(api)
    assert answer == 200, "the API still answers"


def http_get_health(api: ApiProcess) -> int:
    host, port = api.http_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n")
        return int(sock.recv(65536).split()[1])


def never_sent(until: threading.Event) -> Iterator[bytes]:
    """A client stream whose message does not come until ``until`` is set, and then ends."""
    until.wait(60)
    yield from ()


def grpc_call_without_its_message(api: ApiProcess, method: str, bearer: str | None) -> Outcome:
    """``method`` called with ``bearer`` and no request message yet: only its metadata was sent."""
    metadata = () if bearer is None else (("authorization", f"Bearer {bearer}"),)
    done = threading.Event()
    with grpc.insecure_channel(api.grpc_target) as channel:
        call: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(f"/{SERVICE}/{method}")
        try:
            call(never_sent(done), metadata=metadata, timeout=10)
        except grpc.RpcError as error:
            return grpc_error(error)
        finally:
            done.set()
    raise AssertionError(f"{method} answered without a request")


@pytest.mark.parametrize("who", REFUSED)
def test_a_grpc_caller_the_method_refuses_is_answered_from_its_metadata_alone(
    api: ApiProcess, who: str
) -> None:
    kind, _, code = REFUSED[who]
    outcome = grpc_call_without_its_message(api, "CreateSchedule", bearer_of(kind))
    assert outcome.code == code, outcome


def grpc_call(api: ApiProcess, method: str, message: bytes, bearer: str | None) -> Outcome:
    """``message`` sent as ``method``'s request on a connection of its own (so that one
    connection's flow-control window does not bound every call at once)."""
    options = [("grpc.max_send_message_length", 64 * MIB), ("grpc.use_local_subchannel_pool", 1)]
    metadata = () if bearer is None else (("authorization", f"Bearer {bearer}"),)
    with grpc.insecure_channel(api.grpc_target, options=options) as channel:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"/{SERVICE}/{method}")
        try:
            call(message, metadata=metadata, timeout=60)
        except grpc.RpcError as error:
            return grpc_error(error)
    return Outcome("OK")


def test_the_messages_of_grpc_callers_refused_are_not_received(api: ApiProcess) -> None:
    """The reviewer's attack, smaller: 10 calls at once of a 30 MiB message."""
    message = pb.GetScheduleRequest(id="x" * 30 * MIB).SerializeToString()
    before = rss_bytes(api)
    peak = [before]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.02):
            peak[0] = max(peak[0], rss_bytes(api))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(10) as pool:
            outcomes = list(pool.map(lambda _: grpc_call(api, "GetSchedule", message, None), range(10)))
    finally:
        sampling.set()
        sampler.join()
    grown = peak[0] - before
    assert grown < ALLOWANCE_BYTES, f"10 refused calls of 30 MiB took {grown / MIB:.0f} MB at the peak"
    assert {outcome.code for outcome in outcomes} == {"UNAUTHENTICATED"}, outcomes


def test_a_message_refused_once_received_is_not_kept(api: ApiProcess) -> None:
    """gRPC has one limit on a message for every method, the batch's (32 MiB), so an admitted
    caller's message over its own method's limit is received before it is refused; what it took
    goes when the call does (three rounds of 10 such calls kept 600 MB when it did not)."""
    message = pb.GetScheduleRequest(id="x" * 30 * MIB).SerializeToString()
    bearer = token(subject="too-large")
    before = rss_bytes(api)
    for _ in range(3):
        with ThreadPoolExecutor(10) as pool:
            outcomes = list(pool.map(lambda _: grpc_call(api, "GetSchedule", message, bearer), range(10)))
        assert {outcome.code for outcome in outcomes} == {"PAYLOAD_TOO_LARGE"}, outcomes
    kept = rss_bytes(api) - before
    assert kept < 4 * ALLOWANCE_BYTES, f"30 refused calls of 30 MiB left {kept / MIB:.0f} MB behind"


def invalid_creates(api: ApiProcess) -> float:
    """CreateSchedule calls answered INVALID_ARGUMENT so far, as the API's /metrics counts them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{api.metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(
        r'^scheduler_api_requests_total\{code="INVALID_ARGUMENT",method="CreateSchedule"\} (\S+)$', text, re.M
    )
    return 0.0 if found is None else float(found.group(1))


def test_a_caller_that_leaves_before_its_body_is_a_bad_request_not_an_error_of_the_apis(
    api: ApiProcess,
) -> None:
    """Its connection closed halfway through the body it declared: counted as a refused call, where
    the API logged an error with a traceback (the ASGI application's exception) and counted nothing."""
    before = invalid_creates(api)
    sock = post_head(api, "/v1/schedules", 1000, token(subject="leaver"))
    sock.sendall(b'{"app": "alpha", ')
    sock.close()
    wait_for(lambda: invalid_creates(api) > before, 30, "the call to be counted")
    log = api.component.output()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
