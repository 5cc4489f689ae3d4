"""The figures of ``results/latest.json`` as two pictures next to it.

- ``lag.png``: start lag (worker start minus due time) against load, p50/p90/p99 on log scales,
  with dispatch p99 dashed and the peers' p99 at their rate as single points; beside it the
  same 1,000 fires/s with few and with many idle schedules.
- ``throughput.png``: no-op jobs per second for ours and each peer, their delayed-job p99, and
  what PostgreSQL spent per job (CPU, from ``peers.<name>.cost``; Celery has none).

Runs with matplotlib from the peers' virtualenv, so the project needs no plotting library:

    bench/results/.venv-peers/bin/python bench/plot.py [--results bench/results]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RESULTS = Path(__file__).resolve().parent / "results"
COLOURS = {"ours": "#1f6feb", "pgqueuer": "#8250df", "pgqueuer_tuned": "#c297ff", "celery": "#2da44e"}
PEER_MARKERS = {"pgqueuer": "D", "pgqueuer_tuned": "d", "celery": "s"}


def _subtitle(latest: dict[str, Any]) -> str:
    machine = latest.get("machine", {})
    cores, memory = machine.get("cores", "?"), machine.get("memory_gib", "?")
    return f"{cores} cores, {memory} GiB, {machine.get('date', '')[:10]}"


def plot_lag(latest: dict[str, Any], out: Path) -> Path | None:
    lag = latest.get("lag")
    idle = latest.get("lag_idle")
    if not lag and not idle:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    if lag:
        points = sorted(lag.values(), key=lambda entry: entry["rate_per_s"])
        rates = [p["rate_per_s"] for p in points]
        for key, style in (("p50_ms", ":"), ("p90_ms", "--"), ("p99_ms", "-")):
            left.plot(
                rates,
                [p.get(key) for p in points],
                style,
                marker="o",
                color=COLOURS["ours"],
                label=f"ours start {key[:3]}",
            )
        # Only runs from before the relay stopped recording dispatched_at have a dispatch figure.
        dispatched = [(p.get("dispatch") or {}).get("p99_ms") for p in points]
        if any(value is not None for value in dispatched):
            left.plot(
                rates,
                [math.nan if value is None else value for value in dispatched],
                "-.",
                marker=".",
                color="#999999",
                label="ours dispatched p99",
            )
        for p in points:
            late = p.get("last_start_after_window_s", 0)
            if p.get("stalled"):
                note = "stalled:\nlower bound"
            elif late > 1:
                note = f"fell behind:\nlast start {late:.0f} s\nafter the window"
            else:
                continue
            left.annotate(
                note,
                (p["rate_per_s"], p["p99_ms"]),
                textcoords="offset points",
                xytext=(-165, -25),
                fontsize=8,
                color="#cf222e",
            )
        for name, entry in latest.get("peers", {}).items():
            if name in PEER_MARKERS and entry.get("lag_p99_ms") is not None:
                left.scatter(
                    [entry["lag_rate_per_s"]],
                    [entry["lag_p99_ms"]],
                    marker=PEER_MARKERS[name],
                    s=60,
                    color=COLOURS[name],
                    zorder=3,
                    label=f"{name} p99",
                )
        left.set_xscale("log")
        left.set_yscale("log")
        left.set_xticks(rates, [f"{r:,}" for r in rates])
        left.set_xlabel("fires per second (due evenly over the window)")
        left.set_ylabel("lag after the due time, ms (log)")
        window = points[0]["window_s"]
        left.set_title(f"Start lag against load ({window:g} s windows)")
        left.grid(True, which="major", alpha=0.3)
        left.legend(fontsize=8, loc="upper left")
    else:
        left.set_axis_off()
    if idle:
        entries = sorted(idle.values(), key=lambda entry: entry["idle_schedules"])
        keys = ("p50_ms", "p90_ms", "p99_ms", "scan_p99")
        for entry in entries:
            entry["scan_p99"] = entry["scan"].get("p99_ms")
        width = 0.8 / len(entries)
        shades = ["#9ecbff", "#1f6feb", "#0a3069", "#6e7781"]
        for i, entry in enumerate(entries):
            xs = [k + (i - (len(entries) - 1) / 2) * width for k in range(len(keys))]
            bars = right.bar(
                xs,
                [entry.get(k) or 0 for k in keys],
                width,
                color=shades[i % len(shades)],
                label=f"{entry['idle_schedules']:,} idle (lease query {entry['lease_query_ms']} ms)",
            )
            right.bar_label(bars, fmt="%.0f", fontsize=8)
        right.set_xticks(range(len(keys)), ["start p50", "start p90", "start p99", "scan p99"])
        right.set_ylabel("start lag, ms")
        right.set_title(f"{entries[0]['rate_per_s']:,} fires/s with idle schedules in the table")
        right.legend(fontsize=8, loc="upper left")
        right.grid(True, axis="y", alpha=0.3)
    else:
        right.set_axis_off()
    fig.suptitle(f"Firing precision: worker start minus scheduled time — {_subtitle(latest)}", fontsize=11)
    fig.tight_layout()
    path = out / "lag.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_throughput(latest: dict[str, Any], out: Path) -> Path | None:
    peers = latest.get("peers") or {}
    systems = dict(peers)
    if "ours" not in systems and "e2e" in latest:
        systems["ours"] = {"jobs_per_s": latest["e2e"]["jobs_per_s"]}
    if not systems:
        return None
    names = sorted(
        (name for name in systems if systems[name].get("jobs_per_s") is not None),
        key=lambda name: (name != "ours", name),
    )
    fig, (left, right, cost) = plt.subplots(1, 3, figsize=(16, 3.8))
    bars = left.barh(
        names, [systems[n]["jobs_per_s"] for n in names], color=[COLOURS.get(n, "#999") for n in names]
    )
    left.bar_label(bars, labels=[f"{systems[n]['jobs_per_s']:,.0f}" for n in names], padding=3, fontsize=9)
    left.invert_yaxis()
    left.set_xlabel("no-op jobs per second (higher is better)")
    if "celery" in systems:
        note = "Celery: drain of a pre-filled queue (publishing is one client's, apart)"
        left.text(1.0, -0.3, note, transform=left.transAxes, ha="right", fontsize=7, color="#57606a")
    ours = systems.get("ours", {})
    jobs, workers = ours.get("jobs"), ours.get("workers")
    others = ", ".join(
        f"{n}: {systems[n]['workers']}" for n in names if systems[n].get("workers") not in (None, workers)
    )
    title = f"Throughput: {jobs:,} jobs, {workers} worker processes" if jobs else "Throughput"
    left.set_title(f"{title} ({others})" if jobs and others else title, fontsize=10 if others else None)
    left.margins(x=0.2)
    lagged = [n for n in names if systems[n].get("lag_p99_ms") is not None]
    if lagged:
        bars = right.barh(
            lagged, [systems[n]["lag_p99_ms"] for n in lagged], color=[COLOURS.get(n, "#999") for n in lagged]
        )
        right.bar_label(
            bars, labels=[f"{systems[n]['lag_p99_ms']:,.0f} ms" for n in lagged], padding=3, fontsize=9
        )
        right.invert_yaxis()
        right.set_xscale("log")
        right.set_xlabel("delayed-job start lag p99, ms (log; lower is better)")
        rate = systems[lagged[0]].get("lag_rate_per_s")
        right.set_title(f"Delayed jobs at {rate:,}/s" if rate else "Delayed jobs")
        right.margins(x=0.3)
    else:
        right.set_axis_off()
    plot_cost(cost, systems, names)
    fig.suptitle(f"Ours against peers on the same machine — {_subtitle(latest)}", fontsize=11)
    fig.tight_layout()
    path = out / "throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_cost(axes: Any, systems: dict[str, Any], names: list[str]) -> None:
    """PostgreSQL CPU per job of the throughput phase, with WAL per job in the label."""
    costed = [n for n in names if (systems[n].get("cost") or {}).get("pg_cpu_ms_per_job") is not None]
    if not costed:
        axes.set_axis_off()
        return
    costs = [systems[n]["cost"] for n in costed]
    bars = axes.barh(
        costed, [c["pg_cpu_ms_per_job"] for c in costs], color=[COLOURS.get(n, "#999") for n in costed]
    )
    axes.bar_label(
        bars,
        labels=[
            f"{c['pg_cpu_ms_per_job']:.2f} ms, {c.get('wal_bytes_per_job', 0) / 1000:.1f} kB WAL"
            for c in costs
        ],
        padding=3,
        fontsize=9,
    )
    axes.invert_yaxis()
    axes.set_xlabel("PostgreSQL CPU per job, ms (lower is better)")
    axes.set_title("Database work per job (whole server)")
    axes.margins(x=0.6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    latest = json.loads((args.results / "latest.json").read_text())
    for path in (plot_lag(latest, args.results), plot_throughput(latest, args.results)):
        if path is not None:
            print(f"written {path}")


if __name__ == "__main__":
    main()
