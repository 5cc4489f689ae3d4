"""The ingestor's metrics, in a registry of its own: its ``/metrics`` shows only these."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

COMMANDS = Counter(
    "scheduler_ingestor_commands_total",
    "Consumed schedule commands by what became of them (applied, duplicate, rejected)",
    ["outcome"],
    registry=REGISTRY,
)
REJECTED = Counter(
    "scheduler_ingestor_rejected_total",
    "Schedule commands rejected, by rejection code (undecodable, invalid, not_found, conflict)",
    ["code"],
    registry=REGISTRY,
)
BATCH_SECONDS = Histogram(
    "scheduler_ingestor_batch_seconds",
    "Time to decode, apply and commit one consumed batch of schedule commands",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
CONSUMER_LAG = Gauge(
    "scheduler_consumer_lag",
    "Messages behind the high watermark, per assigned partition of the commands topic",
    ["topic", "partition"],
    registry=REGISTRY,
)
