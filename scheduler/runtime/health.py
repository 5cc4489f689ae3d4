"""The health and metrics endpoints of a component process, on its own port.

- ``/live``: the loop of every service in the process turned recently (a wedged loop is restarted
  by whoever probes this; a loop backing off from a failed dependency is still turning), or waits
  on a dependency that stalls steps and does not answer (a PostgreSQL that stopped answering: see
  :class:`Check`), which a restart cannot cure. The worker's job loop counts too: an async handler
  that blocks it past the timeout wedges the worker.
- ``/startup``: every service took a first step, done or failed: the process has started itself,
  and waits out a dependency's outage unready, not unstarted (a startup probe would kill it).
- ``/ready``: started, not stopping, and every dependency answers (PostgreSQL, Kafka, and for
  consumers an assigned or joining group).
- ``/health``: the JSON document operators read: ``status``, ``timestamp``, ``components`` (each
  dependency and each service loop with ``status`` and ``latency_ms``), ``uptime_seconds``,
  ``version``. 503 when unhealthy.
- ``/metrics``: the Prometheus exposition of this component's own registry, and what ``/ready``
  says, as gauges: ``scheduler_ready`` (1 while ``/ready`` answers 200) and
  ``scheduler_dependency_up`` per ``dependency`` (each probe). Prometheus's ``up`` only says the
  endpoint answered, and it answers while PostgreSQL or Kafka does not; alerts read these.

Every other path answers 404. Dependency probes are cached for a second, so that a probe storm
(several kubelets, Prometheus, a person with curl) costs the dependencies one probe a second, and
each is waited for at most PROBE_UNDER_WAY_S, so that a dependency that never answers (its probe
hung) makes an endpoint say it down, never leaves the endpoint without an answer.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from scheduler import __version__
from scheduler.runtime.service import Check, Service

PROBE_CACHE_S = 1.0
# Every endpoint (and the main thread's live check) waits this long for a dependency's probe, its own
# or one under way, then says that dependency down: a probe that takes longer is one that does not
# answer. Under the manifests' probe timeout (3 s), so that a kubelet always has its answer, and a
# scrape held past Prometheus's timeout would blank every metric of the target. A probe may hang for
# good (a PostgreSQL frozen behind a pooler, which accepts the connection, holds its "select 1"):
# it runs on a thread of its own, one at a time per dependency, so it holds that thread only.
PROBE_UNDER_WAY_S = 2.5
# A probe hung this long is left to itself and a new one started, so that a dependency that answers
# again is seen as such (a probe on a host gone without a word may hang until its keepalives give
# up); at most ABANDONED_PROBES of one dependency are left hanging at once, so threads stay bounded.
PROBE_ABANDONED_S = 30.0
ABANDONED_PROBES = 3
# A loop that has not turned for this long is wedged. Generous: one step may wait on Kafka's
# acknowledgement of a batch for most of a relay claim (45 s by default).
LIVE_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Probe:
    status: str  # "up" | "down"
    latency_ms: float
    detail: str | None


class Health:
    """Evaluates a process's services and their dependencies."""

    def __init__(
        self,
        component: str,
        services: Sequence[Service],
        registry: CollectorRegistry,
        live_timeout_s: float = LIVE_TIMEOUT_S,
    ) -> None:
        self.component = component
        self.services = list(services)
        self.registry = registry
        self.live_timeout_s = live_timeout_s
        self.started_at = time.monotonic()
        checks: dict[str, Check] = {}
        # Per service, the dependencies its steps can wait on for good (see Check.stalls_steps).
        self._stalling: dict[str, list[str]] = {}
        for service in services:
            for check in service.checks():
                checks.setdefault(check.name, check)  # one PostgreSQL probe for the whole process
                if check.stalls_steps:
                    self._stalling.setdefault(service.name, []).append(check.name)
        self.checks = list(checks.values())
        self._probing = [_Probing(check) for check in self.checks]
        # Its own registry, served after the component's: a component's registry is a module's,
        # which a process (a test's) may hand to several Health objects in turn.
        self.readiness = CollectorRegistry()
        self.readiness.register(_Readiness(self))

    def metrics(self) -> bytes:
        """The ``/metrics`` exposition: the component's registry, then the readiness gauges."""
        return generate_latest(self.registry) + generate_latest(self.readiness)

    def overdue(self) -> tuple[list[str], dict[str, tuple[str, Probe]]]:
        """The services that have not turned within the live timeout: those wedged, and those
        waiting on a dependency that stalls their steps and does not answer (each with its name and
        probe). The dependencies are probed only when a loop is overdue: a turning loop costs none.

        A loop stuck in its own code during such an outage is taken for a waiting one until the
        dependency answers again; a live timeout later it is wedged."""
        late = [s.name for s in self.services if s.seconds_since_turn() >= self.live_timeout_s]
        if not any(name in self._stalling for name in late):
            return late, {}
        probes = self.probes()
        wedged: list[str] = []
        waiting: dict[str, tuple[str, Probe]] = {}
        for name in late:
            down = [d for d in self._stalling.get(name, ()) if probes[d].status == "down"]
            if down:
                waiting[name] = (down[0], probes[down[0]])
            else:
                wedged.append(name)
        return wedged, waiting

    def wedged(self) -> list[str]:
        """The services that have not turned within the live timeout and wait on no outage."""
        return self.overdue()[0]

    def live(self) -> bool:
        return not self.wedged()

    def started(self) -> bool:
        """``/startup``: every service took a first step, done or failed (see the module's docstring)."""
        return all(s.status.stepped for s in self.services)

    def probes(self) -> dict[str, Probe]:
        """Each dependency's probe, at most :data:`PROBE_CACHE_S` old, waited for at most
        :data:`PROBE_UNDER_WAY_S` (all of them at once)."""
        for probing in self._probing:
            probing.start()
        deadline = time.monotonic() + PROBE_UNDER_WAY_S
        return {probing.check.name: probing.result(deadline) for probing in self._probing}

    def ready(self) -> bool:
        if not self._serving():
            return False
        return all(p.status == "up" for p in self.probes().values())

    def scraped(self) -> tuple[bool, dict[str, Probe]]:
        """What ``/metrics`` says: :meth:`ready` and the probes."""
        probes = self.probes()
        return self._serving() and all(p.status == "up" for p in probes.values()), probes

    def _serving(self) -> bool:
        return all(s.status.started and not s.status.stopping for s in self.services)

    def document(self) -> dict[str, Any]:
        components: dict[str, dict[str, Any]] = {}
        for name, probe in self.probes().items():
            components[name] = {"status": probe.status, "latency_ms": round(probe.latency_ms, 2)}
            if probe.detail:
                components[name]["detail"] = probe.detail
        waiting = self.overdue()[1]
        for service in self.services:
            st = service.status
            since_turn = service.seconds_since_turn()
            turning = since_turn < self.live_timeout_s
            entry: dict[str, Any] = {
                "status": "up" if turning and st.started and not st.stopping else "down",
                "latency_ms": round(since_turn * 1000, 2),
                "started": st.started,
                "stopping": st.stopping,
                "consecutive_failures": st.failures,
            }
            if st.last_error:
                entry["last_error"] = st.last_error
            if service.name in waiting:
                entry["waiting_on"] = waiting[service.name][0]
            components[f"loop:{service.name}"] = entry
        healthy = self.live() and self.ready()
        return {
            "status": "healthy" if healthy else "unhealthy",
            "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "component": self.component,
            "components": components,
            "uptime_seconds": round(time.monotonic() - self.started_at, 3),
            "version": __version__,
        }


class _Readiness(Collector):
    """``/ready`` as gauges, evaluated at each scrape (:meth:`Health.scraped`)."""

    def __init__(self, health: Health) -> None:
        self.health = health

    def describe(self) -> list[GaugeMetricFamily]:
        # Registration reads the names from here: collect() would probe the dependencies.
        return [_ready_family(), _dependency_family()]

    def collect(self) -> list[GaugeMetricFamily]:
        ready, dependencies = _ready_family(), _dependency_family()
        is_ready, probes = self.health.scraped()
        ready.add_metric([], 1.0 if is_ready else 0.0)
        for name, probe in probes.items():
            dependencies.add_metric([name], 1.0 if probe.status == "up" else 0.0)
        return [ready, dependencies]


def _ready_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "scheduler_ready",
        "1 while /ready answers 200: started, not stopping, and every dependency answers",
    )


def _dependency_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "scheduler_dependency_up",
        "1 while the dependency (PostgreSQL, Kafka, the consumer group) answers its probe",
        labels=["dependency"],
    )


class _Probing:
    """One dependency's probe: run on a thread of its own, one at a time, its result kept for
    :data:`PROBE_CACHE_S`, so that a probe storm (several kubelets, Prometheus, a person with curl)
    costs the dependency one probe a second and a hung probe holds one thread, never a caller."""

    def __init__(self, check: Check) -> None:
        self.check = check
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started = 0.0  # when the probe under way, or the last one, began
        self._done: tuple[float, Probe] | None = None  # when the last probe ended, and its result
        self._abandoned = 0  # probes left hanging (see PROBE_ABANDONED_S) that have not ended

    def start(self) -> None:
        """Starts a probe unless one is under way (and not hung past PROBE_ABANDONED_S) or the last
        one is recent."""
        with self._lock:
            now = time.monotonic()
            if self._thread is not None and self._thread.is_alive():
                if now - self._started < PROBE_ABANDONED_S or self._abandoned >= ABANDONED_PROBES:
                    return
                self._abandoned += 1
            elif self._done is not None and now - self._done[0] < PROBE_CACHE_S:
                return
            thread = threading.Thread(target=self._run, name=f"probe-{self.check.name}", daemon=True)
            self._thread, self._started = thread, now
            thread.start()

    def result(self, deadline: float) -> Probe:
        """The probe under way once it ends, else the recent one; down if it has not ended by
        ``deadline``, or within :data:`PROBE_UNDER_WAY_S` of its start (a hung probe is said down
        at once to every caller after the first)."""
        with self._lock:
            thread, started = self._thread, self._started
        if thread is not None:
            thread.join(max(0.0, min(deadline, started + PROBE_UNDER_WAY_S) - time.monotonic()))
        with self._lock:
            if (thread is None or not thread.is_alive()) and self._done is not None:
                return self._done[1]
        return Probe("down", PROBE_UNDER_WAY_S * 1000, f"it did not answer within {PROBE_UNDER_WAY_S} s")

    def _run(self) -> None:
        probe = _probe(self.check)
        with self._lock:
            if threading.current_thread() is self._thread:
                self._done = (time.monotonic(), probe)
            else:  # an abandoned probe: a newer one stands for the dependency
                self._abandoned -= 1


def _probe(check: Check) -> Probe:
    started = time.perf_counter()
    try:
        detail = check.probe()
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        return Probe("down", (time.perf_counter() - started) * 1000, reason)
    return Probe("up", (time.perf_counter() - started) * 1000, detail)


class _Server(ThreadingHTTPServer):
    # socketserver's default backlog of 5 drops the SYNs of a probe burst, which then wait a
    # second for the kernel's retry: longer than a kubelet's default probe timeout.
    request_queue_size = 128
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A probe that gave up (its timeout passed while a check waited on a stalled PostgreSQL)
        # closed its end before the answer: normal for a kubelet, so not a traceback on stderr.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def try_listen(host: str) -> None:
    """Bind and release a port on ``host`` as :class:`HealthServer` would; raises OSError where it
    could not listen (a name that does not resolve, an address not of this machine)."""
    _Server((host, 0), BaseHTTPRequestHandler).server_close()


class HealthServer:
    """Serves :class:`Health` over HTTP from a daemon thread."""

    def __init__(self, health: Health, port: int, host: str = "0.0.0.0") -> None:
        self.health = health
        handler = _handler_for(health)
        self._server = _Server((host, port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for a serve_forever that must have started
            self._server.shutdown()
        self._server.server_close()


def _handler_for(health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "scheduler-health"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            if path == "/metrics":
                self._send(HTTPStatus.OK, health.metrics(), CONTENT_TYPE_LATEST)
            elif path == "/live":
                self._status(health.live(), "live")
            elif path == "/startup":
                self._status(health.started(), "started")
            elif path == "/ready":
                ok = health.ready()
                document = health.document()
                # Readiness is about the dependencies, not liveness: the body says which.
                document["status"] = "ready" if ok else "not ready"
                self._json(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, document)
            elif path == "/health":
                document = health.document()
                ok = document["status"] == "healthy"
                self._json(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, document)
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path}"})

        def do_HEAD(self) -> None:
            self.do_GET()

        def _status(self, ok: bool, what: str) -> None:
            body = {"status": what if ok else f"not {what}"}
            self._json(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, body)

        def _json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            # Probes every few seconds would drown the component's log.
            pass

    return Handler
