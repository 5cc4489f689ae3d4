"""What an operator sees of ``scheduler run all``: each component's health and metrics on its own
port, readiness that follows PostgreSQL without anybody being restarted, and a supervisor that
restarts a killed component and stops every child on SIGTERM.

The PostgreSQL outage is real: a server of the test's own is stopped and started again under the
running components (the shared stack's server is never touched)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bench.chaos_stack import free_port, free_port_range
from scheduler import __version__
from scheduler.devstack.postgres import LocalPostgres
from scheduler.kafka.transport import TopicAdmin
from tests import support
from tests.conftest import StackInfo
from tests.e2e.health import (
    Child,
    Supervised,
    alive,
    children_of,
    cli,
    cli_json,
    declared_metrics,
    get,
    sample_values,
    status,
    wait_for_statuses,
)
from tests.support import SCHEDULER, wait_for

pytestmark = pytest.mark.e2e

APP = "ops"
CHILDREN = ("scanner", "relay", "reconciler", "ingestor", f"worker-{APP}")
NEEDS_POSTGRES = ("scanner", "relay", "reconciler", "ingestor")
CONSUMERS = ("reconciler", "ingestor", f"worker-{APP}")

# The metric families each component declares (name as in its ``# TYPE`` line: counters with _total).
OWN_METRICS: Mapping[str, Mapping[str, str]] = {
    "scanner": {
        "job_scheduled_total": "counter",
        "scheduler_scan_lag_seconds": "gauge",
        "scheduler_scanner_fire_lag_seconds": "histogram",
        "scheduler_scanner_runs_skipped_total": "counter",
        "scheduler_scanner_schedules_errored_total": "counter",
        "scheduler_schedules_in_error": "gauge",
    },
    "relay": {
        "scheduler_outbox_depth": "gauge",
        "scheduler_outbox_oldest_age_seconds": "gauge",
        "scheduler_dispatch_lag_seconds": "histogram",
        "scheduler_relay_published_total": "counter",
        "scheduler_relay_republished_total": "counter",
        "scheduler_relay_publish_failures_total": "counter",
        "scheduler_relay_released_total": "counter",
        "scheduler_relay_quarantined_total": "counter",
        "scheduler_relay_obsolete_republishes_total": "counter",
        "scheduler_relay_held_total": "counter",
        "scheduler_relay_held_topics": "gauge",
    },
    "reconciler": {
        "scheduler_reconciler_events_total": "counter",
        "scheduler_dead_letters_total": "counter",
        "scheduler_consumer_lag": "gauge",
        "scheduler_reconciler_last_batch_timestamp_seconds": "gauge",
        "scheduler_lease_expiries_total": "counter",
        "scheduler_buffered_runs_released_total": "counter",
        "scheduler_reconciler_quarantined_total": "counter",
        "scheduler_lease_sweep_held_seconds": "gauge",
        "scheduler_lease_sweep_unread_outcomes": "gauge",
    },
    "ingestor": {
        "scheduler_ingestor_commands_total": "counter",
        "scheduler_ingestor_rejected_total": "counter",
        "scheduler_ingestor_batch_seconds": "histogram",
        "scheduler_consumer_lag": "gauge",
    },
    "worker": {
        "job_execution_duration_seconds": "histogram",
        "job_execution_errors_total": "counter",
        "job_queue_size": "gauge",
        "scheduler_active_jobs": "gauge",
        "scheduler_worker_concurrency": "gauge",
        "job_retry_count_total": "counter",
        "scheduler_consumer_lag": "gauge",
        "scheduler_worker_outcomes_unacknowledged": "gauge",
        "scheduler_worker_outcome_delivery_failures_total": "counter",
        "scheduler_worker_refused_handlers_total": "counter",
        "scheduler_worker_abandoned_threads_total": "counter",
        "scheduler_worker_commit_failures_total": "counter",
        "scheduler_worker_duplicate_deliveries_total": "counter",
        "scheduler_worker_start_delivery_failures_total": "counter",
    },
}
EVERY_COMPONENT_METRICS = {
    "scheduler_build_info": "gauge",
    "scheduler_ready": "gauge",
    "scheduler_dependency_up": "gauge",
}


def component_of(child: str) -> str:
    return "worker" if child.startswith("worker-") else child


@dataclass(frozen=True)
class Environment:
    env: dict[str, str]
    prefix: str


def environment(database_url: str, bootstrap: str) -> Iterator[Environment]:
    """The variables every command of the test gets: its database, the shared Kafka, a fresh topic
    prefix (whose topics are deleted afterwards)."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDULER_", "OTEL_"))} | {
        "SCHEDULER_DATABASE_URL": database_url,
        "SCHEDULER_KAFKA_BOOTSTRAP": bootstrap,
        "SCHEDULER_TOPIC_PREFIX": prefix,
        "SCHEDULER_MAX_SCAN_SLEEP": "0.2",
    }
    try:
        yield Environment(env, prefix)
    finally:
        admin = TopicAdmin(bootstrap)
        admin.delete_topics([t for t in admin.topics() if t.startswith(f"{prefix}.")])


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[LocalPostgres]:
    with support.own_postgres(tmp_path) as postgres:
        yield postgres


@pytest.fixture
def own_database_env(own_postgres: LocalPostgres, stack: StackInfo) -> Iterator[Environment]:
    yield from environment(own_postgres.url, stack.kafka_bootstrap)


@pytest.fixture
def shared_database_env(database_url: str, stack: StackInfo) -> Iterator[Environment]:
    yield from environment(database_url, stack.kafka_bootstrap)


@pytest.fixture
def run_all() -> Iterator[list[Supervised]]:
    """Started supervisors, whose process groups are killed at the end if anything is left."""
    started: list[Supervised] = []
    try:
        yield started
    finally:
        for supervised in started:
            supervised.kill_leftovers()


def start_pipeline(
    env: Environment, tmp_path: Path, started: list[Supervised], base: int | None = None
) -> tuple[Supervised, list[Child]]:
    """Initialise, create the app, start ``run all`` on consecutive ports from ``base`` (free ones by
    default), wait until ready."""
    cli(env.env, "init")
    cli(env.env, "apps", "create", APP, "--partitions", "2")
    base = free_port_range(len(CHILDREN)) if base is None else base
    supervised = Supervised(env.env, tmp_path, "--metrics-port", str(base))
    started.append(supervised)
    table = supervised.table(len(CHILDREN))
    assert [(c.name, c.port) for c in table] == [(name, base + i) for i, name in enumerate(CHILDREN)]
    assert {c.pid for c in table} == children_of(supervised.pid), "the table lists the supervisor's children"
    wait_for_statuses({c.name: c.port for c in table}, "/ready", 200, 120, supervised.stderr)
    return supervised, table


def run_states(env: Environment, schedule_id: str) -> list[str]:
    return [run["state"] for run in cli_json(env.env, "runs", "list", "--schedule", schedule_id, "--json")]


def check_health_document(
    child: Child, document: dict[str, Any], *, postgresql: str = "up", endpoint: str = "/health"
) -> None:
    """The JSON of ``/health`` (or of ``/ready``, the same document with ready or not ready)."""
    good, bad = ("ready", "not ready") if endpoint == "/ready" else ("healthy", "unhealthy")
    assert document["status"] == (good if postgresql == "up" else bad), document
    assert document["component"] == component_of(child.name)
    assert datetime.fromisoformat(document["timestamp"]).utcoffset() is not None
    assert isinstance(document["uptime_seconds"], int | float) and document["uptime_seconds"] >= 0
    assert document["version"] == __version__
    parts: dict[str, dict[str, Any]] = document["components"]
    for name, part in parts.items():
        assert part["status"] in ("up", "down"), (name, part)
        assert isinstance(part["latency_ms"], int | float) and part["latency_ms"] >= 0, (name, part)
    if child.name == "scanner":
        assert "kafka" not in parts, "the scanner's only output is the outbox: it needs no Kafka"
    else:
        assert parts["kafka"]["status"] == "up", parts
    if child.name in NEEDS_POSTGRES:
        assert parts["postgresql"]["status"] == postgresql, parts
    else:
        assert "postgresql" not in parts, "workers never talk to PostgreSQL"
    loops = {name: part for name, part in parts.items() if name.startswith("loop:")}
    if child.name == "reconciler":
        assert set(loops) == {"loop:reconciler", "loop:lease-sweeper", "loop:buffer-release"}, parts
    elif child.name == "scanner":
        # The zone-rules pass runs beside the scan (scheduler/scan/zone_rules.py).
        assert set(loops) == {"loop:scanner", "loop:zone-rules"}, parts
    else:
        role = "worker" if child.name.startswith("worker") else child.name
        assert set(loops) == {f"loop:{role}"}, parts
    if postgresql == "down":
        return  # a service backing off may rebuild its consumer meanwhile
    if child.name in CONSUMERS:
        assert parts["consumer_group"]["status"] == "up", parts
    assert all(part["status"] == "up" for part in loops.values()), parts


def check_metrics(child: Child) -> str:
    answer = get(child.port, "/metrics")
    assert answer.status == 200 and answer.content_type.startswith("text/plain"), answer
    declared = declared_metrics(answer.text)
    component = component_of(child.name)
    own = dict(OWN_METRICS[component]) | EVERY_COMPONENT_METRICS
    assert {name: declared.get(name) for name in own} == own, f"{child.name} declares {sorted(declared)}"
    others = {name for other, metrics in OWN_METRICS.items() if other != component for name in metrics}
    foreign = (others - set(own)) & set(declared)
    assert not foreign, f"{child.name}'s /metrics shows other components' metrics: {sorted(foreign)}"
    assert sample_values(answer.text, "scheduler_build_info") == [
        ({"component": component, "version": __version__}, 1.0)
    ]
    # /metrics answers while a dependency does not (Prometheus's `up` stays 1): it says so itself.
    assert sample_values(answer.text, "scheduler_ready") in ([({}, 1.0)], [({}, 0.0)])
    return answer.text


def test_every_child_of_run_all_serves_its_own_health_and_metrics_and_follows_postgresql(
    own_postgres: LocalPostgres, own_database_env: Environment, run_all: list[Supervised], tmp_path: Path
) -> None:
    env = own_database_env
    supervised, table = start_pipeline(env, tmp_path, run_all)
    ports = {c.name: c.port for c in table}
    pids = {c.name: c.pid for c in table}

    for child in table:
        assert status(child.port, "/live") == 200, child
        assert status(child.port, "/startup") == 200, child
        ready = get(child.port, "/ready")
        assert ready.status == 200 and ready.content_type.startswith("application/json"), (child, ready)
        check_health_document(child, ready.json(), endpoint="/ready")
        health = get(child.port, "/health")
        assert health.status == 200, (child, health)
        check_health_document(child, health.json())
        for path in ("/", "/nope", "/metrics/extra", "/healthz"):
            assert status(child.port, path) == 404, (child, path)
        check_metrics(child)

    # A job through the whole pipeline moves the counters of the components that handled it.
    schedule = cli_json(env.env, "schedules", "create", "--app", APP, "--now", "--handler", "builtin:noop")
    wait_for(lambda: run_states(env, schedule["id"]) == ["succeeded"], 60, "the run to succeed", 0.5)
    scanner = next(c for c in table if c.name == "scanner")
    worker = next(c for c in table if c.name == f"worker-{APP}")
    wait_for(
        lambda: (
            ({"app": APP, "kind": "immediate"}, 1.0)
            in sample_values(check_metrics(scanner), "job_scheduled_total")
        ),
        10,
        "the scanner to count the scheduled job",
    )
    wait_for(
        lambda: (
            ({"app": APP, "outcome": "succeeded"}, 1.0)
            in sample_values(check_metrics(worker), "job_execution_duration_seconds_count")
        ),
        10,
        "the worker to count the execution",
    )

    # PostgreSQL goes away: its clients turn unready (not dead, nobody restarts), the worker not.
    own_postgres.down()
    dependent = {name: ports[name] for name in NEEDS_POSTGRES}

    def dependents_unready() -> bool:
        assert status(ports[f"worker-{APP}"], "/ready") == 200, "the worker does not need PostgreSQL"
        return all(status(port, "/ready") == 503 for port in dependent.values())

    wait_for(dependents_unready, 10, "every PostgreSQL client's /ready to answer 503", interval_s=0.25)
    for child in table:
        if child.name in NEEDS_POSTGRES:
            health = get(child.port, "/health")
            assert health.status == 503, (child, health)
            check_health_document(child, health.json(), postgresql="down")
            ready = get(child.port, "/ready")
            assert ready.status == 503, (child, ready)
            check_health_document(child, ready.json(), postgresql="down", endpoint="/ready")
            metrics = check_metrics(child)
            assert sample_values(metrics, "scheduler_ready") == [({}, 0.0)], child
            assert ({"dependency": "postgresql"}, 0.0) in sample_values(metrics, "scheduler_dependency_up")
        assert status(child.port, "/live") == 200, f"{child.name} is alive while PostgreSQL is down"
    worker_ready = get(worker.port, "/ready")
    assert worker_ready.status == 200, worker_ready
    check_health_document(worker, worker_ready.json(), endpoint="/ready")

    own_postgres.up(own_postgres.preflight())
    wait_for_statuses(ports, "/ready", 200, 30, supervised.stderr)
    for child in table:
        check_health_document(child, get(child.port, "/health").json())
    deaths = [m for m in supervised.messages() if " died: " in m]
    errors = "\n".join(line[:1500] for line in supervised.stderr().splitlines() if '"ERROR"' in line)
    assert not deaths, f"died during the PostgreSQL outage: {deaths}\n{errors}"
    assert children_of(supervised.pid) == set(pids.values()), "no component was restarted"

    assert supervised.stop() == 0, supervised.stderr()[-4000:]
    assert not [pid for pid in pids.values() if alive(pid)]


def test_run_all_started_while_postgresql_is_down_waits_for_it_and_then_runs_the_workers(
    own_postgres: LocalPostgres, own_database_env: Environment, run_all: list[Supervised], tmp_path: Path
) -> None:
    """It exited 1 at start ("cannot reach PostgreSQL"), where every component waits an outage out.
    Now the components start, not ready, and the workers (whose apps PostgreSQL lists) once it
    answers: then everything is ready, no component restarted, and a job runs."""
    env = own_database_env
    cli(env.env, "init")
    cli(env.env, "apps", "create", APP, "--partitions", "2")
    own_postgres.down()
    base = free_port_range(len(CHILDREN))
    supervised = Supervised(env.env, tmp_path, "--metrics-port", str(base))
    run_all.append(supervised)
    pipeline = supervised.table(len(NEEDS_POSTGRES))
    assert [(c.name, c.port) for c in pipeline] == [(name, base + i) for i, name in enumerate(NEEDS_POSTGRES)]
    wait_for_statuses({c.name: c.port for c in pipeline}, "/ready", 503, 60, supervised.stderr)
    wait_for(
        lambda: any("no workers yet (asking again in" in m for m in supervised.messages()),
        30,
        "the supervisor to ask PostgreSQL again",
    )
    for child in pipeline:
        assert status(child.port, "/live") == 200, f"{child.name} is alive while PostgreSQL is down"

    own_postgres.up(own_postgres.preflight())
    table = supervised.table(len(CHILDREN), timeout_s=60)  # asked again at most 30 s apart
    assert [(c.name, c.port) for c in table] == [(name, base + i) for i, name in enumerate(CHILDREN)]
    wait_for_statuses({c.name: c.port for c in table}, "/ready", 200, 60, supervised.stderr)
    assert children_of(supervised.pid) == {c.pid for c in table}, "no component was restarted"
    schedule = cli_json(env.env, "schedules", "create", "--app", APP, "--now", "--handler", "builtin:noop")
    wait_for(lambda: run_states(env, schedule["id"]) == ["succeeded"], 60, "the run to succeed", 0.5)
    assert "Traceback" not in supervised.stderr()
    assert f"PostgreSQL answers: workers for {APP}" in supervised.messages()
    assert supervised.stop() == 0, supervised.stderr()[-4000:]


def test_run_all_whose_late_workers_would_find_their_port_taken_stops_saying_so(
    own_postgres: LocalPostgres, own_database_env: Environment, run_all: list[Supervised], tmp_path: Path
) -> None:
    """The workers added once PostgreSQL lists the apps get the ports after the pipeline's: one held
    by another process is refused as at start (one line, exit 2), where the worker died and was
    restarted for as long as the port stayed taken."""
    env = own_database_env
    cli(env.env, "init")
    cli(env.env, "apps", "create", APP, "--partitions", "2")
    own_postgres.down()
    base = free_port_range(len(CHILDREN))
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", base + len(NEEDS_POSTGRES)))  # the worker's, checked only once it is added
        holder.listen()
        supervised = Supervised(env.env, tmp_path, "--metrics-port", str(base))
        run_all.append(supervised)
        supervised.table(len(NEEDS_POSTGRES))
        own_postgres.up(own_postgres.preflight())
        assert supervised.proc.wait(90) == 2, supervised.stderr()[-4000:]
    taken = f"port {base + len(NEEDS_POSTGRES)} is in use by another process (set --metrics-port)"
    assert f"{taken}: stopping every component" in supervised.messages()
    assert not [m for m in supervised.messages() if " died: " in m], supervised.messages()


def test_run_all_restarts_a_killed_component_and_stops_every_child_on_sigterm(
    shared_database_env: Environment, run_all: list[Supervised], tmp_path: Path
) -> None:
    supervised, table = start_pipeline(shared_database_env, tmp_path, run_all)
    victim = next(c for c in table if c.name == "relay")
    others = [c for c in table if c is not victim]

    os.kill(victim.pid, signal.SIGKILL)
    restarted: list[int] = []

    def relay_back() -> bool:
        for child in others:
            assert status(child.port, "/live") == 200, f"{child.name} stopped answering /live"
        if not restarted:
            for message in supervised.messages():
                if message.startswith("restarted relay (pid "):
                    restarted.append(int(message.removeprefix("restarted relay (pid ").rstrip(")")))
        return bool(restarted) and status(victim.port, "/ready") == 200

    # Its restart's backoff (up to a second), then a new process that starts and connects: seconds
    # on a loaded machine.
    wait_for(relay_back, 60, "a new relay to answer /ready on the same port", interval_s=0.2)
    died = [m for m in supervised.messages() if m.startswith(f"relay (pid {victim.pid}) died: ")]
    assert len(died) == 1 and "killed by SIGKILL" in died[0] and "restarting in" in died[0], died
    new_pid = restarted[0]
    assert new_pid != victim.pid and not alive(victim.pid)
    assert children_of(supervised.pid) == {c.pid for c in others} | {new_pid}, "only the relay restarted"
    for child in others:
        assert status(child.port, "/live") == 200, child
    assert not [m for m in supervised.messages() if " died: " in m and not m.startswith("relay ")]

    assert supervised.stop() == 0, supervised.stderr()[-4000:]
    still_running = [pid for pid in [*(c.pid for c in others), new_pid] if alive(pid)]
    assert not still_running, f"children outlived the supervisor: {still_running}"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_children_stop_when_their_supervisor_is_killed_or_hung_up_on(
    shared_database_env: Environment, run_all: list[Supervised], tmp_path: Path, how: signal.Signals
) -> None:
    """A supervisor killed by SIGKILL (or the OOM killer) cannot stop its children; they held their
    ports as orphans, and the next ``run all`` refused to start. SIGHUP stopped it without a word."""
    supervised, table = start_pipeline(shared_database_env, tmp_path, run_all)
    os.kill(supervised.pid, how)
    code = supervised.proc.wait(60)
    assert code == (-signal.SIGKILL if how == signal.SIGKILL else 0), supervised.stderr()[-4000:]
    wait_for(
        lambda: not [c.name for c in table if alive(c.pid)], 60, "every child to stop with its supervisor"
    )
    if how == signal.SIGHUP:
        assert "received SIGHUP, stopping every component" in supervised.messages()
    again, _ = start_pipeline(shared_database_env, tmp_path, run_all, base=table[0].port)  # free again
    assert again.stop() == 0, again.stderr()[-4000:]


def test_run_all_refuses_a_port_another_process_holds_with_one_line(settings_env: dict[str, str]) -> None:
    """Its component would only fail to bind, again and again, under the supervisor's restarts."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        env = settings_env | {"SCHEDULER_JWT_SECRET": "s" * 40, "SCHEDULER_API_PORT": str(taken)}
        done = subprocess.run(
            [SCHEDULER, "run", "all", "--metrics-port", str(free_port())],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: port {taken} is in use by another process (set SCHEDULER_API_PORT)"


@pytest.mark.parametrize(
    ("variable", "host", "reason"),
    [
        ("SCHEDULER_METRICS_HOST", "no-such-host.invalid", "Name or service not known"),
        ("SCHEDULER_METRICS_HOST", "::1", "Address family for hostname not supported"),  # IPv4 only
        ("SCHEDULER_API_HOST", "no-such-host.invalid", "Name or service not known"),
    ],
)
def test_run_all_refuses_an_address_it_cannot_listen_on_with_one_line(
    settings_env: dict[str, str], variable: str, host: str, reason: str
) -> None:
    """Every child would die binding its port, and be restarted, for as long as run all ran."""
    env = settings_env | {"SCHEDULER_JWT_SECRET": "s" * 40, variable: host}
    done = subprocess.run(
        [SCHEDULER, "run", "all", "--metrics-port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: {variable}={host!r}: cannot listen there: {reason}\n"
