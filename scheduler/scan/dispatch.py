"""Job messages for the outbox: what the scanner (and trigger-now) writes for each run attempt.

The message is encoded here, once, at the moment the run is created, so the relay publishes bytes
without decoding or touching the domain. A dispatched attempt has no lease: time in the outbox, on
the topic or behind a backlog never counts against it. Its clock starts when a worker starts the
job (the worker enforces the timeout from there, and the reconciler gives the run its lease on the
worker's start event), so the message's ``deadline`` is informational: when the attempt would end
had it started at once.

Each message also says when its attempt was due to start (header ``scheduler-due-at``), which the
worker's start lag is measured from: only the scheduler's own lateness is to count there. A fire
the scanner dispatches on time is due at its instant (the scan's delay in finding it is lateness);
anything else is due when it is dispatched: a ``buffer_one`` fire let go as the run before it ended,
a trigger, a retry, a re-dispatch, a replay. The scanner says when a fire of its own is late by
design (a misfire's catch-up, a one-shot created after its instant, its jitter). Only a first attempt due at
least a millisecond after its instant carries the header; the worker reads its absence as "due at
scheduled_for".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from uuid import UUID

from scheduler.config import Settings
from scheduler.domain.run import FailedAttempt
from scheduler.domain.schedule import ExecutionSettings
from scheduler.domain.storable import MAX_HISTORY_ERROR_CHARS, capped_text
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import (
    ATTEMPT_HEADER,
    DUE_AT_HEADER,
    RUN_ID_HEADER,
    AttemptSummary,
    JobMessage,
    RetryPolicy,
    idempotency_key_for,
)
from scheduler.kafka.tracing import HEADER, run_traceparent
from scheduler.store.scan import Message

# An attempt whose `attempts` row has no end yet travels with this one.
NO_END = datetime.min.replace(tzinfo=UTC)
# A due instant within this of the fire's is the fire's (the start lag's finest bucket is 1 ms): an
# immediate job's instant and its schedule's creation differ by the microseconds between them.
DUE_AT_RESOLUTION = timedelta(milliseconds=1)


def attempt_deadline(dispatched_at: datetime, timeout_ms: int) -> datetime:
    """The job message's ``deadline``: the dispatch time plus the attempt's timeout. Nothing acts on
    it; the worker counts the timeout from its own start of the job."""
    return dispatched_at + timedelta(milliseconds=timeout_ms)


class JobDispatcher:
    """Builds the outbox message of a run attempt: the one way a job message is made."""

    def __init__(self, settings: Settings, codec: AvroCodec | None = None) -> None:
        self.settings = settings
        self.codec = codec or AvroCodec()

    def message(
        self,
        *,
        run_id: UUID,
        schedule_id: UUID,
        job: ExecutionSettings,
        scheduled_for: datetime,
        attempt: int,
        deadline: datetime,
        previous_attempts: Sequence[FailedAttempt] = (),
        traceparent: str | None = None,
        due_at: datetime | None = None,
    ) -> Message:
        """The attempt's outbox message. ``due_at``: when it is due to start (see the module's
        docstring); by default the dispatch instant, which ``deadline`` counts from."""
        if due_at is None:
            due_at = deadline - timedelta(milliseconds=job.timeout_ms)
        headers = {
            # The trace to continue (a one-shot's creation), or the run's own, whose id is the
            # run's: every attempt of the run is in it.
            HEADER: traceparent or run_traceparent(run_id),
            RUN_ID_HEADER: str(run_id),
            ATTEMPT_HEADER: str(attempt),
        }
        # Only a first attempt's start lag is measured, and only one due later than its instant
        # needs to say so: the fire dispatched on time, nearly every job, carries nothing more
        # (its row, its message and its worker's reading stay as they were).
        if attempt == 1 and due_at - scheduled_for >= DUE_AT_RESOLUTION:
            headers[DUE_AT_HEADER] = due_at.astimezone(UTC).isoformat()
        message = JobMessage(
            run_id=run_id,
            schedule_id=schedule_id,
            app=job.app,
            attempt=attempt,
            idempotency_key=idempotency_key_for(run_id),
            scheduled_for=scheduled_for,
            handler=job.handler,
            payload=json.dumps(job.payload, separators=(",", ":"), ensure_ascii=False),
            timeout_ms=job.timeout_ms,
            deadline=deadline,
            retry=RetryPolicy(
                max_attempts=job.max_attempts,
                backoff_base_ms=job.backoff_base_ms,
                backoff_max_ms=job.backoff_max_ms,
            ),
            previous_attempts=tuple(attempt_summary(a) for a in previous_attempts),
        )
        return Message(
            topic=self.settings.jobs_topic(job.app),
            # Keyed by schedule: the runs of one schedule stay in order on one partition.
            key=str(schedule_id).encode(),
            value=self.codec.encode(message),
            headers=headers,
        )


def attempt_summary(attempt: FailedAttempt, default_end: datetime = NO_END) -> AttemptSummary:
    """An earlier attempt as job messages and dead letters carry it: its error capped, because
    every later message of the run carries the whole history again."""
    # The schema requires an end, an error and a class, which an `attempts` row may lack: such an
    # attempt still travels, with neutral values, rather than losing the history.
    return AttemptSummary(
        attempt=attempt.attempt,
        finished_at=attempt.finished_at or default_end,
        error=capped_text(attempt.error or "", MAX_HISTORY_ERROR_CHARS),
        error_class=attempt.error_class or "Error",
        worker=attempt.worker,
        started_at=attempt.started_at,
    )
