"""The chaos run's own PostgreSQL and Kafka, which it kills and restarts on purpose.

They live in a folder of their own on ports of their own, so the faults never touch the shared
development stack (``scheduler dev up``) that tests and other work use. Kafka's jars are the
shared stack's (resolved once by Maven, linked here). Every process is signalled by the pid this
module started or read from that process's own pid file, never by name.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from scheduler.config import load_settings
from scheduler.devstack.kafka import LocalKafka
from scheduler.devstack.postgres import UNPRIVILEGED_USER, LocalPostgres, find_bin_dir
from scheduler.devstack.process import is_alive

# Below Linux's ephemeral range (32768-60999), so a client socket does not take a port meanwhile.
_PORTS_FROM, _PORTS_TO = 20_000, 32_000
# Every port this process handed out: a caller may pick several before any is bound (three API
# processes started together), and each check alone would find the same port still free.
_handed_out: set[int] = set()


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port_range(count: int) -> int:
    """The first of ``count`` consecutive ports free now and not handed out before by this process."""
    for _ in range(1000):
        base = random.randrange(_PORTS_FROM, _PORTS_TO - count)
        span = range(base, base + count)
        if not _handed_out.intersection(span) and all(_port_free(p) for p in span):
            _handed_out.update(span)
            return base
    raise RuntimeError(f"no {count} consecutive free ports in {_PORTS_FROM}-{_PORTS_TO}")


def free_port() -> int:
    return free_port_range(1)


class ChaosStack:
    """PostgreSQL and single-node Kafka in a temporary folder, with the faults the run injects."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="scheduler-chaos-"))
        # PostgreSQL runs as nobody when we are root: it must be able to reach its folder.
        self.dir.chmod(0o755)
        pg_port, kafka_port, controller_port = free_port(), free_port(), free_port()
        self.postgres = LocalPostgres(self.dir, pg_port)
        self.kafka = LocalKafka(self.dir, kafka_port, controller_port)
        self.ports = {"pg": pg_port, "kafka": kafka_port, "controller": controller_port}

    def up(self) -> None:
        shared = LocalKafka(load_settings().stack_dir, 0, 0)
        shared.resolve_jars()  # a no-op once the shared stack has them
        (self.dir / "kafka-libs").symlink_to(shared.libs)
        self.postgres.up(self.postgres.preflight())
        self.kafka.up(self.kafka.preflight())

    def env(self) -> dict[str, str]:
        """What a component (or the CLI) needs to use this stack and never the shared one."""
        return {
            "SCHEDULER_DATABASE_URL": self.postgres.url,
            "SCHEDULER_KAFKA_BOOTSTRAP": self.kafka.bootstrap,
            "SCHEDULER_STACK_DIR": str(self.dir),
            "SCHEDULER_PG_PORT": str(self.ports["pg"]),
            "SCHEDULER_KAFKA_PORT": str(self.ports["kafka"]),
            "SCHEDULER_KAFKA_CONTROLLER_PORT": str(self.ports["controller"]),
        }

    # --- faults ------------------------------------------------------------------------------

    def kill_kafka(self) -> int | None:
        """kill -9 of the broker; its pid, or None if it was not running."""
        pid = self.kafka.pid()
        if pid is None:
            return None
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 30)
        return pid

    def start_kafka(self) -> None:
        self.kafka.remove_stale_pid_file()
        self.kafka.up(self.kafka.preflight())

    def stop_postgres_immediately(self) -> int | None:
        """``pg_ctl stop -m immediate``: every backend ends at once, no checkpoint (a crash, for the
        data); the restart recovers from the WAL. The postmaster's pid, or None if not running."""
        pid = self.postgres.pid()
        if pid is None:
            return None
        argv = [str(find_bin_dir() / "pg_ctl"), "-D", str(self.postgres.data), "-m", "immediate", "stop"]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", UNPRIVILEGED_USER, "--", *argv]
        subprocess.run(argv, capture_output=True, check=False, timeout=60)
        _wait_gone(pid, 30)
        return pid

    def start_postgres(self) -> None:
        self.postgres.up(self.postgres.preflight())

    # --- the end -------------------------------------------------------------------------------

    def logs(self) -> dict[str, Path]:
        return {"kafka.log": self.kafka.log, "postgres.log": self.postgres.log}

    def down(self) -> None:
        """Stop both (by their pids, SIGKILL if they will not stop) and remove every file."""
        with contextlib.suppress(Exception):
            self.kafka.down()
        pid = self.kafka.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        try:
            self.postgres.down()
        except Exception:
            pid = self.postgres.pid()
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                _wait_gone(pid, 30)
        shutil.rmtree(self.postgres.root, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
