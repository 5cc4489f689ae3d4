"""Ours against peers on the same machine and PostgreSQL: PgQueuer, and Celery with a Redis broker.

Each peer runs in its own virtualenv (``bench/results/.venv-peers``, made from
``bench/peers/requirements.txt`` on first use) so the project's dependencies stay as they are; its
script (``bench/peers/<name>_bench.py``) starts its workers, and for Celery its Redis, and stops
them. Both measure what ours is measured on:

- jobs/s: N no-op jobs drained by the same number of worker processes as our e2e run
  (ours: ``e2e.jobs_per_s``),
- delayed-job lag: jobs due evenly over a window at a rate, start minus due time
  (ours: ``lag.<rate>.p99_ms``).

Our figures come from ``results/latest.json`` when it holds a run of the same size, otherwise they
are measured first. Ratios are ours over theirs: above 1 means more jobs/s (better) or more lag
(worse) for us.

    python -m bench.compare --jobs 10000 --workers 4 --rate 1000 --window 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import console, latest, peers_python, percentiles, record, stack_database_url

PEERS_DIR = Path(__file__).resolve().parent / "peers"
PEERS = ("pgqueuer", "celery")


def run_peer(name: str, jobs: int, workers: int, rate: int, window_s: float) -> dict[str, Any]:
    python = peers_python()
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as scratch:
        out = Path(scratch) / "figures.json"
        command = [
            str(python),
            str(PEERS_DIR / f"{name}_bench.py"),
            *("--jobs", str(jobs), "--workers", str(workers), "--rate", str(rate)),
            *("--window", str(window_s), "--out", str(out), "--work-dir", scratch),
        ]
        if name == "pgqueuer":
            command += ["--dsn", stack_database_url()]
        subprocess.run(command, check=True, timeout=1200)
        raw = json.loads(out.read_text())
    lag = percentiles(raw["lag_ms"])
    return {
        "config": raw["config"],
        "jobs": raw["jobs"],
        "jobs_done": raw["jobs_done"],
        "workers": workers,
        "seconds": round(raw["seconds"], 2),
        "jobs_per_s": round(raw["jobs"] / raw["seconds"], 1),
        "enqueue_per_s": round(raw["jobs"] / raw["enqueue_s"], 1),
        "lag_rate_per_s": rate,
        "lag_window_s": window_s,
        **{f"lag_{key}_ms": value for key, value in lag.items()},
        "lag_duplicates": raw["lag_duplicates"],
        "inserted_ahead_s": round(raw["inserted_ahead_s"], 2),
    }


def ours(
    jobs: int, workers: int, concurrency: int, partitions: int, rate: int, window_s: float
) -> dict[str, Any]:
    """Our e2e and lag figures of the same size, from latest.json or measured now."""
    known = latest()
    e2e = known.get("e2e", {})
    if e2e.get("jobs") != jobs or e2e.get("workers") != workers:
        from bench.e2e import run_e2e

        e2e = run_e2e(jobs, partitions, workers, concurrency)
        record("e2e", e2e)
    lag = known.get("lag", {}).get(str(rate), {})
    if lag.get("window_s") != window_s or lag.get("workers") != workers:
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
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def run_compare(
    jobs: int,
    workers: int,
    concurrency: int,
    partitions: int,
    rate: int,
    window_s: float,
    peers: tuple[str, ...] = PEERS,
) -> dict[str, Any]:
    figures: dict[str, Any] = {"ours": ours(jobs, workers, concurrency, partitions, rate, window_s)}
    for name in peers:
        try:
            theirs = run_peer(name, jobs, workers, rate, window_s)
        except (subprocess.SubprocessError, OSError) as exc:
            # One peer that cannot run here (no redis-server, say) must not cost the other's figures.
            figures[name] = {
                "error": str(exc),
                "config": "did not run",
                "jobs_per_s": None,
                "lag_p99_ms": None,
            }
            continue
        theirs["ours_over_theirs_jobs_per_s"] = ratio(figures["ours"]["jobs_per_s"], theirs["jobs_per_s"])
        theirs["ours_over_theirs_lag_p99"] = ratio(figures["ours"]["lag_p99_ms"], theirs["lag_p99_ms"])
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
    console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64, help="ours: jobs at once per worker")
    parser.add_argument("--partitions", type=int, default=12, help="ours: partitions of the app's topic")
    parser.add_argument("--rate", type=int, default=1000, help="delayed jobs due per second")
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--peers", default=",".join(PEERS), help="comma separated: " + ", ".join(PEERS))
    args = parser.parse_args()
    peers = tuple(p for p in args.peers.split(",") if p)
    figures = run_compare(
        args.jobs, args.workers, args.concurrency, args.partitions, args.rate, args.window, peers
    )
    show(figures)
    print(f"written to {record('peers', figures)}")


if __name__ == "__main__":
    main()
