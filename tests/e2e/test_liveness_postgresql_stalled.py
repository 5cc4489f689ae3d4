"""A PostgreSQL that stops answering without closing anything (its processes stopped: a frozen VM or
container, a storage stall, SIGSTOP) is a dependency outage: the components that use it turn
unready and say why, and they stay live, so that Kubernetes does not restart them for it.

The outage is real: a PostgreSQL of the test's own is stopped with SIGSTOP under the running
components, and continued with SIGCONT (the shared stack's server is never touched). The kernel
still takes the components' bytes on the connections they hold, as it does for a frozen server,
so nothing fails: a statement under way waits for an answer that does not come."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos_stack import free_port
from scheduler.devstack.postgres import LocalPostgres
from scheduler.kafka.transport import TopicAdmin
from scheduler.runtime.health import LIVE_TIMEOUT_S
from tests import support
from tests.conftest import StackInfo
from tests.e2e.health import cli, cli_json, get, log_messages, status, wait_for_statuses
from tests.support import Component, server_processes, wait_for

pytestmark = pytest.mark.e2e

APP = "stalled"
COMPONENTS = ("scanner", "relay", "reconciler")
# PostgreSQL trusts every local connection and ignores it: only there to be kept out of the logs.
PASSWORD = "not-to-be-logged"
WAITING = "which does not answer"


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[LocalPostgres]:
    with support.own_postgres(tmp_path) as postgres:
        yield postgres


def test_a_postgresql_that_stops_answering_leaves_its_clients_unready_but_live(
    own_postgres: LocalPostgres, stack: StackInfo, tmp_path: Path
) -> None:
    """Each component's step blocks in a statement whose answer never comes and its loop stops
    turning: ``/ready`` answers 503, ``/live`` stays 200 past the 90 s live timeout, and the wait is
    logged once per loop, naming PostgreSQL and not its password. (``/live`` once answered 503 after
    90 s with nothing logged, and the liveness probe restarted every PostgreSQL client for an
    outage of the database, which a restart cannot cure.)"""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDULER_", "OTEL_"))} | {
        "SCHEDULER_DATABASE_URL": own_postgres.url.replace("@", f":{PASSWORD}@", 1),
        "SCHEDULER_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
        "SCHEDULER_TOPIC_PREFIX": prefix,
        "SCHEDULER_MAX_SCAN_SLEEP": "0.2",
    }
    cli(env, "init")
    cli(env, "apps", "create", APP)
    # A fire a second, so that the scanner and the relay are at work when PostgreSQL stops (the
    # reconciler's lease sweeper asks it every second anyway).
    cli_json(env, "schedules", "create", "--app", APP, "--cron", "* * * * * *", "--handler", "builtin:noop")
    ports = {name: free_port() for name in COMPONENTS}
    started = [
        Component(name, env | {"SCHEDULER_METRICS_PORT": str(ports[name])}, tmp_path) for name in COMPONENTS
    ]

    def logs() -> str:
        return "\n".join(f"--- {c.name}\n{c.output()[-3000:]}" for c in started)

    frozen: list[int] = []
    try:
        wait_for_statuses(ports, "/ready", 200, 120, logs)

        frozen = server_processes(own_postgres)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        wait_for_statuses(ports, "/ready", 503, 30, logs)

        # An outage longer than the liveness timeout: every component stays live throughout.
        outlasted = time.monotonic() + LIVE_TIMEOUT_S + 20

        def live_throughout() -> bool:
            not_live = {name: port for name, port in ports.items() if status(port, "/live") != 200}
            if not_live:
                loops = {
                    name: {
                        part: entry
                        for part, entry in get(port, "/health").json()["components"].items()
                        if part.startswith("loop:")
                    }
                    for name, port in not_live.items()
                }
                raise AssertionError(
                    f"not live during a PostgreSQL outage (a kubelet restarts these): {loops}\n{logs()}"
                )
            return time.monotonic() > outlasted

        wait_for(live_throughout, LIVE_TIMEOUT_S + 60, "the outage to outlast the liveness timeout", 2.0)

        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        frozen = []
        wait_for_statuses(ports, "/ready", 200, 60, logs)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        codes = {c.name: c.stop(60) for c in started}
        admin = TopicAdmin(stack.kafka_bootstrap)
        admin.delete_topics([t for t in admin.topics() if t.startswith(f"{prefix}.")])
    assert codes == dict.fromkeys(COMPONENTS, 0), logs()
    for component in started:
        # The outage is said, once for each loop it held, naming PostgreSQL and no secret.
        said = [m for m in log_messages(component.output()) if WAITING in m]
        loops = [m.split(" ", 1)[0] for m in said]
        assert said, f"the {component.name} never said that it waits on PostgreSQL:\n{logs()}"
        assert all("postgresql" in m for m in said), said
        assert len(loops) == len(set(loops)), f"said more than once: {said}"
        assert PASSWORD not in component.output(), f"the {component.name} logged the password"
