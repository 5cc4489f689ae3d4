"""Every benchmark in one go, for ``make bench``.

Each step prints its table and merges its figures into ``bench/results/latest.json``; the plots are
drawn at the end.

Steps, in order (``--only`` and ``--skip`` take comma-separated names):

- ``e2e``: N immediate no-op jobs through the whole pipeline (``e2e.jobs_per_s``, ``e2e.latency_ms``),
- ``lag``: firing precision at several rates (``lag.<rate>.p99_ms``),
- ``lag_idle``: the same at one rate with few and with many idle schedules (``lag_idle.<count>``),
- ``peers``: PgQueuer (defaults and tuned) and Celery on the same machine (``peers.<name>.jobs_per_s``,
  ``.lag_p99_ms``, ``.cost``: PostgreSQL work per job, with ours over theirs),
- ``ingest``: Avro commands through the ingestor and the CLI (``ingest.avro_per_s``, ``.cli_per_s``),
- ``api``: schedule creates through ``scheduler run api``, HTTP/JSON and gRPC, open-loop at several
  rates and in batches (``api.single.<transport>.<rate>.p99_ms``, ``api.batch.<transport>.schedules_per_s``),
- ``plot``: ``lag.png`` and ``throughput.png`` next to latest.json (matplotlib, peers' virtualenv).

With the defaults the run takes about 3 minutes on 2 cores, a minute or two more when the 5,000
fires/s run falls behind, and the ``api`` step adds 4 to 5 (see bench/README.md).

    python -m bench.run_all --only e2e,lag --jobs 5000 --rates 100,1000
"""

from __future__ import annotations

import argparse
import subprocess
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common import (
    console,
    latest,
    non_negative_int,
    non_negative_ints,
    peers_python,
    positive_float,
    positive_int,
    positive_ints,
    record,
    run_main,
)
from bench.compare import PEERS, peer_names

STEPS = ("e2e", "lag", "lag_idle", "peers", "ingest", "api", "plot")


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(STEPS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown step(s) {', '.join(unknown)}; steps: {', '.join(STEPS)}")
    return names


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    steps = parser.add_argument_group("steps")
    steps.add_argument("--only", type=_names, default=list(STEPS), help="run only these: " + ",".join(STEPS))
    steps.add_argument("--skip", type=_names, default=[], help="run all but these")
    pipeline = parser.add_argument_group("our pipeline (e2e, lag, lag_idle; peers use --workers too)")
    pipeline.add_argument("--jobs", type=positive_int, default=10_000, help="no-op jobs for e2e and peers")
    pipeline.add_argument("--workers", type=positive_int, default=4, help="worker processes")
    pipeline.add_argument("--concurrency", type=positive_int, default=64, help="jobs at once per worker")
    pipeline.add_argument("--partitions", type=positive_int, default=12, help="partitions of the app's topic")
    lag = parser.add_argument_group("lag and lag_idle")
    lag.add_argument("--rates", type=positive_ints, default=[100, 1000, 5000], help="fires per second")
    lag.add_argument("--window", type=positive_float, default=10.0, help="seconds the fires are spread over")
    lag.add_argument("--idle", type=non_negative_ints, default=[1000, 1_000_000], help="idle schedule counts")
    lag.add_argument("--idle-rate", type=positive_int, default=1000, help="fires per second of the idle runs")
    lag.add_argument(
        "--stall", type=positive_float, default=30.0, help="give a rate up after this long without progress"
    )
    lag.add_argument(
        "--pg-options", help="PGOPTIONS for our components in lag and lag_idle, e.g. '-c plan_cache_mode=...'"
    )
    peers = parser.add_argument_group("peers")
    peers.add_argument("--peers", type=peer_names, default=",".join(PEERS), help="which peers, of these")
    peers.add_argument(
        "--peer-rate", type=positive_int, default=1000, help="delayed jobs per second (ours: lag at it)"
    )
    ingest = parser.add_argument_group("ingest")
    ingest.add_argument("--commands", type=non_negative_int, default=10_000, help="Avro create commands")
    ingest.add_argument(
        "--cli", type=non_negative_int, default=20, help="schedules created one CLI call each"
    )
    api = parser.add_argument_group("api")
    api.add_argument(
        "--api-rates", type=positive_ints, default=[100, 500, 1000], help="single creates per second"
    )
    api.add_argument(
        "--api-duration", type=positive_float, default=10.0, help="seconds measured per rate and batch"
    )
    api.add_argument("--api-clients", type=positive_int, help="client processes [one per 1,000 requests/s]")
    args = parser.parse_args()
    args.steps = [step for step in STEPS if step in args.only and step not in args.skip]
    return args


def step_e2e(args: argparse.Namespace) -> None:
    from bench.e2e import run_e2e, show

    figures = run_e2e(args.jobs, args.partitions, args.workers, args.concurrency)
    show(figures)
    record("e2e", figures)


def _lag_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "workers": args.workers,
        "concurrency": args.concurrency,
        "partitions": args.partitions,
        "stall_s": args.stall,
        "pg_options": args.pg_options,
    }


def step_lag(args: argparse.Namespace) -> None:
    from bench.lag import measure_rates, show

    figures = measure_rates(args.rates, args.window, **_lag_options(args))
    show("start lag by load", figures)
    record("lag", figures)


def step_lag_idle(args: argparse.Namespace) -> None:
    from bench.lag import measure_idle, show

    figures = measure_idle(args.idle, args.idle_rate, args.window, **_lag_options(args))
    show(f"start lag at {args.idle_rate:,}/s by idle schedules", figures, key="idle_schedules")
    record("lag_idle", figures)


def step_peers(args: argparse.Namespace) -> None:
    from bench.compare import run_compare, show

    figures = run_compare(
        args.jobs, args.workers, args.concurrency, args.partitions, args.peer_rate, args.window, args.peers
    )
    show(figures)
    record("peers", figures)


def step_ingest(args: argparse.Namespace) -> None:
    from bench.ingest import run_ingest, show

    figures = run_ingest(args.commands, args.cli, args.partitions)
    show(figures)
    record("ingest", figures)


def step_api(args: argparse.Namespace) -> None:
    from bench.api import Options, run_api, show

    options = Options(duration_s=args.api_duration, clients=args.api_clients)
    figures = run_api(args.api_rates, options, partitions=args.partitions)
    show(figures)
    record("api", figures)


def step_plot(args: argparse.Namespace) -> None:
    plot = Path(__file__).resolve().parent / "plot.py"
    subprocess.run([str(peers_python()), str(plot)], check=True)


RUNNERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "e2e": step_e2e,
    "lag": step_lag,
    "lag_idle": step_lag_idle,
    "peers": step_peers,
    "ingest": step_ingest,
    "api": step_api,
    "plot": step_plot,
}


def _get(figures: dict[str, Any], path: str) -> Any:
    value: Any = figures
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def summary() -> None:
    figures = latest()
    rows = [
        ("e2e jobs/s", "e2e.jobs_per_s"),
        ("e2e latency p50 ms", "e2e.latency_ms.p50"),
        ("e2e latency p99 ms", "e2e.latency_ms.p99"),
        *(
            (f"lag p99 ms at {rate}/s", f"lag.{rate}.p99_ms")
            for rate in sorted(figures.get("lag", {}), key=int)
        ),
        *(
            (f"lag p99 ms, {int(idle):,} idle", f"lag_idle.{idle}.p99_ms")
            for idle in sorted(figures.get("lag_idle", {}), key=int)
        ),
        *(
            row
            for name in figures.get("peers", {})
            if name != "ours"
            for row in (
                (f"{name} jobs/s", f"peers.{name}.jobs_per_s"),
                (f"{name} lag p99 ms", f"peers.{name}.lag_p99_ms"),
                (f"{name} PostgreSQL CPU ms/job", f"peers.{name}.cost.pg_cpu_ms_per_job"),
                (f"ours ÷ {name} PostgreSQL CPU/job", f"peers.{name}.ours_over_theirs_pg_cpu_per_job"),
            )
        ),
        ("ingest Avro schedules/s", "ingest.avro_per_s"),
        ("ingest CLI schedules/s", "ingest.cli_per_s"),
        *(
            (f"api {transport} create p99 ms at {rate}/s", f"api.single.{transport}.{rate}.p99_ms")
            for transport, by_rate in figures.get("api", {}).get("single", {}).items()
            for rate in sorted(by_rate, key=int)
        ),
        *(
            (f"api {transport} batch schedules/s", f"api.batch.{transport}.schedules_per_s")
            for transport in figures.get("api", {}).get("batch", {})
        ),
    ]
    table = Table("figure", "value", "key in latest.json", title="bench/results/latest.json")
    for label, path in rows:
        value = _get(figures, path)
        table.add_row(label, "-" if value is None else f"{value:,}", path)
    machine = figures.get("machine", {})
    table.caption = f"{machine.get('cores')} cores, {machine.get('memory_gib')} GiB, {machine.get('date')}"
    console().print(table)


def main() -> None:
    args = arguments()
    out = console()
    failed: list[str] = []
    started = time.monotonic()
    for step in args.steps:
        out.rule(f"[bold]{step}")
        begun = time.monotonic()
        try:
            RUNNERS[step](args)
        except Exception:  # one step's failure must not cost the others' figures
            traceback.print_exc()
            failed.append(step)
        out.print(f"[dim]{step}: {time.monotonic() - begun:.0f} s[/]")
    out.rule("summary")
    summary()
    out.print(f"all steps: {time.monotonic() - started:.0f} s")
    if failed:
        out.print(f"[bold red]failed:[/] {', '.join(failed)}")
        raise SystemExit(1)


if __name__ == "__main__":
    run_main(main)
