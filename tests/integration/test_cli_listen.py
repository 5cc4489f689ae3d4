"""A component that cannot listen where its settings say stops at start with one line naming the
settings and exit 2, as `run all` does and as every other bad setting does."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.support import SCHEDULER

pytestmark = pytest.mark.integration


def run_scanner(env: dict[str, str], port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDULER, "run", "scanner", "--metrics-port", str(port)],
        env=env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def test_a_port_held_by_another_process_is_exit_2(settings_env: dict[str, str]) -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        done = run_scanner(settings_env, held.getsockname()[1])
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "cannot listen on" in lines[0] and "SCHEDULER_METRICS_PORT" in lines[0]


def test_an_address_it_cannot_listen_on_is_exit_2(settings_env: dict[str, str]) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    done = run_scanner(settings_env | {"SCHEDULER_METRICS_HOST": "::1"}, port)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "SCHEDULER_METRICS_HOST" in lines[0]
