"""Scale: what the pipeline does with many jobs in flight, many active schedules and a long history.

Three steps, each on a database and topic prefix of its own, the components as processes:

- ``inflight``: one worker (``--concurrency`` as large as the jobs) given ``--inflight`` immediate
  ``builtin:sleep`` jobs of 30 s (an async handler: one coroutine per job on the worker's loop).
  Sampled every 0.5 s: runs in state ``running`` (PostgreSQL), the worker's resident memory
  (``VmRSS``) and CPU. Also the exact overlap of the runs' ``started_at``/``finished_at`` and the
  time until every job succeeded.
- ``cron``: ``--cron`` active cron schedules that really fire (``H H * * * *``: each one hourly at
  its own hashed minute and second, about 278 fires/s for a million), their ``next_fire_at``
  computed in SQL exactly as the domain's cron code does (checked on a sample), then 60 s of
  firing measured: fires per second, scan lag (runs' ``created_at`` and the scanner's
  ``scheduler_scan_lag_seconds`` gauge), start lag, the lease query; and the same rate from about
  1,000 schedules (``H/S * * * * *``) for comparison.
- ``history``: ``--runs`` terminal runs of ``--runs / 1000`` schedules spread over 30 days, loaded
  with ``generate_series`` in chunks and vacuumed; then the scanner's lease queries, start lag at
  1,000 fires/s, the API's lists of runs and ``scheduler runs list``; and the same on 10,000 runs.

    python -m bench.scale --only inflight,cron,history --inflight 5000 --cron 1000000 --runs 10000000
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]  # no stubs; only Process and cpu_times are used
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb
from rich.table import Table

from bench.api import rate_limits_beyond_any_load, tokens
from bench.chaos_stack import free_port_range
from bench.common import (
    BENCH_APP,
    RESULTS,
    check_components,
    component_env,
    console,
    create_bench_app,
    isolated_settings,
    latest,
    ms_percentiles,
    percentiles,
    pipeline_commands,
    positive_float,
    positive_int,
    record,
    run_main,
    running,
    wait_until,
)
from bench.cost import ComponentCpu
from bench.lag import insert_window, lease_query_ms
from scheduler.config import Settings
from scheduler.domain.cron import CronSchedule
from scheduler.reconcile import retention
from scheduler.store import query
from scheduler.store.scan import lease_retries_params, lease_schedules_params
from scheduler.wiring import Wiring

Conn = psycopg.Connection[Any]
STEPS = ("inflight", "cron", "history")
LOGS = RESULTS / "logs" / "scale"
SAMPLE_EVERY_S = 0.5
SCAN_BATCH = 2000
WARM_UP_JOBS = 200
CRON_WINDOW_S = 60
SMALL_CRON = 1000
SMALL_RUNS = 10_000
RUNS_PER_SCHEDULE = 1000
HISTORY_DAYS = 30
RUN_CHUNK = 1_000_000
LAG_RATE = 1000
LAG_WINDOW_S = 10.0
# The history step's retention: half of its 30 days expire, and the sweep is timed for at most this.
RETENTION_DAYS = 15.0
RETENTION_SWEEP_S = 60.0
API_CALLS = 50
CLI_CALLS = 5
# The runs a page holds where the step reads a schedule's runs, and the page after it.
API_PAGE = 50


# --- what every step shares ----------------------------------------------------------------------


def pipeline_env(settings: Settings, extra: dict[str, str] | None = None) -> dict[str, str]:
    batches = {"SCHEDULER_SCAN_BATCH_SIZE": str(SCAN_BATCH), "SCHEDULER_RELAY_BATCH_SIZE": str(SCAN_BATCH)}
    # The history step's runs go back 30 days: the reconciler's retention must not delete them
    # while the pipeline is measured over them (the step times the retention on its own).
    keep = {"SCHEDULER_HISTORY_RETENTION_DAYS": "0"}
    return component_env(settings, batches | keep | (extra or {}))


def db_epoch(conn: Conn) -> float:
    row = conn.execute("select extract(epoch from clock_timestamp())::float8 as t").fetchone()
    conn.commit()
    assert row is not None
    return float(row["t"])


def warm_up(conn: Conn, jobs: int = WARM_UP_JOBS, timeout_s: float = 120) -> float:
    """``jobs`` immediate no-op jobs through the pipeline (connections open, the consumer group
    settled). Unlike ``bench.common.warm_up`` the wait reads only the runs fired since, through
    ``runs_app_fired``: its cost does not grow with a million schedules or ten million runs."""
    started = time.monotonic()
    row = conn.execute("select now() as t").fetchone()
    assert row is not None
    since = row["t"]
    conn.execute(
        "insert into schedules (id, app, name, kind, handler, next_fire_at) "
        "select bench_id(), %s, 'warmup-' || g, 'immediate', 'builtin:noop', now() "
        "from generate_series(1, %s) g",
        (BENCH_APP, jobs),
    )
    conn.execute("select pg_notify('scheduler_due', '')")
    conn.commit()
    wait_until(lambda: succeeded_since(conn, since) >= jobs, timeout_s, interval_s=0.1)
    return round(time.monotonic() - started, 2)


def succeeded_since(conn: Conn, since: datetime) -> int:
    """Runs of the bench app fired at or after ``since`` that succeeded: a range of runs_app_fired.
    (By ``created_at`` it became a scan of the whole table once that index replaced the one on
    (app, created_at): the wait itself then took 1.4 s a poll over 10,000,000 runs, and a core.)"""
    row = conn.execute(
        "select count(*) as n from runs where app = %s and scheduled_for >= %s and state = 'succeeded'",
        (BENCH_APP, since),
    ).fetchone()
    conn.commit()
    return int(row["n"]) if row else 0


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process from ``/proc/<pid>/status`` (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


class CpuWindow:
    """CPU used over a window by named processes and by the PostgreSQL backends of the bench's
    database (the components keep their connections, so the backends seen at both ends count)."""

    def __init__(self, conn: Conn, procs: dict[str, int]) -> None:
        self.conn, self.procs = conn, procs

    def _backends(self) -> dict[int, float]:
        rows = self.conn.execute(
            "select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()"
        ).fetchall()
        self.conn.commit()
        found = {}
        for row in rows:
            with suppress(psutil.Error):
                times = psutil.Process(row["pid"]).cpu_times()
                found[int(row["pid"])] = float(times.user + times.system)
        return found

    def start(self) -> None:
        self.started = time.monotonic()
        self.components = ComponentCpu({name: [pid] for name, pid in self.procs.items()})
        self.components.start()
        self.backends = self._backends()
        psutil.cpu_percent(interval=None)

    def stop(self) -> dict[str, float]:
        """Per process and for PostgreSQL: % of one core; ``machine``: % of all cores."""
        wall = time.monotonic() - self.started
        machine = psutil.cpu_percent(interval=None)
        after = self._backends()
        postgres = sum(after[pid] - before for pid, before in self.backends.items() if pid in after)
        spent = self.components.spent()
        figures = {name: round(spent.get(name, 0.0) / wall * 100, 1) for name in self.procs}
        return figures | {"postgres": round(postgres / wall * 100, 1), "machine": round(machine, 1)}


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def disk_free_gb() -> float:
    return round(shutil.disk_usage(RESULTS.parent).free / 1e9, 1)


def plan_median_ms(conn: Conn, sql: str, params: dict[str, Any], repeat: int) -> dict[str, Any]:
    """Median execution time of ``explain analyze`` (rolled back: a lease locks nothing for long)
    and how the plan reaches its tables: a ``Seq Scan`` on a big table is what to look for."""
    times, plan = [], None
    for _ in range(repeat):
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute("explain (analyze, format json) " + sql, params)
            row = cur.fetchone()
        conn.rollback()
        assert row is not None
        times.append(float(row[0][0]["Execution Time"]))
        plan = row[0][0]["Plan"]
    return {"median_ms": round(statistics.median(times), 3), "scans": sorted(set(plan_scans(plan)))}


def plan_scans(node: dict[str, Any] | None) -> Iterator[str]:
    """``Seq Scan on runs``, ``Index Scan on runs (runs_pkey)``: every scan node of a plan."""
    if node is None:
        return
    if "Relation Name" in node:
        index = f" ({node['Index Name']})" if "Index Name" in node else ""
        # A hash join whose other side came back empty never reads its table: no cost today.
        unused = " (never executed)" if node.get("Actual Loops") == 0 else ""
        yield f"{node['Node Type']} on {node['Relation Name']}{index}{unused}"
    for child in node.get("Plans", []):
        yield from plan_scans(child)


def scheduler_command() -> list[str]:
    return [sys.executable, "-m", "scheduler"]


# --- 1. jobs in flight in one worker ------------------------------------------------------------------


def max_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end at t closes before a start at t opens)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = best = 0
    for _, change in events:
        open_now += change
        best = max(best, open_now)
    return best


def plateau(samples: Sequence[tuple[int, float]], jobs: int) -> float | None:
    """Median RSS over the samples taken while at least 99 % of the jobs were running."""
    values = [rss for running_now, rss in samples if running_now >= 0.99 * jobs]
    return round(statistics.median(values), 1) if values else None


def run_inflight(jobs: int, seconds: float, partitions: int) -> dict[str, Any]:
    with isolated_settings("scale_inflight") as settings:
        create_bench_app(settings, partitions)
        commands = [
            ["scanner"],
            ["relay"],
            ["reconciler"],
            ["worker", "--app", BENCH_APP, "--concurrency", str(jobs)],
        ]
        wiring = Wiring(settings)
        with (
            running(commands, pipeline_env(settings), LOGS / "inflight") as procs,
            wiring.database.connect() as conn,
        ):
            worker = procs[3].pid
            warm_up(conn)
            idle_rss = rss_mb(worker)
            load_before = load_average()
            t0 = db_epoch(conn)
            conn.execute(
                "insert into schedules (id, app, name, kind, handler, payload, next_fire_at) "
                "select bench_id(), %s, 'inflight-' || g, 'immediate', 'builtin:sleep', %s, now() "
                "from generate_series(1, %s) g",
                (BENCH_APP, Jsonb({"seconds": seconds}), jobs),
            )
            conn.execute("select pg_notify('scheduler_due', '')")
            conn.commit()
            worker_cpu_since = ComponentCpu({"worker": [worker]})
            worker_cpu_since.start()
            wall_before = time.monotonic()
            samples: list[tuple[int, float]] = []
            deadline = time.monotonic() + seconds + max(300.0, jobs / 20)
            succeeded = 0
            while time.monotonic() < deadline:
                check_components()
                row = conn.execute(
                    "select count(*) filter (where state = 'running') as running, "
                    "       count(*) filter (where state = 'succeeded') as succeeded "
                    "  from runs where created_at >= to_timestamp(%s)",
                    (t0,),
                ).fetchone()
                conn.commit()
                rss = rss_mb(worker)
                assert row is not None
                if rss is not None:
                    samples.append((int(row["running"]), rss))
                succeeded = int(row["succeeded"])
                if succeeded >= jobs:
                    break
                time.sleep(SAMPLE_EVERY_S)
            worker_cpu = worker_cpu_since.spent().get("worker", 0.0)
            wall = time.monotonic() - wall_before
            times = conn.execute(
                "select extract(epoch from started_at)::float8 as s, "
                "       extract(epoch from finished_at)::float8 as f "
                "  from runs where created_at >= to_timestamp(%s) and started_at is not null",
                (t0,),
            ).fetchall()
            conn.commit()
    finished = [r for r in times if r["f"] is not None]
    return {
        "jobs": jobs,
        "sleep_s": seconds,
        "handler": "builtin:sleep (async)",
        "succeeded": succeeded,
        "max_running_sampled": max((n for n, _ in samples), default=0),
        "max_in_flight_exact": max_overlap([(r["s"], r["f"]) for r in finished]),
        "all_started_s": round(max(r["s"] for r in times) - t0, 2) if times else None,
        "all_succeeded_s": round(max(r["f"] for r in finished) - t0, 2) if finished else None,
        "rss_idle_mb": idle_rss,
        "rss_max_mb": max((rss for _, rss in samples), default=None),
        "rss_plateau_mb": plateau(samples, jobs),
        "worker_cpu_s": round(worker_cpu, 1),
        "worker_cpu_pct": round(worker_cpu / wall * 100, 1),
        "samples": len(samples),
        "target": {"in_flight": 5000, "rss_mb": 500},
        "load_average": {"before": load_before, "after": load_average()},
    }


# --- 2. many active cron schedules ---------------------------------------------------------------


def hashed_sql(field: str, size: int) -> str:
    """What ``scheduler.domain.cron._hashed(str(id), field, size)`` computes, in SQL over ``id``:
    the first 8 bytes of sha256(id NUL field) as an unsigned integer, modulo ``size``. Split in two
    32-bit halves, since bigint is signed."""
    seed = f"convert_to(id::text, 'UTF8') || '\\x00'::bytea || convert_to('{field}', 'UTF8')"
    digest = f"encode(sha256({seed}), 'hex')"
    high = f"('x' || substr({digest}, 1, 8))::bit(32)::bigint"
    low = f"('x' || substr({digest}, 9, 8))::bit(32)::bigint"
    return f"mod(mod({high}, {size}) * {2**32 % size} + {low}, {size})"


@dataclass(frozen=True, slots=True)
class Spread:
    """A cron expression whose ``H`` fields give each schedule one fire every ``period_s`` seconds
    at its own ``offset_sql`` (seconds into the period, in SQL over ``id``), UTC: periods that
    divide an hour, so a period's start is a multiple of it in epoch seconds too."""

    expression: str
    period_s: int
    offset_sql: str

    @property
    def rate_per_schedule(self) -> float:
        return 1 / self.period_s


def hourly_spread(every_minutes: int) -> Spread:
    """``H H/M * * * *`` (``H H * * * *`` for 60): the second hashed over 0-59, the minute's start
    over 0-(M-1)."""
    if 60 % every_minutes:
        raise ValueError("--cron-every must divide 60")
    expression = "H H * * * *" if every_minutes == 60 else f"H H/{every_minutes} * * * *"
    offset = f"{hashed_sql('minute', every_minutes)} * 60 + {hashed_sql('second', 60)}"
    return Spread(expression, every_minutes * 60, offset)


def minutes_dividing_an_hour(text: str) -> int:
    """``--cron-every``: minutes that divide 60, refused on the command line rather than once the
    steps before the cron step have run."""
    minutes = positive_int(text)
    if 60 % minutes:
        raise argparse.ArgumentTypeError(
            f"{text!r}: must divide 60 (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30 or 60)"
        )
    return minutes


def history_runs(text: str) -> int:
    """``--runs``: at least a page of a schedule's runs (50), which the step reads and then the
    page after it; refused on the command line rather than once the 10,000-run comparison has run."""
    runs = positive_int(text)
    if runs < API_PAGE:
        raise argparse.ArgumentTypeError(
            f"{text!r}: must be {API_PAGE} or more (a page of a schedule's runs)"
        )
    return runs


def seconds_spread(every_seconds: int) -> Spread:
    """``H/S * * * * *``: every S seconds from a hashed second in 0-(S-1)."""
    return Spread(f"H/{every_seconds} * * * * *", every_seconds, hashed_sql("second", every_seconds))


def small_spread(rate: float, count: int = SMALL_CRON) -> tuple[Spread, int]:
    """The same rate from about ``count`` schedules: the period dividing a minute that comes closest."""
    period = min((p for p in range(1, 61) if 60 % p == 0), key=lambda p: abs(rate * p - count))
    return seconds_spread(period), max(1, round(rate * period))


def insert_cron(conn: Conn, spread: Spread, count: int, after: float, chunk: int = 250_000) -> float:
    """``count`` active cron schedules, each ``next_fire_at`` its first fire after ``after`` (epoch
    seconds), as the scanner would compute it; then analysed. Returns seconds."""
    started = time.monotonic()
    period = spread.period_s
    for first in range(1, count + 1, chunk):
        last = min(count, first + chunk - 1)
        conn.execute(
            "insert into schedules (id, app, name, kind, cron, handler, next_fire_at) "
            "select id, %(app)s, 'cron-' || g, 'cron', %(cron)s, 'builtin:noop', "
            f"       to_timestamp((floor((%(after)s - o) / {period}) + 1) * {period} + o) "
            f"  from (select g, id, {spread.offset_sql} as o "
            "          from (select g, bench_id() as id "
            "                  from generate_series(%(first)s::int, %(last)s::int) g) ids) fires",
            {"app": BENCH_APP, "cron": spread.expression, "after": after, "first": first, "last": last},
        )
        conn.commit()
    conn.execute("analyze schedules")
    conn.commit()
    return round(time.monotonic() - started, 1)


def check_next_fires(conn: Conn, spread: Spread, after: float, sample: int = 200) -> int:
    """How many of ``sample`` inserted ``next_fire_at`` differ from the domain's cron code."""
    rows = conn.execute(
        "select id, next_fire_at from schedules where kind = 'cron' limit %s", (sample,)
    ).fetchall()
    conn.commit()
    moment = datetime.fromtimestamp(after, UTC)
    return sum(
        1
        for row in rows
        if CronSchedule.of(spread.expression, "UTC", schedule_id=row["id"]).next_fire_after(moment)
        != row["next_fire_at"]
    )


def expected_fires(conn: Conn, spread: Spread, window_start: int, window_s: int) -> int:
    """Fires of every cron schedule at the whole seconds of [start, start + window_s)."""
    period = spread.period_s
    row = conn.execute(
        f"select coalesce(sum(floor((%(last)s - o) / {period}) "
        f"                    - floor((%(first)s - 1 - o) / {period})), 0)::bigint as n "
        f"  from (select {spread.offset_sql} as o from schedules where kind = 'cron') x",
        {"first": window_start, "last": window_start + window_s - 1},
    ).fetchone()
    conn.commit()
    return int(row["n"]) if row else 0


def scan_lag_gauge(metrics_url: str) -> float | None:
    try:
        text = httpx.get(metrics_url, timeout=2, trust_env=False).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "scheduler_scan_lag_seconds":
            return float(family.samples[0].value)
    return None


def run_cron(spread: Spread, count: int, workers: int, concurrency: int, partitions: int) -> dict[str, Any]:
    rate = count / spread.period_s
    with isolated_settings("scale_cron") as settings:
        create_bench_app(settings, partitions)
        wiring = Wiring(settings)
        with wiring.database.connect() as conn:
            # Room for the insert, the analyze, the components' start and the warm-up.
            after = db_epoch(conn) + 20 + count / 25_000
            insert_s = insert_cron(conn, spread, count, after)
            mismatches = check_next_fires(conn, spread, after)
            if mismatches:
                raise RuntimeError(f"{mismatches} next_fire_at differ from the domain's cron code")
        port = free_port_range(1)
        commands = [["scanner", "--metrics-port", str(port)], *pipeline_commands(workers, concurrency)[1:]]
        with (
            running(commands, pipeline_env(settings), LOGS / f"cron-{count}") as procs,
            wiring.database.connect() as conn,
        ):
            metrics_url = f"http://127.0.0.1:{port}/metrics"
            wait_until(lambda: scan_lag_gauge(metrics_url) is not None, 60, interval_s=0.2)
            warm_up(conn)
            # Whole seconds (every fire is at one), after any catch-up of fires due before the start.
            window_start = math.ceil(max(after, db_epoch(conn))) + 3
            window_end = window_start + CRON_WINDOW_S
            time.sleep(max(0.0, window_start - db_epoch(conn)))
            names = ["scanner", "relay", "reconciler"] + [f"worker{n}" for n in range(workers)]
            cpu = CpuWindow(conn, {name: proc.pid for name, proc in zip(names, procs, strict=True)})
            cpu.start()
            load_before = load_average()
            gauge: list[float] = []
            while db_epoch(conn) < window_end:
                check_components()
                value = scan_lag_gauge(metrics_url)
                if value is not None:
                    gauge.append(value)
                time.sleep(SAMPLE_EVERY_S)
            cpu_pct = cpu.stop()
            window = {"first": window_start, "end": window_end}

            def all_started() -> bool:
                row = conn.execute(
                    "select count(*) as n from runs where scheduled_for >= to_timestamp(%(first)s) "
                    "and scheduled_for < to_timestamp(%(end)s) and started_at is not null",
                    window,
                ).fetchone()
                conn.commit()
                return row is not None and row["n"] >= round(rate * CRON_WINDOW_S * 0.999)

            with suppress(TimeoutError):
                wait_until(all_started, 60, interval_s=0.5)
            rows = conn.execute(
                "select extract(epoch from coalesce(started_at, clock_timestamp()) - scheduled_for) * 1000 "
                "         as start_ms, "
                "       extract(epoch from dispatched_at - scheduled_for) * 1000 as dispatch_ms, "
                "       extract(epoch from created_at - scheduled_for) * 1000 as scan_ms, "
                "       started_at is not null as started "
                "  from runs "
                " where scheduled_for >= to_timestamp(%(first)s) and scheduled_for < to_timestamp(%(end)s)",
                window,
            ).fetchall()
            conn.commit()
            lease = lease_query_ms(conn, SCAN_BATCH)
            retry_lease = plan_median_ms(
                conn, query("lease_due_retries"), lease_retries_params(SCAN_BATCH), 20
            )
            expected = expected_fires(conn, spread, window_start, CRON_WINDOW_S)
            table_mb = conn.execute("select pg_total_relation_size('schedules') / 1e6 as mb").fetchone()
            conn.commit()
    return {
        "schedules": count,
        "expression": spread.expression,
        "period_s": spread.period_s,
        "offered_per_s": round(rate, 1),
        "window_s": CRON_WINDOW_S,
        "expected_fires": expected,
        "fires": len(rows),
        "started": sum(1 for r in rows if r["started"]),
        "fires_per_s": round(len(rows) / CRON_WINDOW_S, 1),
        "start": ms_percentiles([float(r["start_ms"]) for r in rows]),
        "dispatch": ms_percentiles([float(r["dispatch_ms"]) for r in rows if r["dispatch_ms"] is not None]),
        "scan": ms_percentiles([float(r["scan_ms"]) for r in rows]),
        "scan_lag_gauge_s": {
            "max": round(max(gauge), 3) if gauge else None,
            "mean": round(statistics.fmean(gauge), 3) if gauge else None,
            "samples": len(gauge),
        },
        "lease_query_ms": lease,
        "retry_lease_query": retry_lease,
        "insert_s": insert_s,
        "schedules_table_mb": round(float(table_mb["mb"]), 1) if table_mb else None,
        "next_fire_checked": 200,
        "cpu_pct": cpu_pct,
        "workers": workers,
        "concurrency": concurrency,
        "load_average": {"before": load_before, "after": load_average()},
    }


def measure_cron(
    count: int, every_minutes: int, workers: int, concurrency: int, partitions: int
) -> dict[str, Any]:
    big = hourly_spread(every_minutes)
    small, small_count = small_spread(count / big.period_s)
    return {
        str(small_count): run_cron(small, small_count, workers, concurrency, partitions),
        str(count): run_cron(big, count, workers, concurrency, partitions),
    }


# --- 3. a long history of runs ---------------------------------------------------------------------


def load_history(conn: Conn, admin: Conn, runs: int) -> dict[str, Any]:
    """``runs`` succeeded runs of ``runs / RUNS_PER_SCHEDULE`` paused cron schedules, due evenly over
    the last 30 days, inserted oldest first (as they would have been), ``RUN_CHUNK`` rows a
    statement; then ``vacuum analyze``. Returns the timings and the sizes."""
    schedules = max(1, runs // RUNS_PER_SCHEDULE)
    per = max(1, runs // schedules)
    started = time.monotonic()
    conn.execute(
        "insert into schedules (id, app, name, kind, cron, handler, state) "
        "select bench_id(), %s, 'history-' || g, 'cron', 'H/45 * * * *', 'builtin:noop', 'paused' "
        "  from generate_series(1, %s) g",
        (BENCH_APP, schedules),
    )
    ids = [row["id"] for row in conn.execute("select id from schedules where kind = 'cron' order by name")]
    conn.commit()
    step_s = HISTORY_DAYS * 86400 / per
    fires_per_chunk = max(1, RUN_CHUNK // schedules)
    for first in range(0, per, fires_per_chunk):
        conn.execute(
            "insert into runs (id, schedule_id, app, scheduled_for, state, attempt, max_attempts, "
            "                  dispatched_at, started_at, finished_at, worker, created_at, version) "
            "select bench_id(f.t), s.id, %(app)s, f.t, 'succeeded', 1, 3, f.t + interval '10 ms', "
            "       f.t + interval '20 ms', f.t + interval '30 ms', 'bench-history', "
            "       f.t + interval '5 ms', 3 "
            "  from generate_series(%(first)s::int, %(last)s::int) k "
            " cross join unnest(%(ids)s::uuid[]) with ordinality s(id, n) "
            " cross join lateral (select now() - make_interval(days => %(days)s) + make_interval( "
            "                              secs => k * %(step)s + mod(s.n, %(step)s::int))) f(t)",
            {
                "app": BENCH_APP,
                "first": first,
                "last": min(per, first + fires_per_chunk) - 1,
                "ids": ids,
                "days": HISTORY_DAYS,
                "step": step_s,
            },
        )
        conn.commit()
    loaded = time.monotonic() - started
    admin.execute("vacuum analyze runs")
    admin.execute("vacuum analyze schedules")
    vacuumed = time.monotonic() - started - loaded
    sizes = conn.execute(
        "select c.relname as name, pg_relation_size(c.oid) / 1e6 as mb "
        "  from pg_index i join pg_class c on c.oid = i.indexrelid "
        " where i.indrelid = 'runs'::regclass order by 2 desc"
    ).fetchall()
    table = conn.execute(
        "select pg_table_size('runs') / 1e6 as table_mb, pg_indexes_size('runs') / 1e6 as indexes_mb, "
        "       (select count(*) from runs) as rows"
    ).fetchone()
    conn.commit()
    assert table is not None
    return {
        "runs": int(table["rows"]),
        "schedules": schedules,
        "runs_per_schedule": per,
        "load_s": round(loaded, 1),
        "rows_per_s": round(int(table["rows"]) / loaded),
        "vacuum_analyze_s": round(vacuumed, 1),
        "table_mb": round(float(table["table_mb"]), 1),
        "indexes_mb": round(float(table["indexes_mb"]), 1),
        "index_mb": {row["name"]: round(float(row["mb"]), 1) for row in sizes},
    }


@contextmanager
def api_on(settings: Settings) -> Iterator[tuple[httpx.Client, subprocess.Popen[bytes]]]:
    """``scheduler run api`` on this step's database, as bench/api.py starts it: a generated HS256
    secret, rate limits far beyond the load, one admin token."""
    secret = secrets.token_urlsafe(48)
    base = free_port_range(3)
    extra = {"SCHEDULER_JWT_SECRET": secret, "SCHEDULER_API_RATE_LIMITS": rate_limits_beyond_any_load()}
    command = ["api", "--port", str(base), "--grpc-port", str(base + 1), "--metrics-port", str(base + 2)]
    with running([command], component_env(settings, extra), LOGS / "api") as procs:
        headers = {"Authorization": f"Bearer {tokens(secret, 1)[0]}"}
        with httpx.Client(
            base_url=f"http://127.0.0.1:{base}", headers=headers, timeout=60, trust_env=False
        ) as client:

            def serving() -> bool:
                if procs[0].poll() is not None:
                    raise RuntimeError(f"the API exited {procs[0].returncode}; its log is in {LOGS / 'api'}")
                try:
                    return client.get("/v1/health", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(serving, 60, interval_s=0.1)
            yield client, procs[0]


def timed_calls(call: Callable[[], httpx.Response], calls: int) -> dict[str, Any]:
    """Median and p99 of ``calls`` answers, after 3 not counted; the status codes seen."""
    for _ in range(3):
        call()
    times, codes = [], set()
    for _ in range(calls):
        began = time.perf_counter()
        response = call()
        times.append((time.perf_counter() - began) * 1000)
        codes.add(response.status_code)
    figures = percentiles(times)
    return {
        "p50_ms": figures["p50"],
        "p99_ms": figures["p99"],
        "max_ms": figures["max"],
        "status": sorted(codes),
    }


def measure_api(settings: Settings, schedule_id: str) -> dict[str, Any]:
    with api_on(settings) as (client, _):
        # The transport's own time, for reading the lists' figures against.
        figures: dict[str, Any] = {"health": timed_calls(lambda: client.get("/v1/health"), API_CALLS)}
        listed = client.get("/v1/runs", params={"app": BENCH_APP, "limit": 50})
        if listed.status_code == 200:
            figures["runs_of_app"] = timed_calls(
                lambda: client.get("/v1/runs", params={"app": BENCH_APP, "limit": 50}), API_CALLS
            )
        else:
            figures["runs_of_app"] = {"status": [listed.status_code], "not_served": True}
        path = f"/v1/schedules/{schedule_id}/runs"
        first = client.get(path, params={"limit": 50})
        first.raise_for_status()
        cursor = first.json().get("next_cursor", "")
        figures["schedule_runs"] = timed_calls(lambda: client.get(path, params={"limit": 50}), API_CALLS)
        figures["schedule_runs_next_page"] = timed_calls(
            lambda: client.get(path, params={"limit": 50, "cursor": cursor}), API_CALLS
        ) | {"has_cursor": bool(cursor)}
    return figures


def measure_cli(settings: Settings) -> dict[str, Any]:
    """``scheduler runs list --app bench --limit 50`` as a user types it: wall time per process."""
    env = component_env(settings)
    times = []
    for _ in range(CLI_CALLS):
        began = time.perf_counter()
        subprocess.run(
            [*scheduler_command(), "runs", "list", "--app", BENCH_APP, "--limit", "50", "--json"],
            env=env,
            check=True,
            capture_output=True,
        )
        times.append((time.perf_counter() - began) * 1000)
    return {
        "median_ms": round(statistics.median(times), 1),
        "max_ms": round(max(times), 1),
        "calls": CLI_CALLS,
    }


def measure_lag(conn: Conn, settings: Settings, workers: int, concurrency: int, runs: int) -> dict[str, Any]:
    """1,000 fires/s for 10 s as bench/lag.py fires them; the waits and the final read go through
    indexes (``runs_app_fired``, the (schedule_id, scheduled_for) key), never over the history."""
    fires = round(LAG_RATE * LAG_WINDOW_S)
    with running(
        pipeline_commands(workers, concurrency), pipeline_env(settings), LOGS / f"history-lag-{runs}"
    ):
        time.sleep(3)  # the workers join their group
        warm_up(conn)
        row = conn.execute("select now() as t").fetchone()
        conn.commit()
        assert row is not None
        since = row["t"]
        # The server's WAL meanwhile: full-page images are what pages touched at random cost on a
        # large table (the first change of a page after a checkpoint writes all of it).
        wal_before = wal_counters(conn)
        ahead_s = insert_window(conn, fires, LAG_WINDOW_S, 2.0 + fires / 20_000)
        with suppress(TimeoutError):
            wait_until(lambda: succeeded_since(conn, since) >= fires, LAG_WINDOW_S + 120, interval_s=0.2)
        wal_after = wal_counters(conn)
        by_relation = full_page_images_by_relation(conn, wal_before["lsn"], wal_after["lsn"])
        rows = conn.execute(
            "select extract(epoch from coalesce(r.started_at, clock_timestamp()) - x.run_at) * 1000 "
            "         as start_ms, "
            "       extract(epoch from r.dispatched_at - x.run_at) * 1000 as dispatch_ms, "
            "       extract(epoch from r.created_at - x.run_at) * 1000 as scan_ms "
            "  from schedules x "
            "  left join lateral (select * from runs r "
            "                      where r.schedule_id = x.id and r.scheduled_for = x.run_at) r on true "
            " where x.kind = 'delayed'"
        ).fetchall()
        conn.commit()
    return {
        "rate_per_s": LAG_RATE,
        "fires": fires,
        "inserted_ahead_s": round(ahead_s, 2),
        **ms_percentiles([float(r["start_ms"]) for r in rows]),
        "dispatch": ms_percentiles([float(r["dispatch_ms"]) for r in rows if r["dispatch_ms"] is not None]),
        "scan": ms_percentiles([float(r["scan_ms"]) for r in rows if r["scan_ms"] is not None]),
        "wal_mb": round((wal_after["bytes"] - wal_before["bytes"]) / 1e6, 1),
        "full_page_images": wal_after["fpi"] - wal_before["fpi"],
        "full_page_images_by_relation": by_relation,
    }


def wal_counters(conn: Conn) -> dict[str, Any]:
    """The server's WAL bytes and full-page images so far (``pg_stat_wal``), and where it is."""
    row = conn.execute(
        "select wal_bytes::bigint as bytes, wal_fpi as fpi, pg_current_wal_lsn()::text as lsn "
        "  from pg_stat_wal"
    ).fetchone()
    conn.commit()
    assert row is not None
    return {"bytes": int(row["bytes"]), "fpi": int(row["fpi"]), "lsn": str(row["lsn"])}


def full_page_images_by_relation(conn: Conn, start: str, end: str, top: int = 8) -> dict[str, int]:
    """Which relations (and forks) the full-page images between two WAL positions were of, and in
    which kind of record (an insert, an update, a lock, a prune, a hint), the most first, from
    ``pg_walinspect`` (a superuser's extension; without it, empty and said so). A page's first
    change after a checkpoint writes the whole page, so this names what a window touched at
    random; with data checksums (PostgreSQL 18's default) a page whose hint bits are first set by
    a read counts too."""
    try:
        conn.execute("create extension if not exists pg_walinspect")
        rows = conn.execute(
            "select coalesce(pg_filenode_relation(b.reltablespace, b.relfilenode)::regclass::text, "
            "                b.relfilenode::text) || case b.relforknumber when 0 then '' "
            "         when 1 then ' (free-space map)' when 2 then ' (visibility map)' else ' (init)' end "
            "         || ': ' || b.resource_manager || '/' || b.record_type as relation, count(*) as n "
            "  from pg_get_wal_block_info(%s::pg_lsn, %s::pg_lsn, false) b "
            " where b.block_fpi_length > 0 "
            " group by 1 order by 2 desc limit %s",
            (start, end, top),
        ).fetchall()
        conn.commit()
    except psycopg.Error as exc:
        conn.rollback()
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        console().print(f"full-page images by relation not read: {reason}")
        return {}
    return {str(row["relation"]): int(row["n"]) for row in rows}


def measure_retention(settings: Settings, conn: Conn, admin: Conn) -> dict[str, Any]:
    """The reconciler's history retention at ``RETENTION_DAYS`` (half the history expires): its
    looks, as the lease sweeper runs them back to back, for up to ``RETENTION_SWEEP_S``; runs
    deleted per second, each look's time and the WAL per deleted run."""
    sweeper = retention.HistoryRetention(
        Wiring(settings).database, RETENTION_DAYS, logging.getLogger("bench.retention")
    )
    expired = conn.execute(
        "select count(*) as n from runs where finished_at < now() - make_interval(secs => %s)",
        (RETENTION_DAYS * 86_400,),
    ).fetchone()
    conn.commit()
    wal_before = admin.execute("select pg_current_wal_lsn()").fetchone()
    assert expired is not None and wal_before is not None
    started = time.monotonic()
    looks_ms: list[float] = []
    deleted = 0
    try:
        while time.monotonic() - started < RETENTION_SWEEP_S:
            look_started = time.monotonic()
            look = sweeper.look()
            looks_ms.append((time.monotonic() - look_started) * 1000)
            deleted += look.runs
            if not look.whole:
                break
    finally:
        sweeper.close()
    elapsed = time.monotonic() - started
    wal = admin.execute(
        "select pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (wal_before[0],)
    ).fetchone()
    assert wal is not None
    return {
        "retention_days": RETENTION_DAYS,
        "expired": int(expired["n"]),
        "deleted": deleted,
        "sweep_s": round(elapsed, 1),
        "runs_per_s": round(deleted / elapsed) if elapsed else None,
        "batch": ms_percentiles(looks_ms),
        "wal_bytes_per_run": round(float(wal[0]) / deleted) if deleted else None,
    }


def run_history(runs: int, workers: int, concurrency: int, partitions: int) -> dict[str, Any]:
    load_before = load_average()
    disk_before = disk_free_gb()
    with isolated_settings("scale_history") as settings:
        create_bench_app(settings, partitions)
        wiring = Wiring(settings)
        with (
            wiring.database.connect() as conn,
            psycopg.connect(settings.database_url, autocommit=True) as admin,
        ):
            figures: dict[str, Any] = {"load": load_history(conn, admin, runs)}
            disk_loaded = disk_free_gb()
            row = conn.execute(
                "select id from schedules where kind = 'cron' order by name offset %s limit 1",
                (figures["load"]["schedules"] // 2,),
            ).fetchone()
            conn.commit()
            assert row is not None
            schedule_id = str(row["id"])
            newest = conn.execute(
                "select scheduled_for from runs where schedule_id = %s "
                " order by scheduled_for desc offset %s limit 1",
                (schedule_id, API_PAGE - 1),
            ).fetchone()
            conn.commit()
            assert newest is not None
            figures["queries"] = {
                "lease_due_schedules": plan_median_ms(
                    conn,
                    query("lease_due_schedules"),
                    lease_schedules_params(SCAN_BATCH, lookahead_s=1.0),
                    20,
                ),
                "lease_due_retries": plan_median_ms(
                    conn, query("lease_due_retries"), lease_retries_params(SCAN_BATCH), 20
                ),
                "runs_page": plan_median_ms(
                    conn, query("runs_page"), {"schedule_id": schedule_id, "before": None, "limit": 51}, 20
                ),
                "runs_page_next": plan_median_ms(
                    conn,
                    query("runs_page"),
                    {"schedule_id": schedule_id, "before": newest["scheduled_for"], "limit": 51},
                    20,
                ),
                "list_runs_app": plan_median_ms(
                    conn,
                    query("list_runs"),
                    {"schedule_id": None, "app": BENCH_APP, "state": None, "limit": 50},
                    5,
                ),
                # The running ones, a few among millions: from the lease index, not the history.
                "list_runs_app_running": plan_median_ms(
                    conn,
                    query("list_runs"),
                    {"schedule_id": None, "app": BENCH_APP, "state": "running", "limit": 50},
                    5,
                ),
                "api_runs_in_state_running": plan_median_ms(
                    conn,
                    query("app_runs_page_in_state"),
                    {"state": "running", "apps": None, "after_fired": None, "after_id": None, "limit": 51},
                    5,
                ),
                # The selection of a batch of the reconciler's retention, rolled back like the others.
                "expired_runs": plan_median_ms(
                    conn,
                    query("expired_runs"),
                    {
                        "retention_s": RETENTION_DAYS * 86_400,
                        "limit": retention.BATCH,
                        "after": None,
                        "skip": [],
                    },
                    5,
                ),
            }
            figures["api"] = measure_api(settings, schedule_id)
            figures["cli_runs_list"] = measure_cli(settings)
            figures["lag"] = measure_lag(conn, settings, workers, concurrency, runs)
            figures["retention"] = measure_retention(settings, conn, admin)
    return figures | {
        "disk_free_gb": {"before": disk_before, "loaded": disk_loaded, "after": disk_free_gb()},
        "load_average": {"before": load_before, "after": load_average()},
    }


def measure_history(runs: int, workers: int, concurrency: int, partitions: int) -> dict[str, Any]:
    # The comparison size once only: asked for itself, a second run would overwrite the first.
    sizes = dict.fromkeys((SMALL_RUNS, runs))
    return {str(n): run_history(n, workers, concurrency, partitions) for n in sizes}


# --- the tables --------------------------------------------------------------------------------------


def _v(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int | float) else str(value)


def show_inflight(figures: dict[str, Any]) -> None:
    keys = {
        "jobs": "jobs",
        "max running (sampled)": "max_running_sampled",
        "max in flight (exact)": "max_in_flight_exact",
        "all started s": "all_started_s",
        "all succeeded s": "all_succeeded_s",
        "RSS idle MB": "rss_idle_mb",
        "RSS plateau MB": "rss_plateau_mb",
        "RSS max MB": "rss_max_mb",
        "worker CPU %": "worker_cpu_pct",
    }
    title = (
        f"jobs in flight in one worker ({figures['handler']}, {figures['sleep_s']:g} s each; "
        "target 5,000 within 500 MB)"
    )
    table = Table(*keys, title=title)
    table.add_row(*(_v(figures[key]) for key in keys.values()))
    console().print(table)


def show_cron(figures: dict[str, Any]) -> None:
    columns: dict[str, Callable[[dict[str, Any]], Any]] = {
        "schedules": lambda e: e["schedules"],
        "cron": lambda e: e["expression"],
        "due/s": lambda e: e["offered_per_s"],
        "fires/s": lambda e: e["fires_per_s"],
        "expected": lambda e: e["expected_fires"],
        "fires": lambda e: e["fires"],
        "scan p50": lambda e: e["scan"].get("p50_ms"),
        "scan p99": lambda e: e["scan"].get("p99_ms"),
        "gauge s": lambda e: e["scan_lag_gauge_s"]["max"],
        "start p50": lambda e: e["start"].get("p50_ms"),
        "start p99": lambda e: e["start"].get("p99_ms"),
        "disp p99": lambda e: e["dispatch"].get("p99_ms"),
        "lease q": lambda e: e["lease_query_ms"],
        "scan %": lambda e: e["cpu_pct"]["scanner"],
        "pg %": lambda e: e["cpu_pct"]["postgres"],
        "all %": lambda e: e["cpu_pct"]["machine"],
    }
    title = (
        f"active cron schedules firing ({CRON_WINDOW_S} s measured; lags in ms; gauge: max of "
        "scheduler_scan_lag_seconds; CPU in % of a core, all: the machine's % of all cores)"
    )
    table = Table(*columns, title=title)
    for entry in figures.values():
        table.add_row(*(_v(column(entry)) for column in columns.values()))
    console().print(table)


def show_history(figures: dict[str, Any]) -> None:
    out = console()
    load = Table(
        "runs", "load s", "rows/s", "vacuum s", "table MB", "indexes MB", "largest indexes MB",
        title="historic runs loaded",
    )  # fmt: skip
    for entry in figures.values():
        item = entry["load"]
        largest = ", ".join(f"{name} {mb:,.0f}" for name, mb in list(item["index_mb"].items())[:4])
        load.add_row(
            *(
                _v(item[k])
                for k in ("runs", "load_s", "rows_per_s", "vacuum_analyze_s", "table_mb", "indexes_mb")
            ),
            largest,
        )
    out.print(load)
    sizes = list(figures)
    table = Table(
        "figure",
        *(f"{int(n):,} runs" for n in sizes),
        "how (at the big size)",
        title="queries, API and CLI by history size (ms)",
    )
    big = figures[sizes[-1]]
    for name, plan in big["queries"].items():
        medians = (_v(figures[n]["queries"][name]["median_ms"]) for n in sizes)
        table.add_row(f"{name} (explain analyze median)", *medians, "; ".join(plan["scans"]))
    for name, entry in big["api"].items():
        calls = [figures[n]["api"].get(name, {"status": ["-"], "not_served": True}) for n in sizes]
        both = (
            f"HTTP {c['status'][0]} (not served)" if c.get("not_served") else f"{c['p50_ms']} / {c['p99_ms']}"
            for c in calls
        )
        table.add_row(f"API {name} p50 / p99", *both, f"HTTP {entry['status']}")
    cli = (_v(figures[n]["cli_runs_list"]["median_ms"]) for n in sizes)
    table.add_row("scheduler runs list --app --limit 50 (wall, median)", *cli, "a process each")
    lags = (f"{figures[n]['lag'].get('p50_ms')} / {figures[n]['lag'].get('p99_ms')}" for n in sizes)
    table.add_row(
        "start lag p50 / p99 at 1,000/s",
        *lags,
        f"scan p99 {big['lag']['scan'].get('p99_ms')}; the server's WAL meanwhile "
        f"{big['lag'].get('wal_mb')} MB, {big['lag'].get('full_page_images')} full-page images "
        f"{big['lag'].get('full_page_images_by_relation') or ''}",
    )
    for n in sizes:
        kept = figures[n].get("retention")
        if kept:
            table.add_row(
                f"retention at {kept['retention_days']:g} days, {int(n):,} runs",
                *(
                    f"{kept['deleted']:,} of {kept['expired']:,} deleted in {kept['sweep_s']} s: "
                    f"{_v(kept['runs_per_s'])} runs/s, look p50 {kept['batch'].get('p50_ms')} ms, "
                    f"{_v(kept['wal_bytes_per_run'])} B WAL/run"
                    if m == n
                    else ""
                    for m in sizes
                ),
                "the lease sweeper's batches",
            )
    out.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(STEPS), help=f"steps, comma separated: {', '.join(STEPS)}")
    parser.add_argument(
        "--inflight", type=positive_int, default=5000, help="sleeping jobs at once in one worker"
    )
    parser.add_argument(
        "--sleep", type=positive_float, default=30.0, help="seconds each in-flight job sleeps"
    )
    parser.add_argument("--cron", type=positive_int, default=1_000_000, help="active cron schedules")
    parser.add_argument(
        "--cron-every",
        type=minutes_dividing_an_hour,
        default=60,
        help="minutes between a schedule's fires (dividing 60)",
    )
    parser.add_argument("--runs", type=history_runs, default=10_000_000, help="historic runs (50 or more)")
    parser.add_argument("--workers", type=positive_int, default=4)
    parser.add_argument("--concurrency", type=positive_int, default=64)
    parser.add_argument("--partitions", type=positive_int, default=12)
    args = parser.parse_args()
    steps = [step for step in args.only.split(",") if step]
    unknown = set(steps) - set(STEPS)
    if unknown:
        parser.error(f"unknown steps: {', '.join(sorted(unknown))}")
    figures: dict[str, Any] = {
        "machine_load": {"before": load_average()},
        "disk_free_gb": {"before": disk_free_gb()},
    }
    if "inflight" in steps:
        figures["inflight"] = run_inflight(args.inflight, args.sleep, args.partitions)
    if "cron" in steps:
        figures["cron"] = measure_cron(
            args.cron, args.cron_every, args.workers, args.concurrency, args.partitions
        )
    if "history" in steps:
        figures["history"] = measure_history(args.runs, args.workers, args.concurrency, args.partitions)
    figures["machine_load"]["after"] = load_average()
    figures["disk_free_gb"]["after"] = disk_free_gb()
    figures["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    # Recorded before it is shown, so that the figures of a long run survive a table that fails.
    # A step run alone (--only) keeps the figures of the others from their last run.
    print(f"written to {record('scale', latest().get('scale', {}) | figures)}")
    for step, show in (("inflight", show_inflight), ("cron", show_cron), ("history", show_history)):
        if step in figures:
            show(figures[step])


if __name__ == "__main__":
    run_main(main)
