"""Firing precision: how late a job starts compared with the instant its schedule was due.

For each rate, ``rate x window`` delayed schedules are inserted in bulk a few seconds before the
window opens, with ``run_at`` spread evenly over it (so 1,000 fires/s for 10 s is 10,000
schedules, one due every millisecond). Their handler, ``bench.lag_handlers:stamp``, does nothing
but return the wall clock at its entry. The scanner, relay, reconciler and the workers run as
processes, warmed up first. From the ``runs`` table it reports, per fire:

- start lag (the headline percentiles): the handler's entry minus ``scheduled_for``, what a user
  feels and what the peers' figures measure (inside their task),
- attempt start (``attempt_start``): the run's ``started_at`` minus ``scheduled_for``; the worker
  announces that start before the handler runs (ahead of the instant for a held job),
- scan lag: ``created_at`` (the scanner's transaction) minus ``scheduled_for``, negative for a
  fire leased ahead (``SCHEDULER_LOOKAHEAD_S``),
- the fires whose handler entered more than ``LATE_MS`` late, and how many of them had been leased
  well ahead (then their lateness was the worker's, not the scan's);

and how long after the window closed the last job started (0 when the pipeline kept up).

The idle comparison runs the same 1,000 fires/s with many idle schedules in the table (half paused,
half active yearly crons whose next fire is months away, inserted with one ``insert ... select
generate_series``): the scanner reaches due schedules through a partial index ordered by due time,
so their number should not show in the lag. It also times the scanner's lease query itself.

    python -m bench.lag --rates 100,1000,5000 --window 10 --idle 1000,1000000
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg
from rich.table import Table

from bench.common import (
    BENCH_APP,
    RESULTS,
    check_components,
    component_env,
    console,
    create_bench_app,
    isolated_settings,
    ms_percentiles,
    non_negative_ints,
    pipeline_commands,
    positive_float,
    positive_int,
    positive_ints,
    record,
    run_main,
    running,
    warm_up,
)
from bench.cost import ComponentCpu, CostProbe, component_groups
from scheduler.store import query
from scheduler.store.scan import lease_schedules_params
from scheduler.wiring import Wiring

Conn = psycopg.Connection[Any]
LOGS = RESULTS / "logs"
WARM_UP_JOBS = 200
STAMP_HANDLER = "bench.lag_handlers:stamp"
LATE_MS = 5.0  # the p99 target at 1,000 fires/s
AHEAD_MS = 100.0


def insert_idle(conn: Conn, count: int) -> float:
    """``count`` schedules that never fire during the run, in one statement; returns seconds."""
    started = time.monotonic()
    conn.execute(
        "insert into schedules (id, app, name, kind, cron, handler, state, next_fire_at) "
        "select bench_id(), %s, 'idle-' || g, 'cron', '0 0 1 1 *', 'builtin:noop', "
        "       case when g %% 2 = 0 then 'paused' else 'active' end, "
        "       (date_trunc('year', now() at time zone 'UTC') + interval '1 year') at time zone 'UTC' "
        "  from generate_series(1, %s) g",
        (BENCH_APP, count),
    )
    conn.commit()
    # What autovacuum would soon do on its own; without it the planner guesses at a fresh table.
    conn.execute("analyze schedules")
    conn.commit()
    return time.monotonic() - started


def insert_window(
    conn: Conn, fires: int, window_s: float, lead_s: float, handler: str = "builtin:noop"
) -> float:
    """``fires`` delayed schedules of ``handler`` due evenly over ``window_s`` from ``lead_s`` after now.
    Returns how many seconds before the first fire the rows were committed (negative: late)."""
    step_us = window_s * 1_000_000 / fires
    opens = conn.execute("select now() + make_interval(secs => %s) as t0", (lead_s,)).fetchone()
    assert opens is not None
    conn.execute(
        "insert into schedules (id, app, name, kind, run_at, handler, next_fire_at) "
        "select bench_id(), %(app)s, 'lag-' || g, 'delayed', t, %(handler)s, t "
        "  from (select g, %(t0)s::timestamptz + (g - 1) * %(step)s * interval '1 microsecond' as t "
        "          from generate_series(1, %(n)s) g) fires",
        {"app": BENCH_APP, "t0": opens["t0"], "step": step_us, "n": fires, "handler": handler},
    )
    conn.execute("select pg_notify('scheduler_due', '')")
    conn.commit()
    ahead = conn.execute("select extract(epoch from %s - clock_timestamp())::float8 as s", (opens["t0"],))
    row = ahead.fetchone()
    conn.commit()
    assert row is not None
    return float(row["s"])


def wait_for_fires(conn: Conn, fires: int, timeout_s: float, stall_s: float) -> bool:
    """Wait until every fire's run succeeded; True if the pipeline stalled instead (no run
    succeeded for ``stall_s`` seconds while fires were left) or the time ran out. The poll reads
    runs only, so its cost does not depend on how many (idle) schedules there are."""
    deadline = time.monotonic() + timeout_s
    last_count, last_progress = -1, time.monotonic()
    while time.monotonic() < deadline:
        check_components()  # a component that exited is not a stall
        row = conn.execute("select count(*) as n from runs where state = 'succeeded'").fetchone()
        conn.commit()
        count = (row["n"] if row else 0) - WARM_UP_JOBS
        if count >= fires:
            return False
        if count != last_count:
            last_count, last_progress = count, time.monotonic()
        elif time.monotonic() - last_progress > stall_s:
            return True
        time.sleep(0.2)
    return True


def lease_query_ms(conn: Conn, batch: int, repeat: int = 20, lookahead_s: float = 1.0) -> float:
    """Median execution time of the scanner's lease query (rolled back, so nothing is leased)."""
    times = []
    sql = "explain (analyze, format json) " + query("lease_due_schedules")
    for _ in range(repeat):
        with conn.cursor(row_factory=psycopg.rows.tuple_row) as cur:
            cur.execute(sql, lease_schedules_params(batch, lookahead_s=lookahead_s))
            row = cur.fetchone()
        conn.rollback()
        assert row is not None
        times.append(float(row[0][0]["Execution Time"]))
    return round(statistics.median(times), 3)


def run_lag(
    rate: int,
    window_s: float,
    workers: int,
    concurrency: int,
    partitions: int,
    idle: int = 0,
    scan_batch: int = 2000,
    stall_s: float = 30.0,
    pg_options: str | None = None,
) -> dict[str, Any]:
    fires = max(1, round(rate * window_s))
    with isolated_settings(f"lag{rate}") as settings:
        wiring = Wiring(settings)
        create_bench_app(settings, partitions)
        idle_insert_s = None
        if idle:
            with wiring.database.connect() as conn:
                idle_insert_s = round(insert_idle(conn, idle), 2)
        env = component_env(
            settings,
            {
                "SCHEDULER_SCAN_BATCH_SIZE": str(scan_batch),
                "SCHEDULER_RELAY_BATCH_SIZE": str(scan_batch),
                "SCHEDULER_HANDLERS": STAMP_HANDLER.split(":")[0],
            }
            | ({"PGOPTIONS": pg_options} if pg_options else {}),
        )
        commands = pipeline_commands(workers, concurrency)
        with (
            running(commands, env, LOGS / f"lag-{rate}-{idle}") as procs,
            wiring.database.connect() as conn,
        ):
            time.sleep(3)  # the workers join their group
            warm_up(conn, WARM_UP_JOBS)
            # From the window's insert to its last start: what the fires cost each process.
            cpu = ComponentCpu(component_groups(commands, [p.pid for p in procs]))
            # PostgreSQL's too when it runs here, less this connection's (the insert and the polling
            # below are the benchmark's).
            probe = CostProbe(settings.database_url)
            probe.start()
            cpu.start()
            # Room for the bulk insert to commit before the first fire, more for bigger windows.
            lead_s = 2.0 + fires / 20_000
            ahead_s = insert_window(conn, fires, window_s, lead_s, STAMP_HANDLER)

            stalled = wait_for_fires(
                conn, fires, timeout_s=lead_s + window_s + max(120, fires / 200), stall_s=stall_s
            )
            component_cpu = cpu.finish(fires)
            server = probe.finish(fires, settle_s=0, watcher=conn.info.backend_pid).get("pg_cpu_ms_per_job")
            if server is not None:
                # Before ``all``, which it is part of: the line reads as a sum.
                components = component_cpu.pop("all")
                component_cpu["postgresql"] = server
                component_cpu["all"] = round(components + server, 4)
            # The measurement is over: fresh statistics keep the planner honest on the query below.
            conn.execute("analyze schedules, runs")
            # A fire that never started counts with the lag it had when the wait ended: a lower bound.
            rows: list[dict[str, Any]] = conn.execute(
                "select (coalesce((r.result ->> 'entered_at')::float8, "
                "                 extract(epoch from clock_timestamp())) "
                "          - extract(epoch from x.scheduled_for)) * 1000 as handler_ms, "
                "       extract(epoch from coalesce(r.started_at, clock_timestamp()) - x.scheduled_for) "
                "         * 1000 as start_ms, "
                "       extract(epoch from r.created_at - x.scheduled_for) * 1000 as scan_ms, "
                "       extract(epoch from coalesce(r.started_at, clock_timestamp()) - w.window_end) "
                "         as after_window_s, "
                "       r.started_at is not null as started "
                "  from (select id, run_at as scheduled_for from schedules where kind = 'delayed') x "
                "  left join runs r on r.schedule_id = x.id "
                " cross join (select max(run_at) as window_end from schedules where kind = 'delayed') w"
            ).fetchall()
            conn.commit()
            scan_query = lease_query_ms(conn, scan_batch)
    handler = [float(r["handler_ms"]) for r in rows]
    unstarted = sum(1 for r in rows if not r["started"])
    # Where a late start's time went: a fire leased well ahead of its instant was on the worker in
    # time (the look-ahead), so its lateness is the worker's; one leased after it, the scan's.
    late = [r for r in rows if float(r["handler_ms"]) > LATE_MS]
    leased_ahead = sum(1 for r in late if r["scan_ms"] is not None and float(r["scan_ms"]) < -AHEAD_MS)
    return {
        "rate_per_s": rate,
        "window_s": window_s,
        "fires": fires,
        "idle_schedules": idle,
        "workers": workers,
        "concurrency": concurrency,
        "partitions": partitions,
        # What a user feels and what the peers measure: the handler's entry minus the fire's instant.
        **ms_percentiles(handler),
        # The attempt's start as its run records it (started_at), announced before the handler runs.
        "attempt_start": ms_percentiles([float(r["start_ms"]) for r in rows]),
        "scan": ms_percentiles([float(r["scan_ms"]) for r in rows if r["scan_ms"] is not None]),
        # Stalled: no fire started for stall_s seconds; the percentiles are then lower bounds.
        "stalled": stalled,
        "unstarted": unstarted,
        "late": {"over_ms": LATE_MS, "fires": len(late), "leased_ahead": leased_ahead},
        "last_start_after_window_s": round(max(0.0, max(float(r["after_window_s"]) for r in rows)), 2),
        "inserted_ahead_s": round(ahead_s, 2),
        "idle_insert_s": idle_insert_s,
        "lease_query_ms": scan_query,
        "pg_options": pg_options,
        # The components', the broker's and PostgreSQL's (the server's, less the benchmark's connection).
        "cpu_ms_per_fire": component_cpu,
    }


def show(title: str, figures: dict[str, dict[str, Any]], key: str = "rate_per_s") -> None:
    out = console()
    table = Table(
        "rate/s" if key == "rate_per_s" else "idle",
        "fires",
        "p50",
        "p90",
        "p99",
        "max",
        "attempt start p99",
        "scan p99",
        "late s",
        "over 5 ms (leased ahead)",
        "lease q",
        title=f"{title} (handler start lag in ms; late s: last start after the window)",
    )
    for entry in figures.values():
        bound = "≥" if entry.get("stalled") else ""
        table.add_row(
            f"{entry[key]:,}",
            f"{entry['fires']:,}",
            *(bound + str(entry.get(k, "-")) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")),
            str(entry.get("attempt_start", {}).get("p99_ms", "-")),
            str(entry["scan"].get("p99_ms", "-")),
            str(entry["last_start_after_window_s"]),
            f"{entry['late']['fires']:,} ({entry['late']['leased_ahead']:,})" if "late" in entry else "-",
            str(entry["lease_query_ms"]),
        )
    out.print(table)
    for entry in figures.values():
        if entry.get("cpu_ms_per_fire"):
            parts = ", ".join(f"{name} {ms}" for name, ms in entry["cpu_ms_per_fire"].items())
            out.print(f"{entry[key]:,}: CPU ms per fire, from the window's insert to its last start: {parts}")
    for entry in figures.values():
        if entry.get("stalled"):
            out.print(
                f"[bold red]stalled[/] at {entry[key]:,}: {entry['unstarted']:,} of {entry['fires']:,} fires "
                "had not started when no progress was seen for the stall limit; ≥ marks lower bounds."
            )


def measure_rates(rates: list[int], window_s: float, **options: Any) -> dict[str, dict[str, Any]]:
    return {str(rate): run_lag(rate, window_s, **options) for rate in rates}


def measure_idle(
    idle_counts: list[int], rate: int, window_s: float, **options: Any
) -> dict[str, dict[str, Any]]:
    return {str(idle): run_lag(rate, window_s, idle=idle, **options) for idle in idle_counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rates", type=positive_ints, default=[100, 1000, 5000], help="fires per second, comma separated"
    )
    parser.add_argument(
        "--window", type=positive_float, default=10.0, help="seconds over which fires are spread"
    )
    parser.add_argument(
        "--idle", type=non_negative_ints, default=[1000, 1_000_000], help="idle schedule counts ('' skips)"
    )
    parser.add_argument("--idle-rate", type=positive_int, default=1000)
    parser.add_argument("--workers", type=positive_int, default=4)
    parser.add_argument("--concurrency", type=positive_int, default=64)
    parser.add_argument("--partitions", type=positive_int, default=12)
    parser.add_argument(
        "--stall", type=positive_float, default=30.0, help="give up after this long without progress"
    )
    parser.add_argument("--pg-options", help="PGOPTIONS for the components, e.g. '-c plan_cache_mode=...'")
    args = parser.parse_args()
    options = {
        "workers": args.workers,
        "concurrency": args.concurrency,
        "partitions": args.partitions,
        "stall_s": args.stall,
        "pg_options": args.pg_options,
    }
    if args.rates:
        lag = measure_rates(args.rates, args.window, **options)
        show("start lag by load", lag)
        print(f"written to {record('lag', lag)}")
    if args.idle:
        idle = measure_idle(args.idle, args.idle_rate, args.window, **options)
        show(f"start lag at {args.idle_rate}/s by idle schedules", idle, key="idle_schedules")
        print(f"written to {record('lag_idle', idle)}")


if __name__ == "__main__":
    run_main(main)
