"""Counters an alert watches with increase() exist at 0 from the start: a series that first appears
with the value 1 has an increase of 0 over its one sample, and its alert would never fire."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import CollectorRegistry, generate_latest

from scheduler.worker import metrics as worker


def exposed(registry: CollectorRegistry) -> set[str]:
    return {line for line in generate_latest(registry).decode().splitlines() if not line.startswith("#")}


def test_every_known_cause_and_outcome_is_exposed_at_zero_before_it_happens() -> None:
    # A process of its own: tests run in this one count quarantines too.
    script = (
        "from prometheus_client import generate_latest as g\n"
        "from scheduler.relay import metrics as a\nfrom scheduler.reconcile import metrics as b\n"
        "print(g(a.REGISTRY).decode()); print('---'); print(g(b.REGISTRY).decode())"
    )
    printed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    relay_text, reconciler_text = printed.split("---\n")
    relay_lines, reconciler_lines = set(relay_text.splitlines()), set(reconciler_text.splitlines())
    for cause in ("too_large", "invalid"):
        assert f'scheduler_relay_quarantined_total{{cause="{cause}"}} 0.0' in relay_lines
    for cause in ("undecodable", "unknown_app", "no_worker", "refused"):
        assert f'scheduler_reconciler_quarantined_total{{cause="{cause}"}} 0.0' in reconciler_lines
    for outcome in ("retry", "dead"):
        assert f'scheduler_lease_expiries_total{{outcome="{outcome}"}} 0.0' in reconciler_lines


def test_a_worker_exposes_its_apps_failure_counters_at_zero_as_it_starts() -> None:
    worker.start_series("billing-zero")
    lines = exposed(worker.REGISTRY)
    for name in (
        "scheduler_worker_outcome_delivery_failures_total",
        "scheduler_worker_undecodable_total",
        "scheduler_worker_start_delivery_failures_total",
        "job_retry_count_total",
    ):
        assert f'{name}{{app="billing-zero"}} 0.0' in lines, name


def test_execution_time_has_a_bucket_bound_every_minute_up_to_the_p99_alert() -> None:
    # histogram_quantile interpolates within a bucket: with no bound between 60 and 300 s, jobs of
    # 61 s read as a p99 of 297 s, above the alert's 240 s (monitoring/alerts.test.yml has the case).
    worker.EXECUTION_DURATION.labels("b", "succeeded")
    lines = exposed(worker.REGISTRY)
    bounds = {line.split('le="')[1].split('"')[0] for line in lines if 'app="b"' in line and "le=" in line}
    assert {"60.0", "120.0", "180.0", "240.0", "300.0"} <= bounds
