"""Ingestion: how fast schedules get into PostgreSQL, through Kafka and through the CLI.

Avro commands: N ``create`` commands (far-future yearly crons, so nothing fires) written as JSON
lines, produced with ``scheduler produce --file`` while ``scheduler run ingestor`` runs; timed from
the start of ``produce`` until N schedules are in PostgreSQL (``avro_per_s``), with the producer's
own rate apart (``produce_per_s``). The ingestor is warmed up with a few commands first.

CLI: ``scheduler schedules create`` in a loop, one process per schedule as a shell script would do
it (``cli_per_s``; mostly the interpreter's start-up).

Skipped, with the reason recorded, when this checkout has no ``scheduler produce`` or ingestor.

    python -m bench.ingest --commands 10000 --cli 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import (
    BENCH_APP,
    RESULTS,
    component_env,
    console,
    create_bench_app,
    isolated_settings,
    record,
    running,
    wait_until,
)
from scheduler.wiring import Wiring

YEARLY = "0 0 1 1 *"


def available() -> str | None:
    """Why the Avro path cannot be measured here, or None when it can."""
    for args in (["produce", "--help"], ["run", "ingestor", "--help"]):
        probe = subprocess.run([sys.executable, "-m", "scheduler", *args], capture_output=True)
        if probe.returncode != 0:
            return f"`scheduler {' '.join(args[:-1])}` is not available in this checkout"
    return None


def write_commands(path: Path, count: int, prefix: str) -> None:
    with path.open("w") as out:
        for i in range(count):
            command = {
                "command_id": str(uuid.uuid4()),
                "schedule_key": f"{prefix}:{i}",
                "app": BENCH_APP,
                "operation": "create",
                "spec": {"name": f"{prefix}-{i}", "cron": YEARLY, "handler": "builtin:noop"},
            }
            out.write(json.dumps(command) + "\n")


def produce(env: dict[str, str], path: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "scheduler", "produce", "--file", str(path), "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def schedule_count(conn: Any, prefix: str) -> int:
    row = conn.execute(
        "select count(*) as n from schedules where app = %s and name like %s", (BENCH_APP, prefix + "-%")
    ).fetchone()
    conn.commit()
    return int(row["n"]) if row else 0


def run_avro(commands: int, partitions: int) -> dict[str, Any]:
    with isolated_settings("ingest") as settings, tempfile.TemporaryDirectory() as scratch:
        create_bench_app(settings, partitions)
        env = component_env(settings)
        warm, batch = Path(scratch) / "warm.jsonl", Path(scratch) / "bench.jsonl"
        write_commands(warm, 10, "warm")
        write_commands(batch, commands, "avro")
        with (
            running([["ingestor"]], env, RESULTS / "logs" / "ingest"),
            Wiring(settings).database.connect() as conn,
        ):
            produce(env, warm)
            wait_until(lambda: schedule_count(conn, "warm") >= 10, 120, interval_s=0.1)
            started = time.monotonic()
            summary = produce(env, batch)
            finished = wait_until(lambda: schedule_count(conn, "avro") >= commands, 600, interval_s=0.05)
            # The same file once more, as a producer retrying everything would: applied once only.
            produce(env, batch)
            wait_until(lambda: duplicates_seen(conn) >= commands, 600, interval_s=0.1)
            after_replay = schedule_count(conn, "avro")
    seconds = finished - started
    return {
        "commands": commands,
        "seconds": round(seconds, 2),
        "avro_per_s": round(commands / seconds, 1),
        "produce_per_s": summary.get("rate"),
        "schedules_after_producing_twice": after_replay,
    }


def duplicates_seen(conn: Any) -> int:
    row = conn.execute("select coalesce(sum(duplicates), 0) as n from applied_commands").fetchone()
    conn.commit()
    return int(row["n"]) if row else 0


def run_cli(count: int, partitions: int) -> dict[str, Any]:
    with isolated_settings("ingestcli") as settings:
        create_bench_app(settings, partitions)
        env = component_env(settings)
        started = time.monotonic()
        for i in range(count):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "scheduler",
                    "schedules",
                    "create",
                    "--app",
                    BENCH_APP,
                    "--name",
                    f"cli-{i}",
                    "--cron",
                    YEARLY,
                    "--handler",
                    "builtin:noop",
                ],
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        seconds = time.monotonic() - started
    return {"cli_commands": count, "cli_seconds": round(seconds, 2), "cli_per_s": round(count / seconds, 1)}


def run_ingest(commands: int, cli: int, partitions: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    missing = available()
    if missing is None and commands:
        figures |= run_avro(commands, partitions)
    else:
        figures |= {"avro_per_s": None, "avro_skipped": missing or "not asked for"}
    if cli:
        figures |= run_cli(cli, partitions)
    return figures


def show(figures: dict[str, Any]) -> None:
    table = Table("path", "schedules", "seconds", "schedules/s", "note", title="ingestion into PostgreSQL")
    if figures.get("avro_per_s") is not None:
        table.add_row(
            "Avro commands → ingestor",
            f"{figures['commands']:,}",
            str(figures["seconds"]),
            f"{figures['avro_per_s']:,}",
            f"scheduler produce alone: {figures['produce_per_s']:,} commands/s",
        )
    else:
        table.add_row("Avro commands → ingestor", "-", "-", "-", f"skipped: {figures['avro_skipped']}")
    if "cli_per_s" in figures:
        table.add_row(
            "scheduler schedules create",
            str(figures["cli_commands"]),
            str(figures["cli_seconds"]),
            str(figures["cli_per_s"]),
            "one process per schedule",
        )
    console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=10_000, help="Avro create commands (0 skips)")
    parser.add_argument("--cli", type=int, default=20, help="schedules created with the CLI (0 skips)")
    parser.add_argument("--partitions", type=int, default=12)
    args = parser.parse_args()
    figures = run_ingest(args.commands, args.cli, args.partitions)
    show(figures)
    print(f"written to {record('ingest', figures)}")


if __name__ == "__main__":
    main()
