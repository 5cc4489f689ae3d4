"""The CLI with trace export on (``OTEL_EXPORTER_OTLP_ENDPOINT`` set, as it is in every component's
pod, where an operator runs ``kubectl exec … scheduler …``) while the collector is down: its command
does what it was asked, at once, and says nothing else.

``schedules create`` records a ``schedule.create`` span, and the CLI exports it as it exits. With
the collector not answering, the exporter retries that one span with back-off until its timeout
(``OTEL_EXPORTER_OTLP_TIMEOUT``): the command hangs on after its work is done, and its stderr,
where a CLI's one error line goes, fills with the exporter's retries."""

from __future__ import annotations

import json
import subprocess

import pytest

from bench.chaos_stack import free_port
from tests.e2e.health import cli
from tests.support import SCHEDULER

pytestmark = pytest.mark.integration

APP = "collector-down"


def create_with_collector_down(
    settings_env: dict[str, str], export_timeout_s: int, wait_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``schedules create --now`` exporting its span to a collector that is down; fails if it has
    not returned within ``wait_s``."""
    cli(settings_env, "init")
    cli(settings_env, "apps", "create", APP)
    env = settings_env | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "OTEL_EXPORTER_OTLP_TIMEOUT": str(export_timeout_s),
    }
    try:
        return subprocess.run(
            [SCHEDULER, "schedules", "create", "--app", APP, "--now", "--handler", "builtin:noop"],
            env=env, capture_output=True, text=True, timeout=wait_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"schedules create was still waiting for the trace collector {wait_s:.0f} s later "
            "(its work takes about a second)"
        ) from None


def test_schedules_create_with_the_collector_down_says_nothing_on_stderr(
    settings_env: dict[str, str],
) -> None:
    """Four lines of ``Transient error HTTPConnectionPool(…) … retrying in 0.81s.`` and ``Failed to
    export spans batch …``, raw text, after a create that succeeded (exit 0): a script that takes
    anything on stderr for the error line reads a failure."""
    done = create_with_collector_down(settings_env, 10)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["app"] == APP
    assert done.stderr == "", f"a create that succeeded wrote on stderr:\n{done.stderr}"


def test_schedules_create_with_the_collector_down_does_not_wait_out_the_export_timeout(
    settings_env: dict[str, str],
) -> None:
    """With a collector timeout of 60 s the create, done in a second, returns about 30 s later
    (7 s with the default 10 s): every command that records a span waits on the collector."""
    done = create_with_collector_down(settings_env, 60, wait_s=20)
    assert done.returncode == 0, done.stderr
