"""The worker's metrics, in a registry of its own: its ``/metrics`` shows only these.

Labels are bounded: the app (one per worker), the outcome, and the error class, which comes from
handler code and is therefore capped (:class:`~scheduler.telemetry.labels.BoundedLabel`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler.telemetry.labels import BoundedLabel

REGISTRY = CollectorRegistry()

EXECUTION_DURATION = Histogram(
    "job_execution_duration_seconds",
    "Handler run time of each attempt, by outcome (succeeded, retry, dead)",
    ["app", "outcome"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
    registry=REGISTRY,
)
EXECUTION_ERRORS = Counter(
    "job_execution_errors_total",
    "Attempts that failed, by error class",
    ["app", "error_class"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "job_retry_count",
    "Attempts that failed retryably and were sent to the retry topic",
    ["app"],
    registry=REGISTRY,
)
QUEUE_SIZE = Gauge(
    "job_queue_size",
    "Jobs waiting on the app's topic: consumer lag summed over this worker's partitions",
    ["app"],
    registry=REGISTRY,
)
ACTIVE_JOBS = Gauge("scheduler_active_jobs", "Handlers running now", ["app"], registry=REGISTRY)
CONCURRENCY = Gauge(
    "scheduler_worker_concurrency", "Handler slots of this worker (--concurrency)", ["app"], registry=REGISTRY
)
CONSUMER_LAG = Gauge(
    "scheduler_consumer_lag",
    "Messages behind the high watermark, per assigned partition",
    ["topic", "partition"],
    registry=REGISTRY,
)
UNDECODABLE = Counter(
    "scheduler_worker_undecodable_total",
    "Job messages that could not be decoded (dead-lettered with their bytes)",
    ["app"],
    registry=REGISTRY,
)
ERROR_CLASS = BoundedLabel()
