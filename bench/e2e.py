"""End to end: N immediate ``builtin:noop`` jobs through the whole pipeline, on the local stack.

All N schedules become due at one database instant T0 (inserted in bulk; ingestion is measured
elsewhere). Jobs per second is N over the time from T0 until the last run is reconciled
(``succeeded`` in PostgreSQL). Per job it reports each stage: scan (due → run created), relay and
pickup (created → worker started), run (started → finished) and reconcile (finished → outcome
applied), and the whole (due → reconciled), what the run cost PostgreSQL and Kafka per job
(``bench/cost.py``), and the CPU per job of each component, the broker and PostgreSQL.

    python -m bench.e2e --jobs 10000 --partitions 12 --workers 4 --concurrency 64
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import (
    RESULTS,
    component_env,
    isolated_settings,
    percentiles,
    positive_int,
    record,
    run_main,
    running,
    wait_until,
)
from bench.cost import (
    ComponentCpu,
    CostProbe,
    Watcher,
    component_groups,
    local_kafka_data,
    show_component_cpu,
    show_cost,
)
from scheduler.schedule import service
from scheduler.wiring import Wiring

STAGES = {
    "scan": ("scheduled_for", "created_at"),
    # The relay records nothing on the run (it only deletes the outbox row), so publishing and the
    # worker's pickup are one stage.
    "relay_and_pickup": ("created_at", "started_at"),
    "run": ("started_at", "finished_at"),
    "reconcile": ("finished_at", "reconciled_at"),
    "end_to_end": ("scheduled_for", "reconciled_at"),
}


def run_e2e(
    jobs: int, partitions: int, workers: int, concurrency: int, scanners: int = 1, relays: int = 1
) -> dict[str, Any]:
    with isolated_settings("e2e") as settings:
        wiring = Wiring(settings)
        with wiring.database.connect() as conn:
            service.create_app(conn, wiring.admin, settings, "bench", partitions, "bench")
        commands = [["scanner"]] * scanners + [["relay"]] * relays + [["reconciler"]]
        commands += [["worker", "--app", "bench", "--concurrency", str(concurrency)]] * workers
        env = component_env(
            settings, {"SCHEDULER_SCAN_BATCH_SIZE": "2000", "SCHEDULER_RELAY_BATCH_SIZE": "2000"}
        )
        probe = CostProbe(
            settings.database_url, kafka_data=local_kafka_data(), topic_prefix=settings.topic_prefix + "."
        )
        # The insert on one connection, the polling for the end on another (the watcher), whose
        # statements, transactions and backend's CPU the probe leaves out: they are the
        # benchmark's, not the scheduler's.
        with (
            running(commands, env, RESULTS / "logs" / "e2e") as procs,
            wiring.database.connect() as conn,
            Watcher(settings.database_url) as watch,
        ):
            time.sleep(3)  # let the workers join their group before the burst
            cpu = ComponentCpu(component_groups(commands, [p.pid for p in procs]))
            # From before the schedules' insert, as the peers are measured from before their enqueue.
            probe.start()
            cpu.start()
            started = time.monotonic()
            conn.execute(
                "insert into schedules (id, app, name, kind, handler, next_fire_at) "
                "select bench_id(), 'bench', 'noop-' || g, 'immediate', 'builtin:noop', now() "
                "from generate_series(1, %s) g",
                (jobs,),
            )
            conn.execute("select pg_notify('scheduler_due', '')")
            conn.commit()

            def all_done() -> bool:
                row = watch.fetchone("select count(*) as n from runs where state = 'succeeded'")
                return row is not None and row["n"] >= jobs

            finished = wait_until(all_done, timeout_s=600, interval_s=0.05)
            elapsed = finished - started
            # Read before the components stop, so their shutdown is not counted.
            component_cpu = cpu.finish(jobs)
            cost = probe.finish(jobs, watcher=watch)
            rows: list[dict[str, Any]] = conn.execute(
                "select scheduled_for, created_at, dispatched_at, started_at, finished_at, reconciled_at "
                "  from runs"
            ).fetchall()
            duplicates = conn.execute(
                "select count(*) filter (where outcome = 'duplicate') as duplicate, "
                "count(*) filter (where outcome = 'stale') as stale from attempts"
            ).fetchone()
    stages = {}
    for stage, (start, end) in STAGES.items():
        values = [
            (row[end] - row[start]).total_seconds() * 1000
            for row in rows
            if row[start] is not None and row[end]
        ]
        stages[stage] = percentiles(values)
    return {
        "jobs": jobs,
        "partitions": partitions,
        "workers": workers,
        "concurrency": concurrency,
        "scanners": scanners,
        "relays": relays,
        "seconds": round(elapsed, 2),
        "jobs_per_s": round(jobs / elapsed, 1),
        "latency_ms": stages["end_to_end"],
        "stages_ms": stages,
        "duplicate_outcomes": duplicates,
        "cost": cost,
        "cpu_ms_per_job": component_cpu,
    }


def show(figures: dict[str, Any]) -> None:
    console = Console()
    console.print(
        f"[bold]{figures['jobs']} noop jobs[/], {figures['partitions']} partitions, "
        f"{figures['workers']} workers x {figures['concurrency']}: "
        f"[bold]{figures['jobs_per_s']} jobs/s[/] ({figures['seconds']} s)"
    )
    table = Table("stage", "p50 ms", "p90 ms", "p99 ms", "max ms")
    for stage, q in figures["stages_ms"].items():
        table.add_row(stage, *(str(q.get(k, "-")) for k in ("p50", "p90", "p99", "max")))
    console.print(table)
    if "cost" in figures:
        show_cost("e2e", figures["cost"])
    if "cpu_ms_per_job" in figures:
        show_component_cpu(figures["cpu_ms_per_job"], figures.get("cost", {}).get("pg_cpu_ms_per_job"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=positive_int, default=10_000)
    parser.add_argument("--partitions", type=positive_int, default=12)
    parser.add_argument("--workers", type=positive_int, default=4)
    parser.add_argument("--concurrency", type=positive_int, default=64)
    parser.add_argument("--scanners", type=positive_int, default=1)
    parser.add_argument("--relays", type=positive_int, default=1)
    args = parser.parse_args()
    figures = run_e2e(args.jobs, args.partitions, args.workers, args.concurrency, args.scanners, args.relays)
    show(figures)
    print(f"written to {record('e2e', figures)}")


if __name__ == "__main__":
    run_main(main)
