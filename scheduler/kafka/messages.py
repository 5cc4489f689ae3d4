"""The messages that travel through Kafka, as typed, immutable Python values.

Each class mirrors one record of ``schemas/*.avsc`` field for field (same names), so a message
converts to and from the dict that fastavro reads and writes without a mapping table; the schemas'
``doc`` strings are the reference for what each field means. Sub-records (``RetryPolicy``,
``AttemptSummary``, ``KafkaSource``, ``ScheduleSpec``) are values inside a message, not messages of
their own. Avro enum symbols are the words of the design (``fire_once``, ``buffer_one``): where the
domain has the enumeration (schedule kind, misfire and overlap policy) a message carries the domain's
``StrEnum``, elsewhere a ``Literal`` of the symbols. This module only describes;
:mod:`scheduler.kafka.avro` turns messages into bytes and back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, ClassVar, Literal, Self
from uuid import UUID

from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind
from scheduler.kafka.avro import AvroMessage

JobResultStatus = Literal["started", "heartbeat", "succeeded"]
DeadLetterCause = Literal["non_retryable", "retries_exhausted", "undecodable"]
ScheduleOperation = Literal["create", "update", "pause", "resume", "cancel", "trigger"]
RejectionCode = Literal["undecodable", "invalid", "not_found", "conflict"]


# The run and attempt a job message is for, also in its headers, outside its Avro body: a worker
# that cannot decode the body can still dead-letter the right attempt of the right run.
RUN_ID_HEADER = "scheduler-run-id"
ATTEMPT_HEADER = "scheduler-attempt"
# When the attempt was due to start (ISO 8601, UTC), what a worker measures its start lag from: the
# fire's instant for a fire dispatched on time, later for one late by design (a buffered fire let go,
# a misfire's catch-up). A header rather than a field of the Avro record: a record of a new version is
# undecodable to workers of an older release (its fingerprint unknown to them), which a rolling update
# runs beside the new scanners; a header they do not know they ignore. Absent (an older scanner): the
# start lag counts from scheduled_for.
DUE_AT_HEADER = "scheduler-due-at"


def idempotency_key_for(run_id: UUID) -> str:
    """The idempotency key of every attempt of a run.

    Run-scoped on purpose: a handler that already caused a side effect in a failed attempt must be able
    to recognise it in the retry. The attempt number, carried separately, is what fences attempts.
    """
    return str(run_id)


def _to_avro(value: object) -> object:
    if isinstance(value, _Record):
        return value.to_avro()
    if isinstance(value, tuple):
        return [_to_avro(item) for item in value]
    if isinstance(value, datetime) and value.tzinfo is None:
        # fastavro would read a naive datetime as the host's local time and shift it silently.
        raise ValueError(f"naive datetime {value.isoformat()}: message times must carry a time zone")
    return value


# Values fastavro takes as they are, looked up by their exact type before _to_avro's checks: a worker
# encodes two events per job, whose fields are nearly all of these (a subclass, such as a StrEnum,
# takes the checks' way and comes out the same).
_AS_IS: frozenset[type] = frozenset({str, int, bool, float, bytes, UUID, type(None)})

# dataclasses.fields() rebuilds its tuple on every call, and messages are encoded in hot loops.
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(record_type: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(record_type)
    if names is None:
        names = _FIELD_NAMES[record_type] = tuple(f.name for f in fields(record_type))
    return names


class _Record:
    """Shared conversion for the dataclasses below, whose field names are the Avro field names."""

    __slots__ = ()

    def to_avro(self) -> dict[str, Any]:
        """The dict fastavro writes; nested records become dicts, tuples become lists."""
        return {
            name: value if type(value) in _AS_IS else _to_avro(value)
            for name in _field_names(type(self))
            for value in (getattr(self, name),)  # one lookup per field (a loop of assignments is slower)
        }

    @classmethod
    def from_avro(cls, record: Mapping[str, Any]) -> Self:
        """The value of a dict fastavro read with this record's current schema as reader schema."""
        return cls(**record)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy(_Record):
    """Resolved retry settings, carried by each job so that workers decide retry or dead alone."""

    max_attempts: int
    backoff_base_ms: int
    backoff_max_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptSummary(_Record):
    """How one attempt of a run ended (job history and dead-letter history)."""

    attempt: int
    finished_at: datetime
    error: str
    error_class: str
    worker: str | None = None
    started_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaSource(_Record):
    """Where a consumed record was read from."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JobMessage(_Record):
    """One attempt of one run, on ``<prefix>.jobs.<app>``."""

    SCHEMA: ClassVar[str] = "JobMessage"

    run_id: UUID
    schedule_id: UUID
    app: str
    attempt: int
    idempotency_key: str
    scheduled_for: datetime
    handler: str
    payload: str
    timeout_ms: int
    deadline: datetime
    retry: RetryPolicy
    previous_attempts: tuple[AttemptSummary, ...] = ()

    @classmethod
    def from_avro(cls, record: Mapping[str, Any]) -> Self:
        return cls(
            **{
                **record,
                "retry": RetryPolicy.from_avro(record["retry"]),
                "previous_attempts": tuple(AttemptSummary.from_avro(a) for a in record["previous_attempts"]),
            }
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult(_Record):
    """Start, heartbeat or success of an attempt, on ``<prefix>.results``."""

    SCHEMA: ClassVar[str] = "JobResult"

    event_id: UUID
    status: JobResultStatus
    run_id: UUID
    schedule_id: UUID
    app: str
    attempt: int
    worker: str
    started_at: datetime
    finished_at: datetime | None = None
    result: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRetry(_Record):
    """A retryable failure of an attempt with attempts left, on ``<prefix>.retry``."""

    SCHEMA: ClassVar[str] = "JobRetry"

    event_id: UUID
    run_id: UUID
    schedule_id: UUID
    app: str
    attempt: int
    worker: str
    started_at: datetime
    finished_at: datetime
    error: str
    error_class: str
    not_before: datetime
    backoff_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDeadLetter(_Record):
    """A job that will not be retried, on ``<prefix>.dlq``; its job is the undecoded ``original_bytes``.

    ``run_id``, ``schedule_id`` and ``attempt`` are None only when ``cause`` is ``undecodable``.
    """

    SCHEMA: ClassVar[str] = "JobDeadLetter"

    event_id: UUID
    cause: DeadLetterCause
    app: str
    run_id: UUID | None
    schedule_id: UUID | None
    attempt: int | None
    worker: str | None
    started_at: datetime | None
    finished_at: datetime
    error: str
    error_class: str
    attempts: tuple[AttemptSummary, ...]
    original_bytes: bytes
    source: KafkaSource | None

    @classmethod
    def from_avro(cls, record: Mapping[str, Any]) -> Self:
        source = record["source"]
        return cls(
            **{
                **record,
                "attempts": tuple(AttemptSummary.from_avro(a) for a in record["attempts"]),
                "source": None if source is None else KafkaSource.from_avro(source),
            }
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec(_Record):
    """Everything that defines a schedule, as carried by create and update commands."""

    name: str
    kind: ScheduleKind
    handler: str
    payload: str = "{}"
    cron: str | None = None
    tz: str = "UTC"
    run_at: datetime | None = None
    start_at: datetime | None = None
    end_at: datetime | None = None
    max_attempts: int = 3
    timeout_seconds: int = 300
    misfire: MisfirePolicy = MisfirePolicy.FIRE_ONCE
    overlap: OverlapPolicy = OverlapPolicy.ALLOW
    backoff_base_ms: int = 1000
    backoff_max_ms: int = 300_000
    jitter_ms: int = 0

    @classmethod
    def from_avro(cls, record: Mapping[str, Any]) -> Self:
        return cls(
            **{
                **record,
                "kind": ScheduleKind(record["kind"]),
                "misfire": MisfirePolicy(record["misfire"]),
                "overlap": OverlapPolicy(record["overlap"]),
            }
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleCommand(_Record):
    """A client's change to one schedule, on ``<prefix>.schedules``; ``spec`` only for create and update."""

    SCHEMA: ClassVar[str] = "ScheduleCommand"

    command_id: str
    schedule_key: str
    app: str
    operation: ScheduleOperation
    spec: ScheduleSpec | None = None
    expected_version: int | None = None
    actor: str | None = None

    @classmethod
    def from_avro(cls, record: Mapping[str, Any]) -> Self:
        spec = record["spec"]
        return cls(**{**record, "spec": None if spec is None else ScheduleSpec.from_avro(spec)})


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleCommandRejected(_Record):
    """A command the ingestor did not apply, on ``<prefix>.schedules.rejected``."""

    SCHEMA: ClassVar[str] = "ScheduleCommandRejected"

    rejected_at: datetime
    code: RejectionCode
    reason: str
    command_id: str | None
    schedule_key: str | None
    app: str | None
    original_bytes: bytes
    source: KafkaSource

    @classmethod
    def from_avro(cls, record: Mapping[str, Any]) -> Self:
        return cls(**{**record, "source": KafkaSource.from_avro(record["source"])})


RECORDS: tuple[type[AvroMessage], ...] = (
    JobMessage,
    JobResult,
    JobRetry,
    JobDeadLetter,
    ScheduleCommand,
    ScheduleCommandRejected,
)
"""Every record the scheduler writes or reads: each needs its schema in the catalog."""
