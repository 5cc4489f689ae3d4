"""The health and metrics endpoints (``scheduler.runtime.health``) over real HTTP on an ephemeral port.

The services are fakes whose :class:`ServiceStatus` the tests set directly, and whose checks probe
nothing real: a :class:`FakeProbe` answers or raises as the test says and counts its calls.
"""

from __future__ import annotations

import http.client
import http.server
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

import scheduler
from scheduler.runtime import health as health_module
from scheduler.runtime.health import Health, HealthServer
from scheduler.runtime.service import Check, Service
from tests.support import wait_for


class FakeProbe:
    """A dependency probe: raises ``error`` when set, otherwise answers ``detail``."""

    def __init__(self, detail: str | None = "ok", delay_s: float = 0.0) -> None:
        self.detail = detail
        self.error: Exception | None = None
        self.delay_s = delay_s  # a simulated round trip, not a wait for a condition
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> str | None:
        with self._lock:
            self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return self.detail


class FakeService(Service):
    def __init__(self, name: str, checks: Sequence[Check] = ()) -> None:
        super().__init__(name)
        self._checks = list(checks)

    def step(self) -> bool:
        raise AssertionError("the health tests never run a service")

    def checks(self) -> Sequence[Check]:
        return self._checks


def started(service: FakeService) -> FakeService:
    service.status.succeeded()
    return service


class Serve(Protocol):
    def __call__(
        self,
        services: Sequence[Service],
        registry: CollectorRegistry | None = None,
        live_timeout_s: float | None = None,
    ) -> httpx.Client: ...


@pytest.fixture(scope="module")
def closing() -> Iterator[list[threading.Thread]]:
    """Servers close in the background and the module waits for them all at its end: a close
    waits out the serving loop's half-second poll, which would otherwise add up test by test."""
    closers: list[threading.Thread] = []
    yield closers
    for closer in closers:
        closer.join(5)
    assert not any(closer.is_alive() for closer in closers), "a health server did not close"


@pytest.fixture
def serve(closing: list[threading.Thread]) -> Iterator[Serve]:
    """``serve(services, registry=None, live_timeout_s=None)``: a running server and a client to it."""
    servers: list[HealthServer] = []
    clients: list[httpx.Client] = []

    def factory(
        services: Sequence[Service],
        registry: CollectorRegistry | None = None,
        live_timeout_s: float | None = None,
    ) -> httpx.Client:
        health = (
            Health("testcomp", services, registry or CollectorRegistry())
            if live_timeout_s is None
            else Health("testcomp", services, registry or CollectorRegistry(), live_timeout_s=live_timeout_s)
        )
        server = HealthServer(health, 0, "127.0.0.1")
        server.start()
        servers.append(server)
        assert server.port > 0
        client = httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=5.0)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.close()
    for server in servers:
        closer = threading.Thread(target=server.close, daemon=True)
        closer.start()
        closing.append(closer)


@pytest.fixture
def no_probe_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request probes afresh, for tests that change a dependency between requests."""
    monkeypatch.setattr(health_module, "PROBE_CACHE_S", 0.0)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    wait_for(condition, timeout, what, interval_s=0.005)


# /live --------------------------------------------------------------------------------------------


def test_live_while_the_loop_turns_and_not_once_it_is_wedged(serve: Serve) -> None:
    service = FakeService("scan")
    client = serve([service])

    response = client.get("/live")
    assert response.status_code == 200
    assert response.json() == {"status": "live"}

    service.status.last_turn = time.monotonic() - 10 * health_module.LIVE_TIMEOUT_S
    response = client.get("/live")
    assert response.status_code == 503
    assert response.json() == {"status": "not live"}

    service.status.turned()
    assert client.get("/live").status_code == 200


def test_live_needs_every_loop_turning(serve: Serve) -> None:
    turning, wedged = FakeService("relay"), FakeService("sweeper")
    client = serve([turning, wedged])
    wedged.status.last_turn = time.monotonic() - 10 * health_module.LIVE_TIMEOUT_S
    assert client.get("/live").status_code == 503


def test_a_wedged_inner_loop_is_not_live_though_the_service_turns(serve: Serve) -> None:
    """A service's own second loop (the worker's job loop) counts: the step loop turning is not
    enough for /live, and /health shows the loop down with how long it has not turned."""
    inner_stalled_s = 0.0

    class TwoLoops(FakeService):
        def seconds_since_turn(self) -> float:
            return max(super().seconds_since_turn(), inner_stalled_s)

    service = started(TwoLoops("worker"))
    client = serve([service])
    assert client.get("/live").status_code == 200

    inner_stalled_s = 10 * health_module.LIVE_TIMEOUT_S
    service.status.turned()
    assert client.get("/live").status_code == 503
    loop = client.get("/health").json()["components"]["loop:worker"]
    assert loop["status"] == "down"
    assert loop["latency_ms"] >= inner_stalled_s * 1000

    inner_stalled_s = 0.0
    assert client.get("/live").status_code == 200


def test_live_fails_when_no_turn_within_a_tiny_timeout(serve: Serve) -> None:
    service = FakeService("scan")
    client = serve([service], live_timeout_s=0.05)
    service.status.turned()
    wait_until(lambda: client.get("/live").status_code == 503, what="/live to fail")
    service.status.turned()
    assert client.get("/live").status_code == 200


def test_live_does_not_probe_the_dependencies(serve: Serve) -> None:
    probe = FakeProbe()
    probe.error = ConnectionError("down")
    client = serve([FakeService("scan", [Check("postgres", probe)])])
    assert client.get("/live").status_code == 200  # a dependency outage is not a wedged loop
    assert probe.calls == 0


def test_a_loop_waiting_on_a_dependency_that_stalls_steps_is_live_while_it_does_not_answer(
    serve: Serve, no_probe_cache: None
) -> None:
    """A PostgreSQL that stopped answering holds the step's statement: the loop does not turn, but
    it waits on the outage, which a restart cannot cure. Once PostgreSQL answers, a loop that still
    does not turn is wedged."""
    postgres = FakeProbe()
    service = started(FakeService("scan", [Check("postgresql", postgres, stalls_steps=True)]))
    client = serve([service])
    postgres.error = ConnectionError("timeout expired")
    service.status.last_turn = time.monotonic() - 10 * health_module.LIVE_TIMEOUT_S

    assert client.get("/live").status_code == 200
    assert client.get("/ready").status_code == 503
    loop = client.get("/health").json()["components"]["loop:scan"]
    assert (loop["status"], loop["waiting_on"]) == ("down", "postgresql")

    postgres.error = None
    assert client.get("/live").status_code == 503
    assert "waiting_on" not in client.get("/health").json()["components"]["loop:scan"]


def test_a_wedged_loop_is_not_live_though_a_dependency_that_cannot_stall_it_is_down(
    serve: Serve, no_probe_cache: None
) -> None:
    """Only a dependency that stalls steps excuses a loop that does not turn: Kafka's client bounds
    its own calls, and another service's PostgreSQL is not this loop's."""
    kafka, postgres = FakeProbe(), FakeProbe()
    kafka.error = postgres.error = ConnectionError("down")
    worker = started(FakeService("worker", [Check("kafka", kafka)]))
    scanner = started(FakeService("scan", [Check("postgresql", postgres, stalls_steps=True)]))
    client = serve([worker, scanner])
    worker.status.last_turn = time.monotonic() - 10 * health_module.LIVE_TIMEOUT_S
    assert client.get("/live").status_code == 503


def test_a_failing_loop_that_keeps_retrying_is_still_live(serve: Serve) -> None:
    service = FakeService("scan")
    client = serve([service], live_timeout_s=0.2)
    service.status.last_turn = time.monotonic() - 1.0
    assert client.get("/live").status_code == 503
    service.status.failed(ConnectionError("pg down"))  # a retry turns the loop
    assert client.get("/live").status_code == 200


# /startup -----------------------------------------------------------------------------------------


def test_startup_after_the_first_step_even_a_failed_one(serve: Serve) -> None:
    """A first step that failed on a dependency's outage is a process that started and waits the
    outage out, unready: a startup probe must not kill it for the outage."""
    service = FakeService("scan")
    client = serve([service])

    response = client.get("/startup")
    assert response.status_code == 503
    assert response.json() == {"status": "not started"}

    service.status.failed(ConnectionError("still down"))
    response = client.get("/startup")
    assert response.status_code == 200
    assert response.json() == {"status": "started"}
    assert client.get("/ready").status_code == 503

    service.status.succeeded()
    assert client.get("/startup").status_code == 200
    assert client.get("/ready").status_code == 200


def test_startup_needs_every_service(serve: Serve) -> None:
    first, second = started(FakeService("relay")), FakeService("sweeper")
    client = serve([first, second])
    assert client.get("/startup").status_code == 503
    second.status.succeeded()
    assert client.get("/startup").status_code == 200


# /ready -------------------------------------------------------------------------------------------


def test_ready_follows_the_dependencies(serve: Serve, no_probe_cache: None) -> None:
    postgres, kafka = FakeProbe("pg 17"), FakeProbe()
    service = started(FakeService("relay", [Check("postgres", postgres), Check("kafka", kafka)]))
    client = serve([service])

    assert client.get("/ready").status_code == 200

    kafka.error = ConnectionError("broker unreachable\nsecond line")
    response = client.get("/ready")
    assert response.status_code == 503
    components = response.json()["components"]
    assert components["kafka"]["status"] == "down"
    assert components["kafka"]["detail"] == "ConnectionError: broker unreachable"
    assert components["postgres"] == {"status": "up", "latency_ms": components["postgres"]["latency_ms"],
                                      "detail": "pg 17"}  # fmt: skip

    kafka.error = None
    assert client.get("/ready").status_code == 200


def test_not_ready_before_the_first_step(serve: Serve) -> None:
    client = serve([FakeService("scan", [Check("postgres", FakeProbe())])])
    assert client.get("/ready").status_code == 503


def test_not_ready_once_stopping_even_with_every_dependency_up(serve: Serve) -> None:
    service = started(FakeService("scan", [Check("postgres", FakeProbe())]))
    client = serve([service])
    assert client.get("/ready").status_code == 200
    service.status.stopping = True
    response = client.get("/ready")
    assert response.status_code == 503
    assert response.json()["components"]["loop:scan"]["stopping"] is True


def test_ready_with_no_dependencies_is_just_started(serve: Serve) -> None:
    service = FakeService("scan")
    client = serve([service])
    assert client.get("/ready").status_code == 503
    service.status.succeeded()
    assert client.get("/ready").status_code == 200


# /health ------------------------------------------------------------------------------------------


def test_health_document_shape(serve: Serve) -> None:
    postgres = FakeProbe("PostgreSQL 17.2")
    service = started(FakeService("scan", [Check("postgres", postgres)]))
    client = serve([service])

    before = datetime.now(UTC)
    response = client.get("/health")
    after = datetime.now(UTC)

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    assert {"status", "timestamp", "components", "uptime_seconds", "version"} <= document.keys()
    assert document["status"] == "healthy"
    assert document["version"] == scheduler.__version__

    timestamp = datetime.fromisoformat(document["timestamp"])
    assert timestamp.utcoffset() == timedelta(0)  # an explicit offset, not a naive time
    assert before - timedelta(seconds=1) <= timestamp <= after + timedelta(seconds=1)

    assert isinstance(document["uptime_seconds"], int | float)
    assert document["uptime_seconds"] >= 0

    components = document["components"]
    assert components["postgres"]["status"] == "up"
    assert components["postgres"]["detail"] == "PostgreSQL 17.2"
    for name, entry in components.items():
        assert entry["status"] in {"up", "down"}, name
        assert isinstance(entry["latency_ms"], int | float), name
        assert entry["latency_ms"] >= 0, name
    loop = components["loop:scan"]
    assert loop["status"] == "up"
    assert loop["started"] is True
    assert loop["stopping"] is False
    assert loop["consecutive_failures"] == 0


def test_health_latency_reflects_the_probe_round_trip(serve: Serve) -> None:
    service = started(FakeService("scan", [Check("postgres", FakeProbe(delay_s=0.05))]))
    document = serve([service]).get("/health").json()
    assert document["components"]["postgres"]["latency_ms"] >= 50


def test_health_uptime_grows(serve: Serve) -> None:
    client = serve([started(FakeService("scan"))])
    first = client.get("/health").json()["uptime_seconds"]
    wait_until(lambda: client.get("/health").json()["uptime_seconds"] > first, what="uptime to grow")


def test_health_is_503_and_unhealthy_when_a_dependency_is_down(serve: Serve) -> None:
    probe = FakeProbe()
    probe.error = TimeoutError("no answer within 2 s")
    service = started(FakeService("scan", [Check("postgres", probe)]))
    response = serve([service]).get("/health")
    assert response.status_code == 503
    document = response.json()
    assert document["status"] == "unhealthy"
    assert document["components"]["postgres"]["status"] == "down"
    assert document["components"]["postgres"]["detail"] == "TimeoutError: no answer within 2 s"
    assert document["components"]["postgres"]["latency_ms"] >= 0


def test_health_is_unhealthy_when_a_loop_is_wedged(serve: Serve) -> None:
    service = started(FakeService("scan"))
    client = serve([service])
    service.status.last_turn = time.monotonic() - 10 * health_module.LIVE_TIMEOUT_S
    response = client.get("/health")
    assert response.status_code == 503
    assert response.json()["status"] == "unhealthy"
    assert response.json()["components"]["loop:scan"]["status"] == "down"


def test_health_is_unhealthy_before_startup_and_reports_the_last_error(serve: Serve) -> None:
    service = FakeService("scan")
    service.status.failed(ConnectionError("connection refused"))
    response = serve([service]).get("/health")
    assert response.status_code == 503
    loop = response.json()["components"]["loop:scan"]
    assert loop["status"] == "down"
    assert loop["started"] is False
    assert loop["consecutive_failures"] == 1
    assert loop["last_error"] == "ConnectionError: connection refused"


def test_health_is_unhealthy_while_stopping(serve: Serve) -> None:
    service = started(FakeService("scan"))
    service.status.stopping = True
    response = serve([service]).get("/health")
    assert response.status_code == 503
    assert response.json()["status"] == "unhealthy"


def test_a_dependency_shared_by_services_is_probed_once(serve: Serve) -> None:
    shared = FakeProbe()
    other = FakeProbe()
    services = [
        started(FakeService("relay", [Check("postgres", shared)])),
        started(FakeService("sweeper", [Check("postgres", other), Check("kafka", FakeProbe())])),
    ]
    document = serve(services).get("/health").json()
    assert sorted(document["components"]) == ["kafka", "loop:relay", "loop:sweeper", "postgres"]
    assert shared.calls == 1
    assert other.calls == 0


# Routing ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/nope", "/livez", "/live/extra", "/health.json", "/metrics/x"])
def test_unknown_paths_are_404(serve: Serve, path: str) -> None:
    response = serve([started(FakeService("scan"))]).get(path)
    assert response.status_code == 404
    assert "error" in response.json()


@pytest.mark.parametrize("path", ["/live/", "/live?verbose=1", "/live/?x=y"])
def test_a_trailing_slash_or_a_query_is_the_same_endpoint(serve: Serve, path: str) -> None:
    assert serve([FakeService("scan")]).get(path).status_code == 200


def test_head_answers_the_status_without_a_body(serve: Serve) -> None:
    service = FakeService("scan")
    client = serve([service])
    response = client.head("/startup")
    assert response.status_code == 503
    assert response.content == b""
    service.status.succeeded()
    assert client.head("/startup").status_code == 200


# /metrics -----------------------------------------------------------------------------------------


def test_metrics_serves_only_the_given_registry(serve: Serve) -> None:
    mine, theirs = CollectorRegistry(), CollectorRegistry()
    Counter("health_test_mine_total", "In the served registry", registry=mine).inc(3)
    Counter("health_test_theirs_total", "In another registry", registry=theirs).inc()

    response = serve([FakeService("scan")], registry=mine).get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    body = response.text
    assert "health_test_mine_total 3.0" in body
    assert "health_test_theirs_total" not in body
    # Nor the process-wide default registry (process_*, python_gc_* collectors).
    assert "python_gc_objects_collected_total" not in body
    assert "process_" not in body


def test_metrics_are_read_at_request_time(serve: Serve) -> None:
    registry = CollectorRegistry()
    counter = Counter("health_test_live_total", "Incremented between requests", registry=registry)
    client = serve([FakeService("scan")], registry=registry)
    assert "health_test_live_total 0.0" in client.get("/metrics").text
    counter.inc(2)
    assert "health_test_live_total 2.0" in client.get("/metrics").text


def test_metrics_say_what_ready_says_while_the_endpoint_itself_answers(
    serve: Serve, no_probe_cache: None
) -> None:
    """Prometheus's `up` is 1 for a process cut off from PostgreSQL (its /metrics answers), so an
    alert on `up` alone never saw a whole stage that could not work."""
    database, kafka = FakeProbe(), FakeProbe()
    service = started(FakeService("scan", [Check("postgresql", database), Check("kafka", kafka)]))
    client = serve([service])
    body = client.get("/metrics").text
    assert "scheduler_ready 1.0" in body
    assert 'scheduler_dependency_up{dependency="postgresql"} 1.0' in body
    assert 'scheduler_dependency_up{dependency="kafka"} 1.0' in body
    database.error = ConnectionError("connection refused")
    assert client.get("/ready").status_code == 503
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert "scheduler_ready 0.0" in metrics.text
    assert 'scheduler_dependency_up{dependency="postgresql"} 0.0' in metrics.text
    assert 'scheduler_dependency_up{dependency="kafka"} 1.0' in metrics.text
    database.error = None
    service.status.stopping = True
    assert "scheduler_ready 0.0" in client.get("/metrics").text


def test_a_scrape_is_never_held_by_a_hung_probe(
    serve: Serve, no_probe_cache: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung dependency must not hold /metrics: a scrape that times out blanks every metric of
    the target. Whether the hung probe is another request's or the scrape's own, the scrape waits
    PROBE_UNDER_WAY_S and then says the dependency down."""
    monkeypatch.setattr(health_module, "PROBE_UNDER_WAY_S", 0.2)
    hang: dict[str, threading.Event | None] = {"gate": None}
    entered = threading.Event()

    def probe() -> str | None:
        gate = hang["gate"]
        if gate is not None:
            entered.set()
            gate.wait(30)
        return "ok"

    def hung_from_now() -> threading.Event:
        entered.clear()
        gate = threading.Event()
        hang["gate"] = gate
        return gate

    def released(gate: threading.Event) -> None:
        hang["gate"] = None
        gate.set()
        wait_until(lambda: "scheduler_ready 1.0" in client.get("/metrics").text, what="ready again")

    client = serve([started(FakeService("scan", [Check("postgresql", probe)]))])
    assert "scheduler_ready 1.0" in client.get("/metrics").text
    # The scrape's own probe hangs.
    gate = hung_from_now()
    try:
        body = client.get("/metrics").text
        assert entered.is_set()
        assert "scheduler_ready 0.0" in body
        assert 'scheduler_dependency_up{dependency="postgresql"} 0.0' in body
    finally:
        released(gate)
    # Another request's probe hangs: /ready started it, and it is hung before the scrape comes.
    gate = hung_from_now()
    waiting = threading.Thread(target=lambda: client.get("/ready", timeout=60), daemon=True)
    try:
        waiting.start()
        assert entered.wait(10), "the /ready request's probe started"
        entered.clear()
        assert "scheduler_ready 0.0" in client.get("/metrics").text
        assert not entered.is_set(), "the scrape waited on the hung probe rather than starting its own"
    finally:
        released(gate)
    waiting.join(10)
    assert not waiting.is_alive()


# Probe cache --------------------------------------------------------------------------------------


def test_a_burst_of_requests_probes_each_dependency_once(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long cache so that a slow machine cannot spread the burst over two cache periods.
    monkeypatch.setattr(health_module, "PROBE_CACHE_S", 30.0)
    probe = FakeProbe(delay_s=0.05)  # slow enough that the concurrent requests overlap it
    client = serve([started(FakeService("scan", [Check("postgres", probe)]))])
    # Concurrent requests on a cold cache: no more than the listen backlog (see the test below).
    concurrent = 5
    barrier = threading.Barrier(concurrent)
    codes: list[int] = []
    lock = threading.Lock()

    def request(path: str) -> None:
        connection = _connected(client)
        try:
            barrier.wait()
            connection.request("GET", path)
            code = connection.getresponse().status
        finally:
            connection.close()
        with lock:
            codes.append(code)

    threads = [
        threading.Thread(target=request, args=("/ready" if i % 2 else "/health",)) for i in range(concurrent)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    for i in range(20):  # and a stream of them after
        codes.append(client.get("/ready" if i % 2 else "/health").status_code)

    assert codes == [200] * (concurrent + 20)
    assert probe.calls == 1


def _connected(client: httpx.Client) -> http.client.HTTPConnection:
    port = client.base_url.port
    assert port is not None
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10.0)


def test_a_burst_of_concurrent_probes_all_answer_within_a_second(serve: Serve) -> None:
    client = serve([FakeService("scan")])
    port = client.base_url.port
    assert port is not None
    burst = 24
    barrier = threading.Barrier(burst)
    took: list[float] = []
    lock = threading.Lock()

    def probe() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10.0)
        barrier.wait()
        started = time.monotonic()
        connection.connect()
        connection.request("GET", "/live")
        connection.getresponse().read()
        connection.close()
        with lock:
            took.append(time.monotonic() - started)

    threads = [threading.Thread(target=probe) for _ in range(burst)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert len(took) == burst
    assert max(took) < 0.9, sorted(round(t, 3) for t in took)


def test_probe_results_expire_after_about_a_second(serve: Serve) -> None:
    probe = FakeProbe()
    client = serve([started(FakeService("scan", [Check("postgres", probe)]))])
    first = time.monotonic()
    client.get("/ready")
    client.get("/health")
    client.get("/ready")
    assert probe.calls == 1

    wait_until(lambda: client.get("/ready") is not None and probe.calls == 2, what="a fresh probe")
    elapsed = time.monotonic() - first
    assert 0.9 <= elapsed < 3.0, elapsed


def test_a_cached_outage_clears_once_the_cache_expires(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_module, "PROBE_CACHE_S", 0.2)
    probe = FakeProbe()
    probe.error = ConnectionError("down")
    client = serve([started(FakeService("scan", [Check("postgres", probe)]))])
    assert client.get("/ready").status_code == 503
    probe.error = None
    wait_until(lambda: client.get("/ready").status_code == 200, what="ready after recovery")


def test_a_probe_that_raises_any_exception_is_down_not_a_500(serve: Serve, no_probe_cache: None) -> None:
    probe = FakeProbe()
    probe.error = KeyError("missing")
    response = serve([started(FakeService("scan", [Check("kafka", probe)]))]).get("/health")
    assert response.status_code == 503
    assert response.json()["components"]["kafka"]["detail"] == "KeyError: 'missing'"


# The server ---------------------------------------------------------------------------------------


def test_the_port_is_bound_at_construction_and_freed_by_close() -> None:
    server = HealthServer(Health("testcomp", [], CollectorRegistry()), 0, "127.0.0.1")
    port = server.port
    server.start()
    with httpx.Client(timeout=5.0) as client:
        assert client.get(f"http://127.0.0.1:{port}/live").status_code == 200
    server.close()
    with httpx.Client(timeout=1.0) as client, pytest.raises(httpx.ConnectError):
        client.get(f"http://127.0.0.1:{port}/live")


def test_close_without_start_returns() -> None:
    server = HealthServer(Health("testcomp", [], CollectorRegistry()), 0, "127.0.0.1")
    closer = threading.Thread(target=server.close, daemon=True)
    closer.start()
    closer.join(0.5)
    assert not closer.is_alive()


def test_a_probe_that_hung_up_before_its_answer_is_no_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, no_probe_cache: None
) -> None:
    """A kubelet's probe gives up after its timeout (a check waiting on a stalled PostgreSQL) and
    closes its end: the late answer's broken pipe is no traceback on stderr; other errors still are."""
    stalled = threading.Event()
    answered = threading.Event()

    def stalled_postgres() -> str:
        stalled.wait(5)
        return "pg 18"

    done = health_module._Server.shutdown_request

    def shutdown_request(server: health_module._Server, request: Any) -> None:
        done(server, request)
        answered.set()

    monkeypatch.setattr(health_module._Server, "shutdown_request", shutdown_request)
    server = HealthServer(
        Health(
            "testcomp",
            [started(FakeService("svc", [Check("postgres", stalled_postgres)]))],
            CollectorRegistry(),
        ),
        0,
        "127.0.0.1",
    )
    server.start()
    try:
        probe = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        probe.sendall(b"GET /ready HTTP/1.1\r\nHost: probe\r\n\r\n")
        # The probe's timeout: it hangs up with a reset, as a client closing an unread socket does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        probe.close()
        stalled.set()
        assert answered.wait(5), "the server never finished the probe's request"
        assert "Traceback" not in capsys.readouterr().err
    finally:
        server.close()
    plain = health_module._Server(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    try:
        try:
            raise ValueError("a real fault")
        except ValueError:
            plain.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a real fault" in capsys.readouterr().err
    finally:
        plain.server_close()


def test_a_probe_hung_for_good_is_replaced_and_the_dependency_seen_again(
    serve: Serve, no_probe_cache: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe that hangs for good (its host gone without a word: the connection waits on
    keepalives) must not leave the dependency down once it answers again: past
    PROBE_ABANDONED_S a new probe is started beside it, and /ready follows the new one. At most
    ABANDONED_PROBES hang at once, so a dependency whose every probe hangs holds a few threads only.
    (A hung probe once stood for the dependency until it returned, hours on a dead host.)"""
    monkeypatch.setattr(health_module, "PROBE_UNDER_WAY_S", 0.1)
    monkeypatch.setattr(health_module, "PROBE_ABANDONED_S", 0.2)
    monkeypatch.setattr(health_module, "ABANDONED_PROBES", 2)
    release = threading.Event()
    hanging = {"on": True}
    calls = {"n": 0}

    def probe() -> str | None:
        calls["n"] += 1
        if hanging["on"]:
            release.wait(30)
        return "ok"

    client = serve([started(FakeService("scan", [Check("postgresql", probe)]))])
    try:
        assert client.get("/ready").status_code == 503
        wait_until(
            lambda: client.get("/ready").status_code == 503 and calls["n"] >= 3, what="probes replaced"
        )
        time.sleep(0.5)  # past the bound again: no more than the first and ABANDONED_PROBES hang
        client.get("/ready")
        assert calls["n"] == 3, calls
        hanging["on"] = False
        release.set()  # the hung probes end; the next one answers
        wait_until(lambda: client.get("/ready").status_code == 200, what="ready once the dependency answers")
    finally:
        release.set()
