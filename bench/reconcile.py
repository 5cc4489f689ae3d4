"""The reconciler's one statement alone: PostgreSQL's CPU per outcome event, by batch size.

``apply_outcomes`` (``scheduler/store/queries/reconcile.sql``) applies a whole batch of outcome
events in one statement; the reconciler's batch is whatever its consumer brings in one poll (up to
2,000 events), small when it keeps up and large when it catches up. This runs the statement on its
own, from one connection whose backend's CPU is read from ``/proc`` (the local stack), for the
batch sizes given, so that the fixed cost of a statement and the cost of each event can be told
apart and a plan that grows with the batch shows at once:

    python -m bench.reconcile --batches 10,100,500,2000

The tables first hold ``--history`` succeeded runs (one in twenty with a retry in ``attempts``).
For each batch size, ``--runs`` fresh runs (created by the scanner, then ``vacuum analyze``, as
autovacuum leaves a busy table) each get a start and a success, in batches that hold the starts of
half their runs and the successes of the half before, as a reconciler behind on a busy pipeline
reads them. A batch of up to ``PREPARED_PLAN_MAX_EVENTS`` runs the server's prepared plan, a
larger one is planned for its size; the ``prepared`` column counts the statements that ran the
former's generic plan. Figures go to ``results/latest.json`` under ``reconcile``.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
from rich.table import Table

from bench.common import (
    BENCH_APP,
    console,
    create_bench_app,
    isolated_settings,
    non_negative_int,
    positive_int,
    positive_ints,
    record,
    run_main,
)
from bench.cost import process_cpu_seconds
from bench.scale import load_history
from scheduler.store.reconcile import OutcomeEvent, apply_outcomes
from scheduler.wiring import Wiring

WORKERS = tuple(f"worker-{i}" for i in range(4))
LEASE_WINDOW_S = 60.0


def _batches(runs: list[UUID], size: int) -> list[list[OutcomeEvent]]:
    """Starts of half a batch's runs with the successes of the half before, in event order."""
    now = datetime.now(UTC)
    worker = {run: WORKERS[i % len(WORKERS)] for i, run in enumerate(runs)}

    def started(run: UUID) -> OutcomeEvent:
        return OutcomeEvent(str(uuid.uuid4()), run, 1, "started", worker[run], now, None, app=BENCH_APP)

    def succeeded(run: UUID) -> OutcomeEvent:
        return OutcomeEvent(str(uuid.uuid4()), run, 1, "succeeded", worker[run], now, now, app=BENCH_APP)

    half = max(1, size // 2)
    events: list[OutcomeEvent] = []
    for i in range(0, len(runs) + half, half):
        events.extend(started(run) for run in runs[i : i + half])
        events.extend(succeeded(run) for run in runs[max(0, i - half) : i])
    return [events[i : i + size] for i in range(0, len(events), size)]


def _history(conn: psycopg.Connection[Any], admin: psycopg.Connection[Any], count: int) -> None:
    """``count`` succeeded runs over the last 30 days (``bench.scale``'s long history), one in twenty
    with a retry on record, as a table that has been in service holds them."""
    load_history(conn, admin, count)
    conn.execute(
        "insert into attempts (run_id, attempt, kind, outcome, worker, started_at, finished_at, error) "
        "select id, 1, 'retry', 'applied', worker, started_at, finished_at, 'Error: bench' "
        "  from runs where state = 'succeeded' and random() < 0.05"
    )
    conn.commit()


def _pending_runs(
    conn: psycopg.Connection[Any], admin: psycopg.Connection[Any], wiring: Wiring, count: int
) -> list[UUID]:
    conn.execute(
        "insert into schedules (id, app, name, kind, handler, next_fire_at) "
        "select bench_id(), 'bench', 'noop-' || g, 'immediate', 'builtin:noop', now() "
        "from generate_series(1, %s) g",
        (count,),
    )
    conn.commit()
    scanner = wiring.scanner()
    while scanner.scan_once(conn).created:
        pass
    # The relay's work is not measured here; the runs stay pending, as the relay leaves them.
    conn.execute("delete from outbox")
    conn.commit()
    admin.execute("vacuum analyze")
    runs = [row["id"] for row in conn.execute("select id from runs where state = 'pending' order by id")]
    conn.commit()  # each batch below is a transaction of its own, as the reconciler's are
    return runs


def _plans(conn: psycopg.Connection[Any]) -> int:
    """How many times this connection's prepared apply_outcomes ran its generic plan so far (the
    server plans the first five executions of each prepared statement for their parameters)."""
    row = conn.execute(
        "select coalesce(sum(generic_plans), 0)::int as n from pg_prepared_statements "
        "where statement like '%with received as%'"
    ).fetchone()
    conn.commit()
    return 0 if row is None else int(row["n"])


def measure(batch_sizes: list[int], runs_per_size: int, history: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with isolated_settings("reconcile") as settings:
        wiring = Wiring(settings)
        create_bench_app(settings, 1)
        with wiring.database.connect() as conn, wiring.database.connect(autocommit=True) as admin:
            if history:
                _history(conn, admin, history)
            runs = _pending_runs(conn, admin, wiring, runs_per_size * len(batch_sizes))
            backend = conn.info.backend_pid
            seen_plans = _plans(conn)
            for index, size in enumerate(batch_sizes):
                batches = _batches(runs[index * runs_per_size : (index + 1) * runs_per_size], size)
                events = sum(len(batch) for batch in batches)
                cpu_before = process_cpu_seconds(backend, with_children=False)
                wall_before = time.perf_counter()
                applied = 0
                for batch in batches:
                    with conn.transaction():
                        applied += apply_outcomes(conn, batch, LEASE_WINDOW_S).applied
                cpu = process_cpu_seconds(backend, with_children=False) - cpu_before
                wall = time.perf_counter() - wall_before
                plans = _plans(conn)
                figures[str(size)] = {
                    "events": events,
                    "applied": applied,
                    "statements": len(batches),
                    "backend_cpu_us_per_event": round(cpu * 1e6 / events, 1),
                    "backend_cpu_ms_per_statement": round(cpu * 1e3 / len(batches), 2),
                    "wall_us_per_event": round(wall * 1e6 / events, 1),
                    # Statements run with the server's prepared generic plan; the others were planned
                    # for their batch (see PREPARED_PLAN_MAX_EVENTS).
                    "prepared": plans - seen_plans,
                }
                seen_plans = plans
    return figures


def show(figures: dict[str, Any]) -> None:
    table = Table(title="apply_outcomes: PostgreSQL backend CPU by batch size")
    columns = (
        "batch",
        "prepared",
        "events",
        "applied",
        "statements",
        "CPU µs/event",
        "CPU ms/statement",
        "wall µs/event",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for size, row in figures.items():
        table.add_row(
            size,
            f"{row['prepared']:,}",
            f"{row['events']:,}",
            f"{row['applied']:,}",
            f"{row['statements']:,}",
            f"{row['backend_cpu_us_per_event']:.1f}",
            f"{row['backend_cpu_ms_per_statement']:.2f}",
            f"{row['wall_us_per_event']:.1f}",
        )
    console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batches", type=positive_ints, default=[10, 100, 500, 2000], help="events per statement"
    )
    parser.add_argument(
        "--runs", type=positive_int, default=4000, help="runs per batch size (two events each)"
    )
    parser.add_argument(
        "--history", type=non_negative_int, default=1_000_000, help="succeeded runs already in the table"
    )
    args = parser.parse_args()
    figures = measure(args.batches, args.runs, args.history)
    show(figures)
    print(f"written to {record('reconcile', figures)}")


if __name__ == "__main__":
    run_main(main)
