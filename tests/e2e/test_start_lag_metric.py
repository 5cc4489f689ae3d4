"""How late handlers start, as the metrics tell it.

The product's timing target is about the start lag: when a handler starts, minus its run's
``scheduled_for`` (docs/architecture.md, Timing; p99 5 ms at 1,000 fires/s in bench/README.md).
An operator watches it from ``/metrics``: some histogram must count a job that started seconds late
as seconds late, with buckets fine enough to tell 5 ms. The histograms there measure other things:
``scheduler_scanner_fire_lag_seconds`` is when the scanner made the run (0 for every fire leased
ahead), ``scheduler_dispatch_lag_seconds`` the relay's publish, ``job_execution_duration_seconds``
the run from its start on. Jobs that wait on the topic for a worker start late, and none of them
says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.chaos_stack import free_port
from tests.e2e.health import cli, cli_json, get, wait_for_statuses
from tests.support import Component, wait_for

pytestmark = pytest.mark.e2e

APP = "late"
LATE_S = 5.0
PIPELINE = ("scanner", "relay", "reconciler")


def histograms_counting_late_starts(exposition: str) -> dict[str, list[float]]:
    """Each histogram (by name and labels) that counts an observation over :data:`LATE_S`, with its
    bucket bounds."""
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(exposition):
        if family.type != "histogram":
            continue
        series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            entry = series.setdefault(labels, {"bounds": [], "count": 0.0, "within": 0.0})
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                entry["bounds"].append(bound)
                if bound == LATE_S:
                    entry["within"] = sample.value
            elif sample.name.endswith("_count"):
                entry["count"] = sample.value
        for labels, entry in series.items():
            if LATE_S in entry["bounds"] and entry["count"] > entry["within"]:
                found[f"{family.name}{dict(labels)}"] = sorted(entry["bounds"])
    return found


def test_jobs_that_waited_for_a_worker_show_their_start_lag_in_a_histogram(
    settings_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    cli(env, "init")
    cli(env, "apps", "create", APP)
    ports = {name: free_port() for name in (*PIPELINE, "worker")}
    started = [
        Component(name, env | {"SCHEDULER_METRICS_PORT": str(ports[name])}, tmp_path) for name in PIPELINE
    ]

    def logs() -> str:
        return "\n".join(f"--- {c.name}\n{c.output()[-2500:]}" for c in started)

    try:
        wait_for_statuses({name: ports[name] for name in PIPELINE}, "/ready", 200, 60, logs)
        ids = [
            cli_json(env, "schedules", "create", "--app", APP, "--now", "--handler", "builtin:noop")["id"]
            for _ in range(3)
        ]

        def waited_long_enough() -> bool:
            # Published, and past their instant by more than LATE_S: whenever a worker runs them now,
            # they start late by that much at least.
            with psycopg.connect(database_url) as conn:
                waiting = conn.execute(
                    "select count(*) from runs where schedule_id = any(%s) and state = 'pending'"
                    " and scheduled_for < now() - make_interval(secs => %s)"
                    " and not exists (select 1 from outbox)",
                    (ids, LATE_S + 1),
                ).fetchone()
            return waiting is not None and waiting[0] == len(ids)

        wait_for(waited_long_enough, 60, "the runs to wait for a worker past their instant", 0.5)
        started.append(
            Component(
                "worker", env | {"SCHEDULER_METRICS_PORT": str(ports["worker"])}, tmp_path, "--app", APP
            )
        )
        with psycopg.connect(database_url) as conn:

            def succeeded() -> list[float]:
                rows = conn.execute(
                    "select extract(epoch from started_at - scheduled_for)::float from runs"
                    " where schedule_id = any(%s) and state = 'succeeded'",
                    (ids,),
                ).fetchall()
                conn.commit()
                return [row[0] for row in rows] if len(rows) == len(ids) else []

            lags = wait_for(succeeded, 60, "the runs to succeed")
        assert all(lag > LATE_S for lag in lags), f"the runs' own history: started {lags} s late"

        # What /metrics says of those starts, on every component (the worker counted each outcome
        # before the reconciler could record it).
        scraped = {
            name: histograms_counting_late_starts(get(port, "/metrics").text) for name, port in ports.items()
        }
        late = {name: found for name, found in scraped.items() if found}
        assert late, (
            f"the runs started {min(lags):.1f} to {max(lags):.1f} s late and no histogram of any component "
            f"counts an observation over {LATE_S:g} s"
        )
        for histograms in late.values():
            for name, bounds in histograms.items():
                assert bounds[0] <= 0.005, f"{name} cannot tell a start 5 ms late: its buckets are {bounds}"
    finally:
        codes = {c.name: c.stop() for c in started}
    assert codes == dict.fromkeys((*PIPELINE, "worker"), 0), logs()
