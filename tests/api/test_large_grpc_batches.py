"""Large gRPC batch creates sent at once hold the API's memory to a bound however many come, and the
API still answers its small calls meanwhile (docs/api.md, "Operating it").

Batches over 4 MiB are applied one at a time. Over gRPC each waiting batch was held received, whole,
while it waited for its turn, so the API's memory grew with its callers: twenty 26 MiB batches at
once took it to 1,257 MiB, forty to 1,861 MiB, past the 1280Mi its container has (OOMKilled).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.api.grpc_server import READ_BATCHES, SERVICE
from scheduler.api.service import LARGE_BODY_READ_S as BOUND_S
from scheduler.v1 import scheduler_pb2 as pb
from tests.api.client import GrpcCaller, Outcome, grpc_error, token
from tests.api.conftest import ApiStack
from tests.support import peak_rss

MIB = 1024 * 1024
BATCHES = 16
# What the API may take above its idle size with BATCHES large batches sent at once: one applied
# (about 320 MB for a 28 MiB batch) and a few received. Held whole while waiting, 16 took 994 MiB.
ALLOWANCE_BYTES = 640 * MIB
SCHEDULE = {"app": "alpha", "handler": "builtin:noop", "cron_expression": "0 6 * * *", "enabled": False}
METHOD = f"/{SERVICE}/CreateSchedules"
OPTIONS = [("grpc.max_send_message_length", 64 * MIB), ("grpc.max_receive_message_length", 64 * MIB)]


def large_batch(tag: str) -> bytes:
    """30 schedules with payloads of 900 KB: 26 MiB, under the 32 MiB a batch may be."""
    schedules = [SCHEDULE | {"name": f"{tag}-{i}", "payload": {"pad": "x" * 900_000}} for i in range(30)]
    return json_format.ParseDict({"schedules": schedules}, pb.CreateSchedulesRequest()).SerializeToString()


def send(channel: grpc.Channel, message: bytes, bearer: str) -> Outcome:
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
    try:
        call(message, metadata=(("authorization", f"Bearer {bearer}"),), timeout=120)
    except grpc.RpcError as error:
        return grpc_error(error)
    return Outcome("OK")


def test_large_grpc_batches_at_once_hold_the_apis_memory_and_small_calls_are_answered_meanwhile(
    api_stack: ApiStack,
) -> None:
    api = api_stack.start()  # of its own: its peak is this test's
    bearer = token(subject="loader")
    small = GrpcCaller(api.grpc_target)
    known = small.call("CreateSchedule", SCHEDULE | {"name": "known"}, bearer)
    assert known.ok, known
    batches = [large_batch(f"large-{n}") for n in range(BATCHES)]
    before = peak_rss(api.component)
    channel = grpc.insecure_channel(api.grpc_target, options=OPTIONS)  # one loader's burst
    health = health_pb2_grpc.HealthStub(small.channel)
    answered_meanwhile = False
    try:
        with ThreadPoolExecutor(BATCHES) as pool:
            sent: list[Future[Outcome]] = [pool.submit(send, channel, batch, bearer) for batch in batches]
            while not answered_meanwhile and not all(f.done() for f in sent):
                got = small.call("GetSchedule", {"id": known.body["id"]}, bearer)
                checked = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=30)
                answered = got.ok and checked.status == health_pb2.HealthCheckResponse.SERVING
                answered_meanwhile = answered and not all(f.done() for f in sent)
            # A small batch may wait for room behind the large ones (it cannot be told from them
            # before it is read), but is answered.
            few = small.call(
                "CreateSchedules", {"schedules": [SCHEDULE | {"name": f"few-{i}"} for i in range(10)]}, bearer
            )
            outcomes = [f.result() for f in sent]
        peak = peak_rss(api.component)
    finally:
        channel.close()
        small.close()
    assert [o.code for o in outcomes] == ["OK"] * BATCHES, [o.body for o in outcomes if not o.ok]
    assert few.ok and len(few.body["schedules"]) == 10, few
    assert answered_meanwhile, "no GetSchedule and health check was answered while the batches were sent"
    grown = peak - before
    assert grown < ALLOWANCE_BYTES, (
        f"{BATCHES} gRPC batches of 26 MiB at once took the API {grown / MIB:.0f} MiB above its idle "
        f"{before / MIB:.0f} MiB at its peak"
    )


def test_batch_creates_whose_messages_stall_are_refused_and_give_their_room_back(api_stack: ApiStack) -> None:
    """A batch create's message is read only once there is room for it, and must then come within
    20 s (as a large HTTP body must once its turn is taken): callers that take all the room and
    never send their message are answered INVALID_ARGUMENT, and give their room back."""
    api = api_stack.start()
    bearer = token(subject="staller")
    release = threading.Event()

    def never_sent() -> Iterator[bytes]:
        release.wait(BOUND_S + 40)
        yield from ()

    def stall(channel: grpc.Channel) -> Outcome:
        call: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(METHOD)
        try:
            call(
                never_sent(),
                metadata=(("authorization", f"Bearer {bearer}"),),
                timeout=BOUND_S + 30,
            )
        except grpc.RpcError as error:
            return grpc_error(error)
        return Outcome("OK")

    small = GrpcCaller(api.grpc_target)
    channels = [grpc.insecure_channel(api.grpc_target, options=OPTIONS) for _ in range(READ_BATCHES)]
    try:
        with ThreadPoolExecutor(len(channels)) as pool:
            stalled = list(pool.map(stall, channels))
            after = small.call("CreateSchedules", {"schedules": [SCHEDULE | {"name": "after-stall"}]}, bearer)
    finally:
        release.set()
        for channel in channels:
            channel.close()
        small.close()
    assert {o.code for o in stalled} == {"INVALID_ARGUMENT"}, stalled
    assert all(f"did not arrive within {BOUND_S:.0f} s" in o.body["message"] for o in stalled)
    assert after.ok, after
