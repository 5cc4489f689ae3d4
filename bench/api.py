"""The API under load: schedule creates through a real ``scheduler run api``, over HTTP/JSON and gRPC.

Single creates (``POST /v1/schedules`` and gRPC ``CreateSchedule``, a yearly cron each, every name
unique) are offered open-loop at each rate: request i is due at start + i / rate and is sent then,
whether or not the earlier ones have been answered, and its latency is counted from that due time.
A server that falls behind therefore shows in the percentiles instead of slowing the client down
(no coordinated omission). The first ``--warmup`` seconds of each rate are sent but not counted.

The load comes from client processes (``--clients``; by default one per 1,000 requests/s), each
offering its share of the rate at its own phase: over HTTP/1.1 keep-alive with ``--connections``
connections, on asyncio streams (:class:`StreamsSender`; ``--http-client httpx`` for
``httpx.AsyncClient``, whose own CPU cost, 1 to 4 ms a request here, makes it unable to offer
1,000 requests/s on this 2-core machine beside the server), or ``grpc.aio`` with ``--channels``
channels. A client that falls behind would hide the server's latency, so each one records how late
it sent every request (``send_lag``): when that grows, the figures are the client's, not the
server's. Client processes are spawned, not forked (grpc does not survive a fork).

Batch creates (``POST /v1/schedules:batchCreate`` and gRPC ``CreateSchedules``, 1,000 schedules a
request) are closed-loop: ``--batch-concurrency`` requests at a time for the same duration.

For every step also: the server's own time per call (its ``scheduler_api_request_duration_seconds``
histogram: from the call reaching the application service to its answer), and the CPU of the API
process, of the PostgreSQL backends serving it, of the clients and of the whole machine (psutil).
Before the steps, while the API is fresh: what one single create and one batch cost PostgreSQL,
from ``pg_stat_database`` and ``pg_stat_user_tables`` of the bench's own database.

The API runs as ``scheduler run api`` on a database and topic prefix of its own, with a generated
HS256 secret and the rate limits raised far beyond the load, so nothing here is refused for rate.

    python -m bench.api --rates 100,500,1000 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import multiprocessing
import secrets
import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import grpc
import httpx
import jwt
import psutil  # type: ignore[import-untyped]  # no stubs; only Process and cpu_percent are used
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import dict_row
from rich.table import Table

from bench.chaos_stack import free_port_range
from bench.common import (
    BENCH_APP,
    RESULTS,
    component_env,
    console,
    create_bench_app,
    isolated_settings,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    positive_ints,
    record,
    run_main,
    running,
    wait_until,
)
from scheduler.config import DEFAULT_RATE_LIMITS
from scheduler.v1 import scheduler_pb2 as pb
from scheduler.v1 import scheduler_pb2_grpc

TRANSPORTS = ("http", "grpc")
YEARLY = "0 0 1 1 *"  # never due during a run: the creates are all that is measured
HANDLER = "builtin:noop"
PER_CLIENT = 1000
"""Requests per second one client process is given by default."""
TARGETS_MS = {"p50": 10.0, "p95": 50.0, "p99": 200.0}
BATCH_TARGET_PER_S = 10_000
# An idle PostgreSQL backend reports its counters up to 10 s after its last transaction
# (PGSTAT_IDLE_INTERVAL), so the database's cost is read once every backend has been idle longer.
STATS_DELAY_S = 11.0
LOGS = RESULTS / "logs" / "api"


# --- what runs in each client process ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    http_url: str
    grpc_target: str
    tokens: tuple[str, ...]
    """Bearer tokens, one per principal; request i uses ``tokens[i % len(tokens)]``."""


@dataclass(frozen=True, slots=True)
class Load:
    """What one client process sends."""

    transport: str
    kind: str
    """``single`` (open-loop at ``rate``) or ``batch`` (closed-loop, ``concurrency`` at a time)."""
    rate: float
    concurrency: int
    batch_size: int
    connections: int
    channels: int
    warmup_s: float
    duration_s: float
    phase_s: float
    names: str
    """The prefix of this client's schedule names."""
    timeout_s: float
    http_client: str = "streams"


def single_body(name: str) -> dict[str, Any]:
    return {"app": BENCH_APP, "name": name, "cron_expression": YEARLY, "handler": HANDLER}


class StreamsSender:
    """HTTP/1.1 keep-alive on asyncio streams: ``connections`` connections, one request on each at a
    time. About 40 µs of client CPU a request where httpx.AsyncClient takes 1 to 4 ms (more with more
    connections), which at 1,000 requests/s would take more CPU than this machine has beside the
    server. It reads what the API answers: a status line, headers, a Content-Length body."""

    deadline_grace_s = 0.0

    def __init__(self, target: Target, load: Load) -> None:
        url = urlsplit(target.http_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.connections = load.connections
        self.idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
        self.head = [
            b"Host: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            % (url.netloc.encode(), token.encode())
            for token in target.tokens
        ]
        self.reconnecting: set[asyncio.Task[None]] = set()

    async def warm(self) -> None:
        for connection in await asyncio.gather(*(self._connect() for _ in range(self.connections))):
            self.idle.put_nowait(connection)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port)

    def batch(self, names: Sequence[str]) -> bytes:
        return json.dumps({"schedules": [single_body(name) for name in names]}).encode()

    async def create(self, i: int, name: str) -> str:
        return await self._post(i, b"/v1/schedules", json.dumps(single_body(name)).encode())

    async def create_batch(self, i: int, body: Any) -> str:
        return await self._post(i, b"/v1/schedules:batchCreate", body)

    async def _post(self, i: int, path: bytes, body: bytes) -> str:
        reader, writer = await self.idle.get()
        try:
            writer.write(
                b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s"
                % (path, self.head[i % len(self.head)], len(body), body)
            )
            await writer.drain()
            status, length, close = _response_head(await reader.readuntil(b"\r\n\r\n"))
            content = await reader.readexactly(length)
        except BaseException:
            # Cut off mid-answer (a timeout) or broken: this connection's next answer is unknown.
            writer.close()
            self._replace()
            raise
        if close:
            writer.close()
            self._replace()
        else:
            self.idle.put_nowait((reader, writer))
        if status == 200:
            return "OK"
        try:
            return f"{status} {json.loads(content)['error']['code']}"
        except (ValueError, KeyError, TypeError):
            return str(status)

    def _replace(self) -> None:
        task = asyncio.ensure_future(self._reconnect())
        self.reconnecting.add(task)
        task.add_done_callback(self.reconnecting.discard)

    async def _reconnect(self) -> None:
        with suppress(OSError):  # one connection fewer; the requests left wait for the others
            self.idle.put_nowait(await self._connect())

    async def close(self) -> None:
        while not self.idle.empty():
            _, writer = self.idle.get_nowait()
            writer.close()


def _response_head(head: bytes) -> tuple[int, int, bool]:
    """The status, the body's length and whether the server closes the connection after it."""
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, close = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            close = value.strip().lower() == b"close"
        elif name == b"transfer-encoding":
            raise ValueError("a chunked answer: this client reads Content-Length bodies only")
    return status, length, close


class HttpSender:
    deadline_grace_s = 0.0

    def __init__(self, target: Target, load: Load) -> None:
        self.client = httpx.AsyncClient(
            base_url=target.http_url,
            limits=httpx.Limits(max_connections=load.connections, max_keepalive_connections=load.connections),
            timeout=httpx.Timeout(load.timeout_s),
            trust_env=False,
        )
        self.connections = load.connections
        self.headers = [
            {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            for token in target.tokens
        ]

    async def warm(self) -> None:
        """Open every connection before the clock starts."""
        await asyncio.gather(*(self.client.get("/v1/health") for _ in range(self.connections)))

    def batch(self, names: Sequence[str]) -> bytes:
        return json.dumps({"schedules": [single_body(name) for name in names]}).encode()

    async def create(self, i: int, name: str) -> str:
        body = json.dumps(single_body(name)).encode()
        response = await self.client.post(
            "/v1/schedules", content=body, headers=self.headers[i % len(self.headers)]
        )
        return _http_code(response)

    async def create_batch(self, i: int, body: Any) -> str:
        response = await self.client.post(
            "/v1/schedules:batchCreate", content=body, headers=self.headers[i % len(self.headers)]
        )
        return _http_code(response)

    async def close(self) -> None:
        await self.client.aclose()


def _http_code(response: httpx.Response) -> str:
    if response.status_code == 200:
        return "OK"
    try:
        return f"{response.status_code} {response.json()['error']['code']}"
    except (ValueError, KeyError, TypeError):
        return str(response.status_code)


class GrpcSender:
    # The call's own deadline comes first: a cancelled grpc.aio call reports CANCELLED, not a timeout.
    deadline_grace_s = 2.0

    def __init__(self, target: Target, load: Load) -> None:
        # A local subchannel pool each: otherwise the channels share one connection.
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)]
        self.channels = [
            grpc.aio.insecure_channel(target.grpc_target, options=options) for _ in range(load.channels)
        ]
        # The generated stub is untyped; its calls take and return the proto's messages.
        self.stubs: list[Any] = [scheduler_pb2_grpc.SchedulerServiceStub(c) for c in self.channels]  # type: ignore[no-untyped-call]
        self.metadata = [(("authorization", f"Bearer {token}"),) for token in target.tokens]
        self.timeout_s = load.timeout_s

    async def warm(self) -> None:
        await asyncio.gather(*(channel.channel_ready() for channel in self.channels))

    def batch(self, names: Sequence[str]) -> pb.CreateSchedulesRequest:
        return pb.CreateSchedulesRequest(schedules=[_grpc_single(name) for name in names])

    async def create(self, i: int, name: str) -> str:
        return await self._call(i, "CreateSchedule", _grpc_single(name))

    async def create_batch(self, i: int, body: Any) -> str:
        return await self._call(i, "CreateSchedules", body)

    async def _call(self, i: int, method: str, request: Any) -> str:
        stub = self.stubs[i % len(self.stubs)]
        try:
            await getattr(stub, method)(
                request, metadata=self.metadata[i % len(self.metadata)], timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as error:
            return "timeout" if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED else str(error.code().name)
        return "OK"

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self.channels))


def _grpc_single(name: str) -> pb.CreateScheduleRequest:
    return pb.CreateScheduleRequest(app=BENCH_APP, name=name, cron_expression=YEARLY, handler=HANDLER)


Sender = StreamsSender | HttpSender | GrpcSender


class Clock:
    """Monotonic instants of this process as epoch seconds, so that client processes agree."""

    def __init__(self) -> None:
        self.offset = time.time() - time.monotonic()

    def monotonic_of(self, epoch: float) -> float:
        return epoch - self.offset

    def epoch_of(self, monotonic: float) -> float:
        return monotonic + self.offset


async def _attempt(send: Any, timeout_s: float) -> str:
    try:
        async with asyncio.timeout(timeout_s):
            code: str = await send
            return code
    except TimeoutError:
        return "timeout"
    except Exception as exc:  # a refused or broken connection is an error of this request only
        return type(exc).__name__


async def open_loop(sender: Sender, load: Load, start_at: float) -> dict[str, Any]:
    clock = Clock()
    interval = 1.0 / load.rate
    total = round((load.warmup_s + load.duration_s) * load.rate)
    counted_from = round(load.warmup_s * load.rate)
    origin = clock.monotonic_of(start_at) + load.phase_s
    latencies: list[float] = []
    send_lags: list[float] = []
    sends: list[float] = []
    errors: Counter[str] = Counter()
    error_latencies: list[float] = []
    last_done = 0.0

    async def one(i: int, due: float) -> None:
        nonlocal last_done
        began = time.monotonic()
        code = await _attempt(sender.create(i, f"{load.names}-{i}"), load.timeout_s + sender.deadline_grace_s)
        done = time.monotonic()
        if i < counted_from:
            return
        send_lags.append((began - due) * 1000)
        sends.append(began)
        if code == "OK":
            latencies.append((done - due) * 1000)
            last_done = max(last_done, done)
        else:
            errors[code] += 1
            error_latencies.append((done - due) * 1000)

    tasks = []
    i = 0
    while i < total:
        now = time.monotonic()
        while i < total and origin + i * interval <= now:
            tasks.append(asyncio.create_task(one(i, origin + i * interval)))
            i += 1
        if i < total:
            await asyncio.sleep(max(0.0, origin + i * interval - time.monotonic()))
    await asyncio.gather(*tasks)
    return {
        "latencies_ms": latencies,
        "error_latencies_ms": error_latencies,
        "send_lags_ms": send_lags,
        "errors": dict(errors),
        "first_send": clock.epoch_of(min(sends)) if sends else None,
        "last_send": clock.epoch_of(max(sends)) if sends else None,
        "last_done": clock.epoch_of(last_done) if last_done else None,
    }


async def closed_loop(sender: Sender, load: Load, start_at: float) -> dict[str, Any]:
    clock = Clock()
    origin = clock.monotonic_of(start_at)
    measure_from = origin + load.warmup_s
    end = measure_from + load.duration_s
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    created = 0
    last_done = 0.0
    await asyncio.sleep(max(0.0, origin - time.monotonic()))

    async def worker(w: int) -> None:
        nonlocal created, last_done
        for n in itertools.count():
            body = sender.batch([f"{load.names}-w{w}-{n}-{j}" for j in range(load.batch_size)])
            began = time.monotonic()
            if began >= end:
                return
            code = await _attempt(sender.create_batch(w, body), load.timeout_s + sender.deadline_grace_s)
            done = time.monotonic()
            if began < measure_from:
                continue
            if code == "OK":
                latencies.append((done - began) * 1000)
                created += load.batch_size
                last_done = max(last_done, done)
            else:
                errors[code] += 1

    await asyncio.gather(*(worker(w) for w in range(load.concurrency)))
    return {
        "latencies_ms": latencies,
        "errors": dict(errors),
        "created": created,
        "last_done": clock.epoch_of(last_done) if last_done else None,
    }


async def _drive(target: Target, load: Load, go: Any, out: Any) -> dict[str, Any]:
    sender: Sender
    if load.transport == "grpc":
        sender = GrpcSender(target, load)
    else:
        sender = StreamsSender(target, load) if load.http_client == "streams" else HttpSender(target, load)
    try:
        await sender.warm()
        out.put({"ready": True})
        start_at: float = go.get(timeout=300)
        cpu_before = time.process_time()
        run = open_loop if load.kind == "single" else closed_loop
        figures = await run(sender, load, start_at)
        return figures | {"cpu_s": time.process_time() - cpu_before}
    finally:
        await sender.close()


def client_process(target: Target, load: Load, go: Any, out: Any) -> None:
    """One client process (spawned: grpc does not survive a fork): ready, wait for the start, send."""
    try:
        out.put(asyncio.run(_drive(target, load, go, out)))
    except BaseException as exc:
        out.put({"failure": f"{type(exc).__name__}: {exc}"})


# --- the bench process: the API, the steps and their figures -------------------------------------


@dataclass(frozen=True, slots=True)
class Api:
    pid: int
    target: Target
    metrics_url: str
    database_url: str


def rate_limits_beyond_any_load() -> str:
    return ",".join(f"{name}=1000000/s" for name in DEFAULT_RATE_LIMITS)


def tokens(secret: str, principals: int) -> tuple[str, ...]:
    now = int(time.time())
    return tuple(
        jwt.encode(
            {"sub": f"bench-{n}", "iat": now, "exp": now + 6 * 3600, "roles": ["SCHEDULER_ADMIN"]},
            secret,
            algorithm="HS256",
        )
        for n in range(principals)
    )


@contextmanager
def api_process(principals: int, partitions: int, pool_size: int | None) -> Iterator[Api]:
    """``scheduler run api`` on a database and topic prefix of its own, with the bench app."""
    secret = secrets.token_urlsafe(48)
    with isolated_settings("api") as settings:
        create_bench_app(settings, partitions)
        base = free_port_range(3)
        http_port, grpc_port, metrics_port = base, base + 1, base + 2
        extra = {"SCHEDULER_JWT_SECRET": secret, "SCHEDULER_API_RATE_LIMITS": rate_limits_beyond_any_load()}
        if pool_size is not None:
            extra["SCHEDULER_API_POOL_SIZE"] = str(pool_size)
        command = [
            "api",
            "--port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--metrics-port",
            str(metrics_port),
        ]
        with running([command], component_env(settings, extra), LOGS) as procs:
            http_url = f"http://127.0.0.1:{http_port}"

            def serving() -> bool:
                if procs[0].poll() is not None:
                    raise RuntimeError(f"the API exited {procs[0].returncode}; its log is in {LOGS}")
                try:
                    return httpx.get(f"{http_url}/v1/health", timeout=2, trust_env=False).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(serving, 60, interval_s=0.1)
            yield Api(
                procs[0].pid,
                Target(http_url, f"127.0.0.1:{grpc_port}", tokens(secret, principals)),
                f"http://127.0.0.1:{metrics_port}/metrics",
                settings.database_url,
            )


def server_calls(api: Api) -> dict[str, tuple[float, float]]:
    """Per method, the calls the application service answered and the seconds they took in all."""
    text = httpx.get(api.metrics_url, timeout=10, trust_env=False).text
    calls: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "scheduler_api_request_duration_seconds":
            continue
        for sample in family.samples:
            method = sample.labels.get("method", "")
            count, total = calls.get(method, (0.0, 0.0))
            if sample.name.endswith("_count"):
                count = sample.value
            elif sample.name.endswith("_sum"):
                total = sample.value
            calls[method] = (count, total)
    return calls


def wait_quiet(api: Api, timeout_s: float = 180) -> None:
    """Until the API has finished no call for a second: a backlog an earlier step left is done."""
    seen: list[float] = []

    def quiet() -> bool:
        seen.append(sum(count for count, _ in server_calls(api).values()))
        return len(seen) > 1 and seen[-1] == seen[-2]

    wait_until(quiet, timeout_s, interval_s=1.0)


def server_mean_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], method: str
) -> float | None:
    count = after.get(method, (0.0, 0.0))[0] - before.get(method, (0.0, 0.0))[0]
    total = after.get(method, (0.0, 0.0))[1] - before.get(method, (0.0, 0.0))[1]
    return round(total / count * 1000, 2) if count else None


class CpuMeter:
    """CPU used during a step by the API process, by the PostgreSQL backends connected to its
    database (those that come and go during the step too) and by the whole machine."""

    def __init__(self, api: Api) -> None:
        self.api = psutil.Process(api.pid)
        self.database_url = api.database_url

    def _backends(self) -> dict[int, Any]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            rows = conn.execute(
                "select pid from pg_stat_activity "
                "where datname = current_database() and pid <> pg_backend_pid()"
            ).fetchall()
        found = {}
        for (pid,) in rows:
            with suppress(psutil.Error):
                proc = psutil.Process(pid)
                found[pid] = (proc, _cpu_s(proc))
        return found

    def start(self) -> None:
        self.started = time.monotonic()
        self.started_epoch = time.time()
        self.api_before = _cpu_s(self.api)
        self.backends_before = self._backends()
        psutil.cpu_percent(interval=None)

    def stop(self, clients_cpu_s: float) -> dict[str, float]:
        wall = time.monotonic() - self.started
        machine = psutil.cpu_percent(interval=None)
        api = _cpu_s(self.api) - self.api_before
        postgres = 0.0
        for pid, (proc, _) in self._backends().items():
            try:
                if pid in self.backends_before:
                    postgres += _cpu_s(proc) - self.backends_before[pid][1]
                elif proc.create_time() >= self.started_epoch:
                    postgres += _cpu_s(proc)
            except psutil.Error:
                pass
        return {
            "api": round(api / wall * 100, 1),
            "postgres": round(postgres / wall * 100, 1),
            "clients": round(clients_cpu_s / wall * 100, 1),
            "machine": round(machine, 1),
        }


def _cpu_s(proc: Any) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def drive(
    api: Api, loads: Sequence[Load]
) -> tuple[list[dict[str, Any]], float, dict[str, float], dict[str, Any]]:
    """Run ``loads`` (one client process each) from one common start; returns each client's
    figures, the start (epoch seconds), the CPU during the step and the server's calls."""
    # Before the clients connect: an idle keep-alive connection is closed by the server after 30 s.
    wait_quiet(api)
    context = multiprocessing.get_context("spawn")
    out, go = context.Queue(), context.Queue()
    procs = [
        context.Process(target=client_process, args=(api.target, load, go, out), daemon=True)
        for load in loads
    ]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            _no_failure(out.get(timeout=120))
        calls_before = server_calls(api)
        meter = CpuMeter(api)
        start_at = time.time() + 0.5
        for _ in procs:
            go.put(start_at)
        time.sleep(max(0.0, start_at - time.time()))
        meter.start()
        longest = max(load.warmup_s + load.duration_s for load in loads) + 2 * loads[0].timeout_s + 60
        results = [_no_failure(out.get(timeout=longest)) for _ in procs]
        cpu = meter.stop(sum(result["cpu_s"] for result in results))
        calls_after = server_calls(api)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return results, start_at, cpu, {"before": calls_before, "after": calls_after}


def _no_failure(message: dict[str, Any]) -> dict[str, Any]:
    if "failure" in message:
        raise RuntimeError(f"a client process failed: {message['failure']}")
    return message


def latency_figures(values_ms: Sequence[float]) -> dict[str, float]:
    if not values_ms:
        return {}
    ordered = sorted(values_ms)
    if len(ordered) == 1:
        return {f"{key}_ms": round(ordered[0], 1) for key in ("p50", "p95", "p99", "max")}
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {
        "p50_ms": round(q[49], 1),
        "p95_ms": round(q[94], 1),
        "p99_ms": round(q[98], 1),
        "max_ms": round(ordered[-1], 1),
    }


def _errors(results: Sequence[dict[str, Any]]) -> dict[str, int]:
    errors: Counter[str] = Counter()
    for result in results:
        errors.update(result["errors"])
    return dict(errors)


@dataclass(frozen=True, slots=True)
class Options:
    warmup_s: float = 2.0
    duration_s: float = 10.0
    clients: int | None = None
    """Client processes for single creates; None: one per ``PER_CLIENT`` requests/s."""
    connections: int = 64
    channels: int = 4
    http_client: str = "streams"
    """``streams`` (asyncio streams, see :class:`StreamsSender`) or ``httpx``."""
    batch_size: int = 1000
    batch_concurrency: int = 4
    timeout_s: float = 30.0


def measure_single(api: Api, transport: str, rate: int, options: Options) -> dict[str, Any]:
    clients = options.clients or max(1, math.ceil(rate / PER_CLIENT))
    loads = [
        Load(
            transport, "single", rate / clients, 1, 1, options.connections, options.channels,
            options.warmup_s, options.duration_s, n / rate, f"{transport}-{rate}-c{n}", options.timeout_s,
            options.http_client,
        )
        for n in range(clients)
    ]  # fmt: skip
    results, start_at, cpu, calls = drive(api, loads)
    latencies = [value for result in results for value in result["latencies_ms"]]
    lags = [value for result in results for value in result["send_lags_ms"]]
    errors = _errors(results)
    window_start = start_at + options.warmup_s
    last_done = max((r["last_done"] for r in results if r["last_done"]), default=None)
    first_send = min((r["first_send"] for r in results if r["first_send"]), default=None)
    last_send = max((r["last_send"] for r in results if r["last_send"]), default=None)
    sent = len(lags)
    return {
        "offered_per_s": rate,
        "sent": sent,
        "ok": len(latencies),
        "errors": errors,
        "achieved_per_s": round(len(latencies) / (last_done - window_start), 1) if last_done else 0.0,
        "sent_per_s": round((sent - 1) / (last_send - first_send), 1)
        if first_send and last_send and last_send > first_send
        else None,
        **latency_figures(latencies),
        "error_latency_ms": latency_figures([v for r in results for v in r["error_latencies_ms"]]),
        "send_lag_ms": latency_figures(lags),
        "server_mean_ms": server_mean_ms(calls["before"], calls["after"], "CreateSchedule"),
        "cpu_pct": cpu,
        "clients": clients,
    }


def measure_batch(api: Api, transport: str, options: Options) -> dict[str, Any]:
    load = Load(
        transport, "batch", 0.0, options.batch_concurrency, options.batch_size,
        max(options.batch_concurrency, 1), options.channels, options.warmup_s, options.duration_s, 0.0,
        f"{transport}-batch", options.timeout_s, options.http_client,
    )  # fmt: skip
    results, start_at, cpu, calls = drive(api, [load])
    (result,) = results
    window_start = start_at + options.warmup_s
    last_done = result["last_done"]
    return {
        "batch_size": options.batch_size,
        "concurrency": options.batch_concurrency,
        "batches": len(result["latencies_ms"]),
        "schedules": result["created"],
        "errors": result["errors"],
        "schedules_per_s": round(result["created"] / (last_done - window_start), 1) if last_done else 0.0,
        "batch_latency": latency_figures(result["latencies_ms"]),
        "server_mean_ms": server_mean_ms(calls["before"], calls["after"], "CreateSchedules"),
        "cpu_pct": cpu,
    }


# --- what a request costs PostgreSQL -----------------------------------------------------------


def database_counters(database_url: str) -> dict[str, Any]:
    # One transaction, rolled back: the read adds to xact_rollback (once, subtracted) never to xact_commit.
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        database = conn.execute(
            "select xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted "
            "from pg_stat_database where datname = current_database()"
        ).fetchone()
        tables = conn.execute(
            "select relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del from pg_stat_user_tables"
        ).fetchall()
        conn.rollback()
    return {"database": dict(database or {}), "tables": {row.pop("relname"): row for row in tables}}


def cost_per(before: dict[str, Any], after: dict[str, Any], requests: int) -> dict[str, Any]:
    database = {
        key: round(
            (after["database"][key] - before["database"][key] - (key == "xact_rollback")) / requests, 2
        )
        for key in after["database"]
    }
    tables: dict[str, dict[str, float]] = {}
    for name, counters in after["tables"].items():
        old = before["tables"].get(name, {})
        changed = {
            key.removeprefix("n_"): round((value - old.get(key, 0)) / requests, 2)
            for key, value in counters.items()
            if value != old.get(key, 0)
        }
        if changed:
            tables[name] = changed
    return database | {"tables": tables}


def database_cost(api: Api, singles: int, batches: int, batch_size: int) -> dict[str, Any]:
    """Single creates one after another, then batches, each read once PostgreSQL has counted it."""
    headers = {"Authorization": f"Bearer {api.target.tokens[0]}"}
    with httpx.Client(base_url=api.target.http_url, timeout=60, trust_env=False, headers=headers) as client:
        time.sleep(STATS_DELAY_S)
        before = database_counters(api.database_url)
        for i in range(singles):
            client.post("/v1/schedules", json=single_body(f"cost-single-{i}")).raise_for_status()
        time.sleep(STATS_DELAY_S)
        middle = database_counters(api.database_url)
        for b in range(batches):
            body = {"schedules": [single_body(f"cost-batch-{b}-{j}") for j in range(batch_size)]}
            client.post("/v1/schedules:batchCreate", json=body).raise_for_status()
        time.sleep(STATS_DELAY_S)
        after = database_counters(api.database_url)
    return {
        "single_creates": singles,
        "per_single_create": cost_per(before, middle, singles),
        "batches": batches,
        "batch_size": batch_size,
        "per_batch": cost_per(middle, after, batches),
    }


# --- the whole bench -------------------------------------------------------------------------------


def run_api(
    rates: Sequence[int],
    options: Options,
    transports: Sequence[str] = TRANSPORTS,
    principals: int = 1,
    partitions: int = 12,
    pool_size: int | None = None,
    cost: bool = True,
) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "targets": {f"{key}_ms": value for key, value in TARGETS_MS.items()}
        | {"batch_schedules_per_s": BATCH_TARGET_PER_S},
        "config": asdict(options)
        | {
            "principals": principals,
            "pool_size": pool_size or "default",
            "http_client": "httpx.AsyncClient, HTTP/1.1 keep-alive"
            if options.http_client == "httpx"
            else "HTTP/1.1 keep-alive on asyncio streams",
            "grpc_client": "grpc.aio, unary calls",
            "clients_rule": f"one client process per {PER_CLIENT} requests/s"
            if options.clients is None
            else f"{options.clients} client processes",
        },
        "single": {},
        "batch": {},
    }
    out = console()
    with api_process(principals, partitions, pool_size) as api:
        if cost:
            # First, while the API is fresh: nothing of the load steps is still to be counted.
            out.print(f"[dim]what a create costs PostgreSQL (about {3 * STATS_DELAY_S:.0f} s) ...[/]")
            figures["database_cost"] = database_cost(api, 200, 10, options.batch_size)
        for transport in transports:
            figures["single"][transport] = {}
            for rate in rates:
                out.print(f"[dim]single creates, {transport}, {rate:,}/s ...[/]")
                figures["single"][transport][str(rate)] = measure_single(api, transport, rate, options)
        for transport in transports:
            if options.batch_concurrency:
                out.print(f"[dim]batch creates, {transport} ...[/]")
                figures["batch"][transport] = measure_batch(api, transport, options)
    return figures


def _ms(figures: dict[str, Any], key: str) -> str:
    value = figures.get(key)
    return "-" if value is None else f"{value:,}"


def _errors_text(errors: dict[str, int]) -> str:
    return ", ".join(f"{code} {n}" for code, n in sorted(errors.items())) or "0"


def _cpu_text(cpu: dict[str, float]) -> str:
    return f"{cpu['api']:.0f} / {cpu['postgres']:.0f} / {cpu['clients']:.0f} / {cpu['machine']:.0f}"


def show(figures: dict[str, Any]) -> None:
    out = console()
    config = figures["config"]
    targets = figures["targets"]
    single = Table(
        "transport", "offered/s", "achieved/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "errors",
        "server ms", "send lag p99", "clients", "CPU % api/pg/clients/machine",
        title="single creates, open-loop (latency from each request's due time)",
    )  # fmt: skip
    single.add_row(
        "target", "", "", f"< {targets['p50_ms']:g}", f"< {targets['p95_ms']:g}", f"< {targets['p99_ms']:g}",
        "", "", "", "", "", "", style="dim",
    )  # fmt: skip
    for transport, by_rate in figures["single"].items():
        for rate, row in by_rate.items():
            single.add_row(
                transport, f"{int(rate):,}", f"{row['achieved_per_s']:,}", _ms(row, "p50_ms"),
                _ms(row, "p95_ms"), _ms(row, "p99_ms"), _ms(row, "max_ms"), _errors_text(row["errors"]),
                _ms(row, "server_mean_ms"), _ms(row["send_lag_ms"], "p99_ms"), str(row["clients"]),
                _cpu_text(row["cpu_pct"]),
            )  # fmt: skip
    single.caption = (
        f"{config['clients_rule']}; HTTP: {config['http_client']}, {config['connections']} connections "
        f"each; gRPC: {config['grpc_client']}, {config['channels']} channels each; "
        f"{config['principals']} principal(s); {config['warmup_s']:g} s warm-up + {config['duration_s']:g} s "
        "each. server ms: mean time in the application service; send lag: how late the client sent "
        "(large: the client, not the server, was behind); CPU: api, its PostgreSQL backends and the "
        "clients in % of one core, machine in % of all cores"
    )
    out.print(single)
    if figures["batch"]:
        batch = Table(
            "transport", "batch", "at once", "batches", "schedules/s", "p50 ms", "p99 ms", "errors",
            "server ms", "CPU % api/pg/clients/machine",
            title=f"batch creates, closed-loop (target {targets['batch_schedules_per_s']:,} schedules/s)",
        )  # fmt: skip
        for transport, row in figures["batch"].items():
            batch.add_row(
                transport, f"{row['batch_size']:,}", str(row["concurrency"]), str(row["batches"]),
                f"{row['schedules_per_s']:,}", _ms(row["batch_latency"], "p50_ms"),
                _ms(row["batch_latency"], "p99_ms"), _errors_text(row["errors"]), _ms(row, "server_mean_ms"),
                _cpu_text(row["cpu_pct"]),
            )  # fmt: skip
        out.print(batch)
    cost = figures.get("database_cost")
    if cost:
        table = Table(
            "request", "commits", "rows inserted", "rows updated", "rows deleted", "tables (ins/upd each)",
            title="what a request costs PostgreSQL (pg_stat_database of the bench's database)",
        )  # fmt: skip
        for label, key in (
            ("single create", "per_single_create"),
            (f"batch of {cost['batch_size']:,}", "per_batch"),
        ):
            row = cost[key]
            tables = "; ".join(
                f"{name} {c.get('tup_ins', 0):g}/{c.get('tup_upd', 0):g}"
                for name, c in sorted(row["tables"].items())
            )
            table.add_row(
                label, f"{row['xact_commit']:g}", f"{row['tup_inserted']:g}", f"{row['tup_updated']:g}",
                f"{row['tup_deleted']:g}", tables,
            )  # fmt: skip
        out.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    defaults = Options()
    parser.add_argument(
        "--rates", type=positive_ints, default=[100, 500, 1000], help="single creates per second"
    )
    parser.add_argument(
        "--duration", type=positive_float, default=defaults.duration_s, help="seconds measured per step"
    )
    parser.add_argument(
        "--warmup", type=non_negative_float, default=defaults.warmup_s, help="seconds sent first, not counted"
    )
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="http, grpc or both")
    parser.add_argument(
        "--clients", type=positive_int, help=f"client processes [one per {PER_CLIENT} requests/s]"
    )
    parser.add_argument(
        "--connections", type=positive_int, default=defaults.connections, help="HTTP connections per client"
    )
    parser.add_argument(
        "--http-client", choices=("streams", "httpx"), default=defaults.http_client, help="the HTTP client"
    )
    parser.add_argument(
        "--channels", type=positive_int, default=defaults.channels, help="gRPC channels per client"
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=defaults.batch_size, help="schedules per batch"
    )
    parser.add_argument(
        "--batch-concurrency",
        type=non_negative_int,
        default=defaults.batch_concurrency,
        help="batches at once (0 skips)",
    )
    parser.add_argument(
        "--timeout", type=positive_float, default=defaults.timeout_s, help="seconds before a request fails"
    )
    parser.add_argument(
        "--principals", type=positive_int, default=1, help="tokens of distinct subjects, used in turn"
    )
    parser.add_argument("--pool-size", type=positive_int, help="SCHEDULER_API_POOL_SIZE [the API's default]")
    parser.add_argument("--partitions", type=positive_int, default=12)
    parser.add_argument(
        "--cost", action=argparse.BooleanOptionalAction, default=True, help="what a create costs PostgreSQL"
    )
    args = parser.parse_args()
    options = replace(
        defaults,
        warmup_s=args.warmup,
        duration_s=args.duration,
        clients=args.clients,
        connections=args.connections,
        channels=args.channels,
        http_client=args.http_client,
        batch_size=args.batch_size,
        batch_concurrency=args.batch_concurrency,
        timeout_s=args.timeout,
    )
    transports = [name for name in args.transports.split(",") if name]
    if not transports or set(transports) - set(TRANSPORTS):
        parser.error(f"--transports {args.transports!r}: http, grpc or both, comma separated")
    figures = run_api(
        args.rates, options, transports, args.principals, args.partitions, args.pool_size, args.cost
    )
    show(figures)
    print(f"written to {record('api', figures)}")


if __name__ == "__main__":
    run_main(main)
