"""The relay's metrics, in a registry of its own: its ``/metrics`` shows only these."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

PUBLISHED = Counter(
    "scheduler_relay_published_total", "Outbox messages acknowledged by Kafka", registry=REGISTRY
)
REPUBLISHED = Counter(
    "scheduler_relay_republished_total",
    "Outbox messages published more than once (a relay died or lost its claim): duplicates on Kafka",
    registry=REGISTRY,
)
FAILURES = Counter(
    "scheduler_relay_publish_failures_total",
    "Batches Kafka took none of (it is down or unreachable): the relay backs off",
    registry=REGISTRY,
)
RELEASED = Counter(
    "scheduler_relay_released_total",
    "Outbox messages Kafka did not acknowledge for a reason that may pass, handed back to publish again",
    registry=REGISTRY,
)
OBSOLETE_DROPPED = Counter(
    "scheduler_relay_obsolete_republishes_total",
    "Job messages due to be published again whose attempt a worker had already started (or a later "
    "attempt replaced), dropped instead of running the job twice",
    registry=REGISTRY,
)
QUARANTINED = Counter(
    "scheduler_relay_quarantined_total",
    "Outbox rows Kafka refused for a fault of the message itself, moved to the quarantine table "
    "(their runs dead), by cause",
    ["cause"],  # too_large, invalid
    registry=REGISTRY,
)
HELD = Counter(
    "scheduler_relay_held_total",
    "Outbox rows handed back because their topic does not exist and cannot be created, by cause",
    ["cause"],  # no_app, core_topic, create_failed, not_ready
    registry=REGISTRY,
)
HELD_TOPICS = Gauge(
    "scheduler_relay_held_topics",
    "Topics that do not exist and whose outbox rows the relay holds until they do",
    registry=REGISTRY,
)
DISPATCH_LAG = Histogram(
    "scheduler_dispatch_lag_seconds",
    "From when an outbox row may be published (its creation, or the end of its jitter or retry delay) "
    "to Kafka's acknowledgement of its message",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
OUTBOX_DEPTH = Gauge("scheduler_outbox_depth", "Outbox rows waiting to be published", registry=REGISTRY)
OUTBOX_OLDEST_AGE = Gauge(
    "scheduler_outbox_oldest_age_seconds",
    "How long the longest-waiting publishable outbox row has waited (0 when none waits): a row held "
    "back on purpose (jitter, a retry's delay) counts from its release",
    registry=REGISTRY,
)

# A labelled counter's series appears at its first increment, and increase() over a series' first
# sample is 0: the alert on a first quarantined row would never fire. Every known label starts at 0.
for _cause in ("too_large", "invalid"):
    QUARANTINED.labels(_cause)
for _cause in ("no_app", "core_topic", "create_failed", "not_ready"):
    HELD.labels(_cause)
