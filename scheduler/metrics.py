"""Prometheus metrics of every component, named ``scheduler_<component>_<what>``.

Defined once here so that a component imports the counters it moves and a dashboard finds every
name in one file. ``serve`` exposes them when ``SCHEDULER_METRICS_PORT`` is set.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

SCANNER_RUNS_CREATED = Counter("scheduler_scanner_runs_created_total", "Runs created by fires")
SCANNER_RUNS_SKIPPED = Counter(
    "scheduler_scanner_runs_skipped_total", "Fires recorded as skipped (misfire or overlap policy)"
)
SCANNER_RETRIES_DISPATCHED = Counter(
    "scheduler_scanner_retries_dispatched_total", "Retry attempts written to the outbox"
)
SCANNER_LAG = Histogram(
    "scheduler_scanner_fire_lag_seconds",
    "Database time at which a fire was turned into a run, minus its scheduled time",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60),
)
RELAY_PUBLISHED = Counter("scheduler_relay_published_total", "Outbox messages acknowledged by Kafka")
RELAY_REPUBLISHED = Counter(
    "scheduler_relay_republished_total",
    "Outbox messages published more than once (a relay died or lost its claim): duplicates on Kafka",
)
RELAY_FAILURES = Counter("scheduler_relay_publish_failures_total", "Batches Kafka did not acknowledge")


def serve(port: int | None) -> None:
    if port:
        start_http_server(port)


RECONCILER_EVENTS = Counter(
    "scheduler_reconciler_events_total", "Outcome events by what became of them", ["outcome"]
)
RECONCILER_UNDECODABLE = Counter(
    "scheduler_reconciler_undecodable_total", "Messages on the outcome topics that could not be decoded"
)
RECONCILER_SWEPT = Counter("scheduler_reconciler_swept_total", "Runs whose lease expired without an outcome")

INGESTOR_COMMANDS = Counter(
    "scheduler_ingestor_commands_total",
    "Consumed schedule commands by what became of them (applied, duplicate, rejected)",
    ["outcome"],
)
INGESTOR_REJECTED = Counter(
    "scheduler_ingestor_rejected_total",
    "Schedule commands rejected, by rejection code (undecodable, invalid, not_found, conflict)",
    ["code"],
)
INGESTOR_BATCH_SECONDS = Histogram(
    "scheduler_ingestor_batch_seconds",
    "Time to decode, apply and commit one consumed batch of schedule commands",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
