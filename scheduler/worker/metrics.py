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
    "Time of each attempt from the start its started event records to its outcome (the handler's run "
    "time, and the wait for Kafka's acknowledgement of that event when not held to its instant), by "
    "outcome (succeeded, retry, dead)",
    ["app", "outcome"],
    # Bounds every minute up to the p99 alert's 240 s: with none between 60 and 300 s, jobs of 61 s
    # read as a p99 of 297 s (histogram_quantile interpolates within a bucket) and fired the alert.
    buckets=(
        0.001,
        0.005,
        0.01,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
        10,
        30,
        60,
        120,
        180,
        240,
        300,
        600,
        900,
        3600,
    ),
    registry=REGISTRY,
)
START_LAG = Histogram(
    "scheduler_worker_start_lag_seconds",
    "Time from when a job was due to its handler's start, first attempts only: the scheduler's own "
    "lateness. Due at its scheduled_for when dispatched on time; a fire late by design is due when "
    "let go (a buffer_one fire as the run before it ends, a misfire's catch-up or a fire a resume "
    "made due as the scan runs it, after its jitter). Retries, re-dispatches and replays start late "
    "by design and are not counted",
    ["app"],
    # Fine around the 5 ms target (its p99), wide enough for a backlog of minutes.
    buckets=(
        0.001,
        0.002,
        0.003,
        0.005,
        0.0075,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
        10,
        30,
        60,
        120,
        300,
    ),
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
HELD_JOBS = Gauge(
    "scheduler_worker_held_jobs",
    "Jobs fetched before their instant and held until it (in no slot; their offsets uncommitted)",
    ["app"],
    registry=REGISTRY,
)
HOLDS_CUT_SHORT = Counter(
    "scheduler_worker_holds_cut_short_total",
    "Jobs due further ahead than any look-ahead allows (a clock off, a message not from a scanner), "
    "started at the end of the longest hold instead of their instant",
    ["app"],
    registry=REGISTRY,
)
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
    "Job messages that could not be decoded, or of another app than the worker's "
    "(dead-lettered with their bytes, never run)",
    ["app"],
    registry=REGISTRY,
)
OUTCOMES_UNACKNOWLEDGED = Gauge(
    "scheduler_worker_outcomes_unacknowledged",
    "Outcomes produced and not yet acknowledged by Kafka; over the bound, no new job starts",
    ["app"],
    registry=REGISTRY,
)
OUTCOME_DELIVERY_FAILURES = Counter(
    "scheduler_worker_outcome_delivery_failures_total",
    "Failed deliveries of outcomes, each produced again after a backoff (never dropped)",
    ["app"],
    registry=REGISTRY,
)
OUTCOMES_UNENCODABLE = Counter(
    "scheduler_worker_outcomes_unencodable_total",
    "Outcomes that could not be encoded even in compact form; their runs recover by lease expiry",
    ["app"],
    registry=REGISTRY,
)
COMMIT_FAILURES = Counter(
    "scheduler_worker_commit_failures_total",
    "Offset commits Kafka refused or did not answer; retried by the next commit round",
    ["app"],
    registry=REGISTRY,
)
ABANDONED_THREADS = Counter(
    "scheduler_worker_abandoned_threads_total",
    "Synchronous handlers still running at their timeout, whose threads were left behind",
    ["app"],
    registry=REGISTRY,
)
ABANDONED_THREADS_ALIVE = Gauge(
    "scheduler_worker_abandoned_threads_running",
    "Threads of timed-out synchronous handlers that are still running",
    ["app"],
    registry=REGISTRY,
)
REFUSED_HANDLERS = Counter(
    "scheduler_worker_refused_handlers_total",
    "Jobs naming a handler this worker does not run (unregistered or unknown), dead at once",
    ["app"],
    registry=REGISTRY,
)
INTERNAL_ERRORS = Counter(
    "scheduler_worker_internal_errors_total",
    "Jobs the worker's own code failed on before handing over an outcome (logged with a trace)",
    ["app"],
    registry=REGISTRY,
)
DUPLICATE_DELIVERIES = Counter(
    "scheduler_worker_duplicate_deliveries_total",
    "Job messages of an attempt this worker had already started (a relay's republished copy, or "
    "offsets read again after a commit was lost), finished without running the handler again",
    ["app"],
    registry=REGISTRY,
)
START_DELIVERY_FAILURES = Counter(
    "scheduler_worker_start_delivery_failures_total",
    "Start events Kafka did not acknowledge; the job waits and its start is produced again",
    ["app"],
    registry=REGISTRY,
)
ERROR_CLASS = BoundedLabel()


def start_series(app: str) -> None:
    """Put the app's counters at 0 as the worker starts: a labelled counter's series appears at its
    first increment, and increase() over a series' first sample is 0, so an alert on a first failed
    outcome delivery (or a first undecodable job) would never fire."""
    for counter in (
        RETRIES,
        HOLDS_CUT_SHORT,
        UNDECODABLE,
        OUTCOME_DELIVERY_FAILURES,
        OUTCOMES_UNENCODABLE,
        COMMIT_FAILURES,
        ABANDONED_THREADS,
        REFUSED_HANDLERS,
        INTERNAL_ERRORS,
        DUPLICATE_DELIVERIES,
        START_DELIVERY_FAILURES,
    ):
        counter.labels(app)
