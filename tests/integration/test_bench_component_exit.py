"""A benchmark whose component exits mid-run says so and stops, rather than waiting out its limit
(ten minutes for bench.e2e) for runs that can no longer finish."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import StackInfo


def test_e2e_stops_with_the_component_that_exited(stack: StackInfo) -> None:
    env = os.environ | {
        "SCHEDULER_DATABASE_URL": stack.database_url,
        "SCHEDULER_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
        # The worker cannot import it, and exits at its start.
        "SCHEDULER_HANDLERS": "bench_no_such_module",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.e2e", "--jobs", "10", "--workers", "1", "--partitions", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        # Interrupted, it stops what it started and removes its database and topics.
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
        pytest.fail("bench.e2e was still waiting 90 s after its worker had exited")
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert "worker" in last and "exited" in last, err
    assert "Traceback" not in err
