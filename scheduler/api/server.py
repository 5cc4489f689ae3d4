"""The API process's services: both transports on one event loop, and the retention sweep.

:class:`ApiServer` is a :class:`~scheduler.runtime.service.Service` like every component's: its
first step starts the HTTP/JSON server (uvicorn) and the gRPC server on an event loop of their
own thread and returns once both listen; later steps only check that the loop still runs. gRPC
health (the server's, ``""``, and ``scheduler.v1.SchedulerService``) follows what ``/v1/health``
answers, probed every :data:`HEALTH_EVERY_S`. On stop it drains: gRPC health turns NOT_SERVING, both
servers stop taking connections and finish the calls in flight within the grace period, and the
executor that runs calls is shut down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import psycopg_pool
import uvicorn
from grpc_health.v1 import health, health_pb2

from scheduler.api.grpc_server import SERVICE, build_server
from scheduler.api.http_server import HeadDeadlineProtocol, create_app
from scheduler.api.service import LargeRequests, SchedulerApi
from scheduler.runtime.service import Check, Service
from scheduler.store import api as store
from scheduler.store.database import Database, Session

log = logging.getLogger("scheduler.api")
START_TIMEOUT_S = 30.0
SWEEP_BATCH = 1000
SWEEP_EVERY_S = 60.0
# The longest rate-limit period is an hour: a bucket idle for longer is full again.
IDLE_BUCKET_S = 2 * 3600.0
# How often gRPC health probes PostgreSQL, on a connection of its own as /v1/health does: about how
# late it notices a change, and how often PostgreSQL sees a connection for it.
HEALTH_EVERY_S = 2.0


def listen(host: str, port: int) -> socket.socket:
    """The HTTP socket, bound before anything starts, so a taken port is one clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPv6's any-address takes IPv4 too, as deploy.md offers it beside 0.0.0.0: create_server sets
    # IPV6_V6ONLY unless told otherwise, and a pod addressed by IPv4 refused every probe and call.
    dualstack = host == "::" and socket.has_dualstack_ipv6()
    server = socket.create_server((host, port), family=family, backlog=1024, dualstack_ipv6=dualstack)
    # Every connection accepted from it sends at once (Linux hands the option on): asyncio sets
    # TCP_NODELAY only on a socket made with IPPROTO_TCP, which create_server's is not, so an
    # answer's second send waited for the client's delayed acknowledgement, about 40 ms a call
    # (GET /v1/health on a kept-alive connection 48 ms, 2.2 ms without the wait).
    server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return server


class ApiServer(Service):
    def __init__(
        self,
        api: SchedulerApi,
        pool: psycopg_pool.ConnectionPool[psycopg.Connection[dict[str, Any]]],
        http_socket: socket.socket,
        grpc_address: str,
        database: Database,
        workers: int,
        grace_s: float = 25.0,
    ) -> None:
        super().__init__("api")
        self.api = api
        self.pool = pool
        self.http_socket = http_socket
        self.grpc_address = grpc_address
        self.database = database
        self.grace_s = grace_s
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="api-call")
        self.http_port: int = http_socket.getsockname()[1]
        self.grpc_port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None

    def step(self) -> bool:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run_loop, name="api-loop", daemon=True)
            self._thread.start()
            if not self._started.wait(START_TIMEOUT_S) or self._failure is not None:
                raise RuntimeError(f"the API did not start: {self._failure or 'timed out'}")
            log.info("serving HTTP/JSON on port %d and gRPC on port %s", self.http_port, self.grpc_port)
        elif not self._thread.is_alive():
            raise RuntimeError(f"the API's event loop ended: {self._failure or 'stopped'}")
        return False

    def drain(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(self.grace_s + 5.0)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.pool.close()
        with contextlib.suppress(OSError):
            self.http_socket.close()

    def checks(self) -> Sequence[Check]:
        return [self.database.check()]

    def serving(self) -> bool:
        """/v1/health: not stopping, and PostgreSQL answers."""
        if self.status.stopping:
            return False
        try:
            self.database.check().probe()
        except Exception:
            return False
        return True

    async def _follow_readiness(self, checker: health.aio.HealthServicer, first: asyncio.Event) -> None:
        """Sets gRPC health, for the server and for the service, to what :meth:`serving` answers,
        every HEALTH_EVERY_S; ``first`` once it has. The probe runs on a thread of its own: one
        blocked on PostgreSQL holds neither the event loop nor a call thread. One that has not
        answered within the period counts as not serving, and no second one starts beside it."""
        loop = asyncio.get_running_loop()
        prober = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api-health")
        probe: asyncio.Future[bool] | None = None
        try:
            while True:
                started = loop.time()
                probe = probe or loop.run_in_executor(prober, self.serving)
                done, _ = await asyncio.wait({probe}, timeout=HEALTH_EVERY_S)
                serving = probe in done and probe.result()
                if probe in done:
                    probe = None
                status = (
                    health_pb2.HealthCheckResponse.SERVING
                    if serving
                    else health_pb2.HealthCheckResponse.NOT_SERVING
                )
                for service in ("", SERVICE):
                    await checker.set(service, status)
                first.set()
                await asyncio.sleep(started + HEALTH_EVERY_S - loop.time())
        finally:
            prober.shutdown(wait=False, cancel_futures=True)

    def _run_loop(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._failure = exc
            log.exception("the API's event loop failed")
        finally:
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        large = LargeRequests()  # one turn for both transports
        grpc_server, checker = build_server(self.api, self.executor, large)
        self.grpc_port = grpc_server.add_insecure_port(self.grpc_address)
        probed = asyncio.Event()
        readiness = asyncio.create_task(self._follow_readiness(checker, probed))
        await grpc_server.start()
        app = create_app(self.api, self.executor, self.serving, large)
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=int(self.grace_s),
            timeout_keep_alive=30,
            http=HeadDeadlineProtocol,
        )
        http = uvicorn.Server(config)
        http_task = asyncio.create_task(http.serve(sockets=[self.http_socket]))
        while not http.started and not http_task.done():
            await asyncio.sleep(0.01)
        if http_task.done():
            readiness.cancel()
            await grpc_server.stop(0)
            http_task.result()  # raises what stopped it
            raise RuntimeError("the HTTP server stopped while starting")
        await probed.wait()  # gRPC health says what /v1/health would from the start
        self._started.set()
        await self._stop.wait()
        readiness.cancel()
        await checker.enter_graceful_shutdown()
        http.should_exit = True
        await asyncio.gather(grpc_server.stop(self.grace_s), http_task)


class RetentionSweep(Service):
    """Deletes expired idempotency keys and idle rate-limit buckets, a bounded batch at a time.
    Every API replica runs one; they share the work harmlessly (each deletes what it finds)."""

    transient = (psycopg.OperationalError,)

    def __init__(self, database: Database, every_s: float = SWEEP_EVERY_S) -> None:
        super().__init__("retention-sweep")
        self.session = Session(database)
        self.every_s = every_s

    def checks(self) -> Sequence[Check]:
        # The API server probes PostgreSQL too (one probe for both): declared here as well, so that
        # a sweep waiting on a PostgreSQL that stopped answering is not judged wedged by /live.
        return (self.session.database.check(),)

    def step(self) -> bool:
        conn = self.session.conn
        with conn.transaction():
            keys = store.delete_expired_idempotency_keys(conn, SWEEP_BATCH)
            buckets = store.delete_idle_rate_buckets(conn, IDLE_BUCKET_S, SWEEP_BATCH)
        if keys or buckets:
            log.info(
                "retention sweep: %d idempotency keys expired, %d idle rate buckets dropped", keys, buckets
            )
        return keys == SWEEP_BATCH or buckets == SWEEP_BATCH

    def idle(self, stop: threading.Event) -> None:
        stop.wait(self.every_s)

    def reset(self) -> None:
        self.session.close()

    def close(self) -> None:
        self.session.close()
