"""The scanner's metrics, in a registry of its own: its ``/metrics`` shows only these."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

JOBS_SCHEDULED = Counter(
    "job_scheduled_total",
    "Run attempts written to the outbox: first attempts by schedule kind, re-dispatches as kind=retry",
    ["app", "kind"],
    registry=REGISTRY,
)
RUNS_SKIPPED = Counter(
    "scheduler_scanner_runs_skipped_total",
    "Fires recorded as skipped, by reason (misfire or overlap policy)",
    ["reason"],
    registry=REGISTRY,
)
FIRE_LAG = Histogram(
    "scheduler_scanner_fire_lag_seconds",
    "Database time at which a fire was turned into a run, minus its scheduled time",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60),
    registry=REGISTRY,
)
SCAN_LAG = Gauge(
    "scheduler_scan_lag_seconds",
    "Now minus the oldest due fire or retry not yet turned into a run (0 when nothing is due), "
    "as of the scanner's last look at the database aged to the scrape",
    registry=REGISTRY,
)
SCHEDULES_ERRORED = Counter(
    "scheduler_scanner_schedules_errored_total",
    "Schedules moved to state error because their fires could not be computed (zone, expression)",
    ["app"],
    registry=REGISTRY,
)
SCHEDULES_IN_ERROR = Gauge(
    "scheduler_schedules_in_error",
    "Schedules in state error (refreshed by each scanner every few seconds): they fire no more",
    registry=REGISTRY,
)
