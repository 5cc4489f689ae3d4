"""Metrics of the reconciler component, in a registry of its own: its ``/metrics`` shows only these.

The component is three services in one process (``scheduler run reconciler``): the reconciler
proper, the lease sweeper (which applies the history's retention too) and the buffer release;
each moves its own metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry()

EVENTS = Counter(
    "scheduler_reconciler_events_total",
    "Outcome events by what became of them (applied, stale, duplicate, reexecution: a start of an "
    "attempt that had been started before, i.e. a second execution)",
    ["outcome"],
    registry=REGISTRY,
)
UNDECODABLE = Counter(
    "scheduler_reconciler_undecodable_total",
    "Messages on the outcome topics that could not be decoded",
    registry=REGISTRY,
)
QUARANTINED = Counter(
    "scheduler_reconciler_quarantined_total",
    "Outcome messages set aside in the quarantine table instead of applied, by cause "
    "(undecodable; unknown_app: a run-less dead letter naming no app there is; no_worker: a dead "
    "letter without a worker, whose run's lease expiry is not on record; refused: PostgreSQL refused "
    "to store it)",
    ["cause"],
    registry=REGISTRY,
)
CLOCK_AHEAD_EVENTS = Counter(
    "scheduler_reconciler_clock_ahead_events_total",
    "Outcome events PostgreSQL stored (not quarantined, not another app's) stamped over 0.25 s later "
    "than its clock when applied: their worker's clock is ahead, and it starts jobs leased ahead early "
    "by as much (the log names the worker)",
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "scheduler_dead_letters_total",
    "Runs that became dead, by app (from workers' dead letters and expired leases)",
    ["app"],
    registry=REGISTRY,
)
CONSUMER_LAG = Gauge(
    "scheduler_consumer_lag",
    "Messages behind the high watermark, per assigned partition of the outcome topics",
    ["topic", "partition"],
    registry=REGISTRY,
)
LAST_BATCH = Gauge(
    "scheduler_reconciler_last_batch_timestamp_seconds",
    "Unix time of the reconciler's last applied batch or empty poll",
    registry=REGISTRY,
)

LEASE_EXPIRIES = Counter(
    "scheduler_lease_expiries_total",
    "Runs whose lease expired without an outcome, by what became of them (retry, dead)",
    ["outcome"],
    registry=REGISTRY,
)
SWEEP_HELD = Gauge(
    "scheduler_lease_sweep_held_seconds",
    "How long the lease sweeper has been holding expired leases because the reconciler had not "
    "read the outcome topics up to the present (0 when it is not holding any)",
    registry=REGISTRY,
)
SWEEP_UNREAD = Gauge(
    "scheduler_lease_sweep_unread_outcomes",
    "Outcome messages the reconciler had not consumed when the lease sweeper last checked, while it "
    "holds expired leases (0 when it is not holding any)",
    registry=REGISTRY,
)
BUFFERED_RELEASED = Counter(
    "scheduler_buffered_runs_released_total",
    "Fires that buffer_one kept waiting, dispatched once the run before them ended",
    registry=REGISTRY,
)
HISTORY_DELETED = Counter(
    "scheduler_history_deleted_total",
    "Rows the history retention deleted (SCHEDULER_HISTORY_RETENTION_DAYS), by table: finished "
    "runs, their attempts, and the finished schedules they left with no run",
    ["table"],
    registry=REGISTRY,
)

# A labelled counter's series appears at its first increment, and increase() over a series' first
# sample is 0: the alert on a first quarantined outcome would never fire. Every known label starts at 0.
for _outcome in ("applied", "stale", "duplicate", "reexecution"):
    EVENTS.labels(_outcome)
for _cause in ("undecodable", "unknown_app", "no_worker", "refused"):
    QUARANTINED.labels(_cause)
for _outcome in ("retry", "dead"):
    LEASE_EXPIRIES.labels(_outcome)
for _table in ("runs", "attempts", "schedules"):
    HISTORY_DELETED.labels(_table)
