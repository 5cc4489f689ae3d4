"""Ours against peers on the same machine and PostgreSQL: PgQueuer (at its defaults and as its
performance-tuning guide tunes it), and Celery with a Redis broker.

Each peer runs in its own virtualenv (``bench/results/.venv-peers``, made from
``bench/peers/requirements.txt`` on first use) so the project's dependencies stay as they are; its
script (``bench/peers/<name>_bench.py``) starts its workers, and for Celery its Redis, and stops
them. They measure what ours is measured on:

- jobs/s: N no-op jobs drained by as many worker processes as our e2e run has, but for the tuned
  PgQueuer, which runs the 2 its tuning takes (ours: ``e2e.jobs_per_s``),
- delayed-job lag: jobs due evenly over a window at a rate, start minus due time
  (ours: ``lag.<rate>.p99_ms``),
- cost per job of the throughput phase, read with the same ``bench/cost.py`` probe on the same
  server (ours: ``e2e.cost``): WAL bytes, PostgreSQL CPU, statements, transactions. WAL and CPU are
  the whole server's, so nothing else may use it meanwhile. Celery has no PostgreSQL.

Our figures come from ``results/latest.json`` when it holds a run of the same size (with its cost),
otherwise, or with ``--fresh-ours``, they are measured first, in the same sitting. Ratios are ours
over theirs: above 1 means more jobs/s (better), or more lag, CPU or WAL (worse), for us.

    python -m bench.compare --jobs 10000 --workers 4 --rate 1000 --window 10 --fresh-ours
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import (
    console,
    latest,
    peers_python,
    percentiles,
    positive_float,
    positive_int,
    record,
    run_main,
    stack_database_url,
)
from bench.cost import show_cost

PEERS_DIR = Path(__file__).resolve().parent / "peers"


@dataclass(frozen=True)
class PeerSetup:
    """How one peer configuration runs: its script, its worker processes (``None``: as many as
    ours) and the script's own flags."""

    script: str
    workers: int | None = None
    flags: tuple[str, ...] = ()
    uses_postgres: bool = True


SETUPS: dict[str, PeerSetup] = {
    # PgQueuer's defaults: QueueManager.run() as documented, batch size 10.
    "pgqueuer": PeerSetup("pgqueuer"),
    # As its performance-tuning guide has it for short jobs: a batch of 100 per dequeue, its
    # autovacuum settings (`pgq autovac`), 2 processes (one per core here). Its tables stay durable,
    # as ours are: the guide's faster durability levels make tables unlogged, which writes no WAL.
    "pgqueuer_tuned": PeerSetup("pgqueuer", workers=2, flags=("--batch-size", "100", "--autovac")),
    "celery": PeerSetup("celery", uses_postgres=False),
}
PEERS = tuple(SETUPS)


def peer_names(text: str) -> tuple[str, ...]:
    """``--peers``: comma separated names of ``SETUPS``, checked before anything runs."""
    names = tuple(name for name in text.split(",") if name)
    unknown = sorted(set(names) - set(SETUPS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: peers are {', '.join(PEERS)}")
    return names


class PeerFailed(Exception):
    """A peer's script ended with an error; the message is its last line on stderr."""


def run_script(command: list[str], timeout_s: float) -> None:
    """Run a peer's script, its stderr shown as it comes and its last line kept: that line (its
    ``SystemExit`` message, "redis-server not found: ...", or a traceback's last) is why it failed.
    The script runs in a session of its own, so that Ctrl-C and SIGTERM reach it once, from here,
    as SIGINT: it then stops its workers (and Celery's Redis) before it ends."""
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    last: list[str] = []

    def relay() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            if line.strip():
                last[:] = [line.strip()]

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout_s)
    except BaseException:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        reader.join(5)
    if code != 0:
        raise PeerFailed(last[0] if last else f"{Path(command[1]).name} ended with exit status {code}")


def run_peer(name: str, jobs: int, workers: int, rate: int, window_s: float) -> dict[str, Any]:
    setup = SETUPS[name]
    processes = setup.workers or workers
    python = peers_python()
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as scratch:
        out = Path(scratch) / "figures.json"
        command = [
            str(python),
            str(PEERS_DIR / f"{setup.script}_bench.py"),
            *("--jobs", str(jobs), "--workers", str(processes), "--rate", str(rate)),
            *("--window", str(window_s), "--out", str(out), "--work-dir", scratch),
            *setup.flags,
        ]
        if setup.uses_postgres:
            command += ["--dsn", stack_database_url()]
        run_script(command, timeout_s=1200)
        raw = json.loads(out.read_text())
    lag = percentiles(raw["lag_ms"])
    return {
        "config": raw["config"],
        "jobs": raw["jobs"],
        "jobs_done": raw["jobs_done"],
        "workers": processes,
        "seconds": round(raw["seconds"], 2),
        "jobs_per_s": round(raw["jobs"] / raw["seconds"], 1),
        "enqueue_per_s": round(raw["jobs"] / raw["enqueue_s"], 1),
        "lag_rate_per_s": rate,
        "lag_window_s": window_s,
        **{f"lag_{key}_ms": value for key, value in lag.items()},
        "lag_duplicates": raw["lag_duplicates"],
        "inserted_ahead_s": round(raw["inserted_ahead_s"], 2),
        # Celery's broker is Redis: no PostgreSQL cost to read.
        "cost": raw.get("cost"),
    }


def ours(
    jobs: int,
    workers: int,
    concurrency: int,
    partitions: int,
    rate: int,
    window_s: float,
    fresh: bool = False,
) -> dict[str, Any]:
    """Our e2e and lag figures of the same size, from latest.json or (``fresh``, or none there of
    that size with its cost) measured now."""
    known = {} if fresh else latest()
    e2e = known.get("e2e", {})
    setup = {"workers": workers, "concurrency": concurrency, "partitions": partitions}
    # Taken as ours only when measured as it is measured here: one scanner and one relay (as
    # ``run_e2e`` runs by default), the same workers, concurrency and partitions. A run recorded
    # before the watcher's CPU was left out of the cost is measured again.
    if not _measured_as(e2e, setup | {"jobs": jobs, "scanners": 1, "relays": 1}) or "watcher_cpu_ms" not in (
        e2e.get("cost") or {}
    ):
        from bench.e2e import run_e2e

        e2e = run_e2e(jobs, partitions, workers, concurrency)
        record("e2e", e2e)
    lag = known.get("lag", {}).get(str(rate), {})
    # Nor a lag run that tried a PostgreSQL setting (``--pg-options``).
    if not _measured_as(lag, setup | {"window_s": window_s, "idle_schedules": 0, "pg_options": None}):
        from bench.lag import run_lag

        lag = run_lag(rate, window_s, workers, concurrency, partitions)
    return {
        "config": f"{workers} worker processes x {e2e['concurrency']} concurrency, "
        f"{e2e['partitions']} partitions, via Kafka",
        "jobs": jobs,
        "workers": workers,
        "seconds": e2e["seconds"],
        "jobs_per_s": e2e["jobs_per_s"],
        "lag_rate_per_s": rate,
        "lag_window_s": window_s,
        **{f"lag_{key}": lag.get(key) for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms")},
        "lag_stalled": lag.get("stalled", False),
        "cost": e2e.get("cost"),
    }


def _measured_as(figures: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether recorded figures were measured with every one of these settings (figures recorded
    before a setting was, such as ``scanners``, had it at what is now its default)."""
    defaults = {"scanners": 1, "relays": 1, "idle_schedules": 0, "pg_options": None}
    return bool(figures) and all(
        figures.get(key, defaults.get(key)) == value for key, value in wanted.items()
    )


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _per_job(entry: dict[str, Any], key: str) -> float | None:
    cost = entry.get("cost") or {}
    value = cost.get(key)
    return None if value is None else float(value)


def run_compare(
    jobs: int,
    workers: int,
    concurrency: int,
    partitions: int,
    rate: int,
    window_s: float,
    peers: tuple[str, ...] = PEERS,
    fresh_ours: bool = False,
) -> dict[str, Any]:
    unknown = sorted(set(peers) - set(SETUPS))
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; peers: {', '.join(PEERS)}")
    figures: dict[str, Any] = {
        "ours": ours(jobs, workers, concurrency, partitions, rate, window_s, fresh=fresh_ours)
    }
    mine = figures["ours"]
    for name in peers:
        try:
            theirs = run_peer(name, jobs, workers, rate, window_s)
        except (PeerFailed, subprocess.SubprocessError, OSError) as exc:
            # One peer that cannot run here (no redis-server, say) must not cost the other's figures.
            figures[name] = {
                "error": str(exc),
                "config": "did not run",
                "jobs_per_s": None,
                "lag_p99_ms": None,
                "cost": None,
            }
            continue
        theirs["ours_over_theirs_jobs_per_s"] = ratio(mine["jobs_per_s"], theirs["jobs_per_s"])
        theirs["ours_over_theirs_lag_p99"] = ratio(mine["lag_p99_ms"], theirs["lag_p99_ms"])
        theirs["ours_over_theirs_pg_cpu_per_job"] = ratio(
            _per_job(mine, "pg_cpu_ms_per_job"), _per_job(theirs, "pg_cpu_ms_per_job")
        )
        theirs["ours_over_theirs_wal_per_job"] = ratio(
            _per_job(mine, "wal_bytes_per_job"), _per_job(theirs, "wal_bytes_per_job")
        )
        figures[name] = theirs
    return figures


def _cell(value: Any, missing: str = "-") -> str:
    return missing if value is None else f"{value:,}"


def show(figures: dict[str, Any]) -> None:
    first = figures["ours"]
    table = Table(
        "system",
        "jobs/s",
        "ours ÷ theirs",
        "lag p50 ms",
        "lag p99 ms",
        "lag max ms",
        "ours p99 ÷ theirs",
        "how it ran",
        title=f"{first['jobs']:,} no-op jobs, {first['workers']} worker processes; "
        f"delayed jobs at {first['lag_rate_per_s']:,}/s over {first['lag_window_s']} s",
    )
    for name, entry in figures.items():
        table.add_row(
            name,
            "-" if entry["jobs_per_s"] is None else f"{entry['jobs_per_s']:,}",
            _cell(entry.get("ours_over_theirs_jobs_per_s"), ""),
            _cell(entry.get("lag_p50_ms")),
            _cell(entry.get("lag_p99_ms")),
            _cell(entry.get("lag_max_ms")),
            _cell(entry.get("ours_over_theirs_lag_p99"), ""),
            entry["config"],
        )
    out = console()
    out.print(table)
    out.print(cost_table(figures))
    for name, entry in figures.items():
        if entry.get("cost"):
            show_cost(name, entry["cost"])


# (column, key in the cost figures, format): the same probe for every system, bench/cost.py.
COST_COLUMNS = (
    ("WAL B/job", "wal_bytes_per_job", "{:,.0f}"),
    ("PG CPU ms/job", "pg_cpu_ms_per_job", "{:.3f}"),
    ("statements/job", "statements_per_job", "{:.2f}"),
    ("transactions/job", "transactions_per_job", "{:.3f}"),
    ("Kafka B/job", "kafka_bytes_per_job", "{:,.0f}"),
)


def statement_wal_per_job(cost: dict[str, Any]) -> float | None:
    """WAL written by all the measured database's own statements (``pg_stat_statements``): unlike
    the whole server's WAL, what other databases on the server write meanwhile does not count in
    it, though neither do vacuum, checkpoints or commit records. The total, not the sum of
    ``top_statements``, which holds only the costliest few."""
    value = cost.get("statements_wal_bytes_per_job")
    return None if value is None else float(value)


def cost_table(figures: dict[str, Any]) -> Table:
    """What the throughput phase cost per job; ``—`` where a system has no PostgreSQL (Celery) or
    no Kafka (the peers). The ratios are of the whole server's figures, as the issue's targets are;
    the statements' WAL (stmt WAL) is the one other databases on the server cannot inflate."""
    first = figures["ours"]
    table = Table(
        "system",
        *(column for column, _, _ in COST_COLUMNS),
        "stmt WAL B/job",
        "CPU ours÷theirs",
        "WAL ours÷theirs",
        title=f"PostgreSQL and Kafka work per job, {first['jobs']:,} no-op jobs "
        "(whole server's WAL and CPU, from before the enqueue until drained)",
    )
    for name, entry in figures.items():
        cost = entry.get("cost") or {}
        table.add_row(
            name,
            *("—" if cost.get(key) is None else fmt.format(cost[key]) for _, key, fmt in COST_COLUMNS),
            "—" if (wal := statement_wal_per_job(cost)) is None else f"{wal:,.0f}",
            _cell(entry.get("ours_over_theirs_pg_cpu_per_job"), ""),
            _cell(entry.get("ours_over_theirs_wal_per_job"), ""),
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=positive_int, default=10_000)
    parser.add_argument("--workers", type=positive_int, default=4)
    parser.add_argument("--concurrency", type=positive_int, default=64, help="ours: jobs at once per worker")
    parser.add_argument(
        "--partitions", type=positive_int, default=12, help="ours: partitions of the app's topic"
    )
    parser.add_argument("--rate", type=positive_int, default=1000, help="delayed jobs due per second")
    parser.add_argument("--window", type=positive_float, default=10.0)
    parser.add_argument(
        "--peers", type=peer_names, default=",".join(PEERS), help="comma separated: " + ", ".join(PEERS)
    )
    parser.add_argument(
        "--fresh-ours",
        action="store_true",
        help="measure our e2e and lag now rather than take them from latest.json (ratios of one sitting)",
    )
    args = parser.parse_args()
    figures = run_compare(
        args.jobs,
        args.workers,
        args.concurrency,
        args.partitions,
        args.rate,
        args.window,
        args.peers,
        fresh_ours=args.fresh_ours,
    )
    show(figures)
    print(f"written to {record('peers', figures)}")


if __name__ == "__main__":
    run_main(main)
