"""A component started while PostgreSQL is down has started: it waits the outage out, unready, and
Kubernetes must not kill it for that.

The manifests probe ``/startup`` every 5 s and give up after 60 failures
(k8s/components/pod-defaults/deployment.yaml): the kubelet kills a container whose startup probe
has not passed within 5 minutes, and restarts it with a growing back-off. A pod started during a
PostgreSQL outage (a node drained, a rollout, a pod that was restarted for any reason) must
therefore pass ``/startup`` once its process runs, and leave "PostgreSQL does not answer" to
``/ready``, which takes it out of service without a restart; otherwise every such pod is killed
and restarted, again and again, for as long as the outage lasts.

PostgreSQL is reached through a port of the test's own that refuses connections while it is down
(tests.support.PostgreSQLPort); the shared server is never touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos_stack import free_port
from scheduler.config import Settings
from scheduler.kafka.transport import TopicAdmin
from tests.e2e.health import get, status
from tests.support import Component, PostgreSQLPort, wait_for

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("component", ["scanner", "relay", "reconciler", "ingestor"])
def test_a_component_started_during_a_postgresql_outage_passes_its_startup_probe_and_is_not_ready(
    component: str, settings: Settings, settings_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    """``/startup`` answers 503 until PostgreSQL answers ("every service completed a first step"),
    so the kubelet kills the pod 5 minutes into the outage, and each one it starts again."""
    # The topics `scheduler init` would have made, had PostgreSQL answered it: the reconciler and
    # the ingestor consume from them, and are not ready without them.
    TopicAdmin(settings.kafka_bootstrap).ensure_topics(settings.core_topics)
    port = PostgreSQLPort(database_url)  # down: refuses every connection
    metrics_port = free_port()
    env = settings_env | {
        "SCHEDULER_DATABASE_URL": port.url(database_url),
        "SCHEDULER_METRICS_PORT": str(metrics_port),
    }
    process = Component(component, env, tmp_path)
    try:
        # The process runs and waits the outage out: its loop fails, backs off and tries again.
        wait_for(lambda: "(attempt 2)" in process.output(), 60, f"the {component} to retry", 0.25)
        assert status(metrics_port, "/live") == 200, process.output()[-3000:]
        assert status(metrics_port, "/ready") == 503, "PostgreSQL does not answer: not ready"
        startup = get(metrics_port, "/startup")
        assert startup.status == 200, (
            f"/startup answers {startup.status} {startup.text} while the {component} runs and waits for "
            "PostgreSQL: the startup probe kills it, and every pod started during the outage"
        )

        port.up()
        wait_for(lambda: status(metrics_port, "/ready") == 200, 60, f"the {component} to be ready")
    finally:
        code = process.stop()
        port.down()
    assert code == 0, process.output()[-3000:]
