"""PgQueuer on the same PostgreSQL: no-op jobs drained by worker processes, then delayed jobs.

Runs in the peers' virtualenv (see ``harness``). A fresh database gets PgQueuer's schema
(``pgq install``, durable tables, as ours); each worker process runs one ``QueueManager`` on an
asyncpg connection with an async no-op entrypoint. Throughput: N jobs enqueued in one batch
statement, timed from before the enqueue until PgQueuer's queue table is empty (every job done and
acknowledged). Delayed jobs: ``execute_after`` spread evenly over the window; lag is the handler's
start minus the job's ``execute_after`` as PostgreSQL stored it.

The throughput phase is also measured as ours is (``bench/cost.py``'s ``CostProbe``, imported from
the repository, which needs only psycopg): WAL, server CPU, statements and transactions per job,
written under ``cost`` in the figures. ``--autovac`` applies ``pgq autovac`` after the install (the
autovacuum and fillfactor settings of PgQueuer's performance-tuning guide).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import harness
import psycopg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

if TYPE_CHECKING:
    from bench.cost import CostProbe, Watcher

ENTRYPOINT = "noop"
QUEUE_TABLE = "pgqueuer"
REPOSITORY = Path(__file__).resolve().parents[2]


def worker(dsn: str, work_dir: str, batch_size: int) -> None:
    async def main() -> None:
        connection = await asyncpg.connect(dsn)
        manager = QueueManager(Queries(AsyncpgDriver(connection)))
        recorder = harness.Recorder(work_dir)

        @manager.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            recorder.started((job.payload or b"?").decode(), job.execute_after.timestamp())

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, manager.shutdown.set)
        await manager.run(batch_size=batch_size)

    asyncio.run(main())


def enqueue(dsn: str, keys: list[str], delays: list[timedelta] | None) -> None:
    async def main() -> None:
        connection = await asyncpg.connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(connection))
            await queries.enqueue(
                [ENTRYPOINT] * len(keys), [key.encode() for key in keys], [0] * len(keys), delays
            )
        finally:
            await connection.close()

    asyncio.run(main())


def left(watch: Watcher) -> int:
    """Jobs in the queue, counted by the probe's watcher."""
    row = watch.fetchone(f"select count(*) as n from {QUEUE_TABLE}")
    return int(row["n"]) if row else 0


def queued(conn: psycopg.Connection) -> int:
    """Jobs in the queue, marked as the benchmark's own as the watcher's polls are (the same
    statement: ``pg_stat_statements`` keeps the text it first came with)."""
    from bench.cost import observed

    row = conn.execute(observed(f"select count(*) as n from {QUEUE_TABLE}")).fetchone()
    return int(row[0]) if row else 0


def cost_probe(dsn: str) -> tuple[CostProbe, Watcher]:
    """The probe our e2e run is measured with, so both are read the same way, and the connection
    that polls for the end, whose statements, transactions and CPU the probe leaves out, as ours."""
    from bench.cost import CostProbe, Watcher

    return CostProbe(dsn), Watcher(dsn)


def main() -> None:
    # ``bench.cost`` is imported from the repository: this script runs from ``bench/peers`` in
    # another virtualenv, so the repository's root goes on the path first.
    if str(REPOSITORY) not in sys.path:
        sys.path.insert(0, str(REPOSITORY))
    args = harness.arguments(__doc__.splitlines()[0])
    dsn_arg = sys.argv[sys.argv.index("--dsn") + 1]
    batch_size = int(sys.argv[sys.argv.index("--batch-size") + 1]) if "--batch-size" in sys.argv else 10
    autovac = "--autovac" in sys.argv
    if args.worker:
        worker(dsn_arg, args.work_dir, batch_size)
        return
    name = f"bench_pgq_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn_arg, autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
    dsn = dsn_arg.rsplit("/", 1)[0] + f"/{name}"
    workers: list[subprocess.Popen[bytes]] = []
    try:
        subprocess.run(
            [sys.executable, "-m", "pgqueuer", "--pg-dsn", dsn, "install"],
            check=True,
            capture_output=True,
        )
        if autovac:
            subprocess.run(
                [sys.executable, "-m", "pgqueuer", "--pg-dsn", dsn, "autovac"],
                check=True,
                capture_output=True,
            )
        work_dir = tempfile.mkdtemp(prefix="pgq-", dir=args.work_dir)
        command = [sys.executable, __file__, "--worker", "--dsn", dsn, "--work-dir", work_dir]
        workers = harness.start([[*command, "--batch-size", str(batch_size), "--out", "-"]] * args.workers)
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue(dsn, [f"w{i}" for i in range(200)], None)
            harness.wait_until(lambda: queued(conn) == 0, 120)

            probe, watch = cost_probe(dsn)
            with watch:
                probe.start()
                started = time.monotonic()
                enqueue(dsn, [f"t{i}" for i in range(args.jobs)], None)
                enqueued = time.monotonic()
                finished = harness.wait_until(lambda: left(watch) == 0, 600)
                # Read while the workers still run, as ours is read before its components stop; the
                # count(*) polling above is the watcher's, left out as our e2e run's is.
                cost = probe.finish(args.jobs, watcher=watch)

            fires = max(1, round(args.rate * args.window))
            lead_s = 2.0 + fires / 20_000
            step_s = args.window / fires
            enqueue(
                dsn,
                [f"l{i}" for i in range(fires)],
                [timedelta(seconds=lead_s + i * step_s) for i in range(fires)],
            )
            row = conn.execute(
                "select extract(epoch from min(execute_after) - clock_timestamp())::float8 "
                f"from {QUEUE_TABLE}"
            ).fetchone()
            ahead_s = float(row[0]) if row and row[0] is not None else 0.0
            harness.wait_until(lambda: queued(conn) == 0, lead_s + args.window + 300, interval_s=0.2)
        harness.stop(workers)
        lag = harness.read_starts(work_dir, "l")
        throughput_keys = {key for key, _, _ in harness.read_starts(work_dir, "t")}
        harness.write(
            args.out,
            {
                "system": "pgqueuer",
                "config": f"{args.workers} processes x QueueManager(batch_size={batch_size}), asyncpg, "
                + ("durable tables with pgq autovac" if autovac else "durable tables"),
                "jobs": args.jobs,
                "jobs_done": len(throughput_keys),
                "seconds": finished - started,
                "enqueue_s": enqueued - started,
                "fires": fires,
                "lag_ms": harness.lag_ms(lag),
                "lag_duplicates": len(lag) - len({key for key, _, _ in lag}),
                "inserted_ahead_s": ahead_s,
                "cost": cost,
            },
        )
    finally:
        harness.stop(workers)
        with psycopg.connect(dsn_arg, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')


if __name__ == "__main__":
    main()
