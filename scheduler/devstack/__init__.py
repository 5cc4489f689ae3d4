"""The local stack for development, tests and ``make run``: real PostgreSQL and real Kafka.

Everything lives under ``settings.stack_dir`` (``.stack/`` by default, ignored by git): data, logs,
pid files and Kafka's jars. Nothing here is used in production, where both are provided.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.config import Settings
from scheduler.devstack.kafka import LocalKafka
from scheduler.devstack.postgres import LocalPostgres
from scheduler.devstack.process import ProcessStatus, StackError

__all__ = ["LocalStack", "ProcessStatus", "StackError"]


class LocalStack:
    def __init__(self, settings: Settings) -> None:
        self.postgres = LocalPostgres(settings.stack_dir, settings.pg_port)
        self.kafka = LocalKafka(settings.stack_dir, settings.kafka_port, settings.kafka_controller_port)

    def up(self, notice: Callable[[str], None] = lambda _line: None) -> None:
        """Start what is not running; returns once a SQL query and a Kafka metadata request succeed.

        Every precondition (binaries, Java, Kafka's jars, free ports) is checked before either part
        starts, so a failure leaves nothing half-started behind.
        """
        stale = self.kafka.remove_stale_pid_file()
        if stale is not None:
            notice(f"removed stale pid file {self.kafka.pid_file} (pid {stale} is not running)")
        pg_bin = self.postgres.preflight()
        java = self.kafka.preflight()
        self.postgres.up(pg_bin)
        self.kafka.up(java)

    def down(self) -> None:
        # Kafka first: nothing of ours depends on it to stop, and it takes the longest.
        self.kafka.down()
        self.postgres.down()

    def status(self) -> list[ProcessStatus]:
        return [self.postgres.status(), self.kafka.status()]

    def env(self) -> dict[str, str]:
        return {
            "SCHEDULER_DATABASE_URL": self.postgres.url,
            "SCHEDULER_KAFKA_BOOTSTRAP": self.kafka.bootstrap,
        }
