"""Ingestion: how fast schedules get into PostgreSQL, through Kafka and through the CLI.

Avro commands: N ``create`` commands (far-future yearly crons, so nothing fires) written as JSON
lines, produced with ``scheduler produce --file`` while ``scheduler run ingestor`` runs; timed from
the start of ``produce`` until N schedules are in PostgreSQL (``avro_per_s``), with the producer's
own rate apart (``produce_per_s``). The ingestor is warmed up with a few commands first. What the
same span cost (``cost``: WAL bytes, PostgreSQL CPU, statements and transactions per command, as
:mod:`bench.cost` measures them for every benchmark) and the ingestors' own CPU per command
(``ingestor_cpu_us_per_command``) are reported beside the rate: on a shared machine those vary far
less than the rate does. ``--ingestors 2`` runs two ingestor processes in one consumer group.

Drain: the same N commands put on the topic before any ingestor runs, then read by freshly started
ingestors (``drain_per_s``, timed from the first schedule of the run to the last, so the start-up
and the group join are left out). Producer and ingestor share this machine's cores in the first
figure; here the ingestor has them to itself with PostgreSQL, so this is what it can take.

CLI: ``scheduler schedules create`` in a loop, one process per schedule as a shell script would do
it (``cli_per_s``; mostly the interpreter's start-up).

Skipped, with the reason recorded, when this checkout has no ``scheduler produce`` or ingestor.

    python -m bench.ingest --commands 10000 --cli 20 [--ingestors 2]
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
    non_negative_int,
    positive_int,
    record,
    run_main,
    running,
    wait_until,
)
from bench.cost import ComponentCpu, CostProbe, Watcher, local_kafka_data, observed, show_cost
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


def _one(conn: Any, sql: str, params: tuple[Any, ...]) -> dict[str, Any] | None:
    """One row, on a connection (its transaction ended) or a :class:`Watcher` (counted), marked as
    the benchmark's own either way: ``pg_stat_statements`` keeps the text a statement first came
    with, and the watcher's polls would pass for the ingestion's after an unmarked first one."""
    if isinstance(conn, Watcher):
        return conn.fetchone(sql, params)
    row: dict[str, Any] | None = conn.execute(observed(sql), params).fetchone()
    conn.commit()
    return row


def schedule_count(conn: Any, prefix: str) -> int:
    row = _one(
        conn,
        "select count(*) as n from schedules where app = %s and name like %s",
        (BENCH_APP, prefix + "-%"),
    )
    return int(row["n"]) if row else 0


def run_avro(commands: int, partitions: int, ingestors: int = 1) -> dict[str, Any]:
    with isolated_settings("ingest") as settings, tempfile.TemporaryDirectory() as scratch:
        create_bench_app(settings, partitions)
        env = component_env(settings)
        warm, batch = Path(scratch) / "warm.jsonl", Path(scratch) / "bench.jsonl"
        # Warm-up commands on every partition: by the time they are all in, the ingestors have as a
        # rule joined the group and taken their partitions, so the clock starts on a settled group.
        warmup = 10 * ingestors * partitions
        write_commands(warm, warmup, "warm")
        write_commands(batch, commands, "avro")
        probe = CostProbe(
            settings.database_url, kafka_data=local_kafka_data(), topic_prefix=settings.topic_prefix
        )
        with (
            running([["ingestor"]] * ingestors, env, RESULTS / "logs" / "ingest") as procs,
            Wiring(settings).database.connect() as conn,
            Watcher(settings.database_url) as watch,
        ):
            # ``watch`` polls for the end: its statements, transactions and CPU are not the ingestion's.
            cpu = ComponentCpu({"ingestor": [p.pid for p in procs]})
            produce(env, warm)
            wait_until(lambda: schedule_count(conn, "warm") >= warmup, 120, interval_s=0.1)
            probe.start()
            cpu.start()
            started = time.monotonic()
            summary = produce(env, batch)
            finished = wait_until(lambda: all_in(watch, "avro", commands), 600, interval_s=0.05)
            ingestor_cpu_s = cpu.spent()["ingestor"]
            # With the probe's full settle, as e2e's: an idle backend reports its transactions
            # (pg_stat_database) up to 10 s late, and 2 s missed some.
            cost = probe.finish(commands, watcher=watch)
            # The same file once more, as a producer retrying everything would: applied once only.
            produce(env, batch)
            wait_until(lambda: duplicates_seen(conn) >= commands, 600, interval_s=0.1)
            after_replay = schedule_count(conn, "avro")
    seconds = finished - started
    return {
        "commands": commands,
        "ingestors": ingestors,
        "seconds": round(seconds, 2),
        "avro_per_s": round(commands / seconds, 1),
        "produce_per_s": summary.get("rate"),
        "schedules_after_producing_twice": after_replay,
        "ingestor_cpu_us_per_command": round(ingestor_cpu_s / commands * 1e6, 1),
        "cost": cost,
    }


def all_in(conn: Any, prefix: str, count: int) -> bool:
    """Whether the ``count`` schedules of ``prefix`` are in. Counting scans the growing table, which
    polled every 50 ms would cost PostgreSQL as much as the ingestion it measures: the last
    command's key is looked up first (one index probe), and only once it is in are they counted."""
    last = (BENCH_APP, f"{prefix}:{count - 1}")
    row = _one(conn, "select 1 from schedule_keys where app = %s and schedule_key = %s", last)
    return row is not None and schedule_count(conn, prefix) >= count


def any_in(conn: Any, prefix: str) -> bool:
    row = conn.execute(
        "select 1 from schedules where app = %s and name like %s limit 1", (BENCH_APP, prefix + "-%")
    ).fetchone()
    conn.commit()
    return row is not None


def run_drain(commands: int, partitions: int, ingestors: int = 1) -> dict[str, Any]:
    with isolated_settings("drain") as settings, tempfile.TemporaryDirectory() as scratch:
        create_bench_app(settings, partitions)
        env = component_env(settings)
        path = Path(scratch) / "drain.jsonl"
        write_commands(path, commands, "drain")
        produce(env, path)
        with (
            running([["ingestor"]] * ingestors, env, RESULTS / "logs" / "ingest-drain") as procs,
            Wiring(settings).database.connect() as conn,
        ):
            cpu = ComponentCpu({"ingestor": [p.pid for p in procs]})
            first = wait_until(lambda: any_in(conn, "drain"), 120, interval_s=0.02)
            head = schedule_count(conn, "drain")
            cpu.start()
            finished = wait_until(lambda: all_in(conn, "drain", commands), 600, interval_s=0.05)
            cpu_s = cpu.spent()["ingestor"]
    # Timed from the first schedule in, so the rows that came with it (a whole ingestor batch when
    # the topic is full) are left out. With less than a batch after them, what is left is one
    # transaction's time, or nothing at all (N up to a batch: every row came with the first), and
    # no rate: not measured, rather than a figure of the wrong thing.
    from scheduler.ingest.ingestor import BATCH

    drained = commands - head
    if drained < BATCH:
        return {
            "drain_per_s": None,
            "drain_ingestor_cpu_us_per_command": None,
            "drain_not_measured": f"{drained:,} commands after the first batch; needs {BATCH:,} or more",
        }
    return {
        "drain_per_s": round(drained / max(finished - first, 1e-3), 1),
        "drain_ingestor_cpu_us_per_command": round(cpu_s / drained * 1e6, 1),
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


def run_ingest(commands: int, cli: int, partitions: int, ingestors: int = 1) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    missing = available()
    if missing is None and commands:
        figures |= run_avro(commands, partitions, ingestors)
        figures |= run_drain(commands, partitions, ingestors)
    else:
        figures |= {"avro_per_s": None, "avro_skipped": missing or "not asked for"}
    if cli:
        figures |= run_cli(cli, partitions)
    return figures


def show(figures: dict[str, Any]) -> None:
    table = Table("path", "schedules", "seconds", "schedules/s", "note", title="ingestion into PostgreSQL")
    if figures.get("avro_per_s") is not None:
        ingestors = figures.get("ingestors", 1)
        table.add_row(
            f"Avro commands → {ingestors} ingestor{'s' if ingestors > 1 else ''}",
            f"{figures['commands']:,}",
            str(figures["seconds"]),
            f"{figures['avro_per_s']:,}",
            f"scheduler produce alone: {figures['produce_per_s']:,} commands/s; "
            f"ingestor CPU {figures['ingestor_cpu_us_per_command']} µs per command",
        )
        drained = figures.get("drain_per_s")
        cpu = figures.get("drain_ingestor_cpu_us_per_command")
        table.add_row(
            "  the same, already on the topic",
            f"{figures['commands']:,}",
            "-",
            "-" if drained is None else f"{drained:,}",
            f"not measured: {figures.get('drain_not_measured')}"
            if drained is None
            else f"drained by fresh ingestors; CPU {cpu} µs per command",
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
    if figures.get("cost"):
        show_cost("Avro commands", figures["cost"], unit="command")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--commands", type=non_negative_int, default=10_000, help="Avro create commands (0 skips)"
    )
    parser.add_argument(
        "--cli", type=non_negative_int, default=20, help="schedules created with the CLI (0 skips)"
    )
    parser.add_argument("--partitions", type=positive_int, default=12)
    parser.add_argument("--ingestors", type=positive_int, default=1, help="ingestor processes in one group")
    args = parser.parse_args()
    figures = run_ingest(args.commands, args.cli, args.partitions, args.ingestors)
    show(figures)
    print(f"written to {record('ingest', figures)}")


if __name__ == "__main__":
    run_main(main)
