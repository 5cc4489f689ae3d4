"""Decoding and validating one consumed ``ScheduleCommand``, before any database is involved.

The first step of the ingestor: every message of a batch becomes either a :class:`ValidCommand`
(decoded, its spec checked by the validation the CLI uses, :mod:`scheduler.schedule.spec`'s
``validate``) or a :class:`~scheduler.store.ingest.Rejection` with a code and a one-line reason.
Nothing here raises for bad input, so one malformed message can never stop a batch; only an
unreachable schema registry propagates (the message may be fine, so it must be retried, not
rejected).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.domain.storable import capped_text, quoted
from scheduler.kafka.avro import AvroCodec, MessageDecodeError
from scheduler.kafka.messages import ScheduleCommand
from scheduler.kafka.messages import ScheduleSpec as SpecMessage
from scheduler.schedule.spec import (
    MAX_TIMEOUT_MS,
    SCHEDULE_KEY_RE,
    VISIBLE_TEXT_RULE,
    InvalidSchedule,
    ScheduleSpec,
    check_text,
    parse_payload,
    validate_app_name,
    validate_encoded,
    validate_schedule_key,
)
from scheduler.store.ingest import Rejection, Source

MAX_ID_LENGTH = 200
"""Longest command id and schedule key (both are stored and shown)."""

SPEC_OPERATIONS = ("create", "update")

MAX_REJECTION_ID_CHARS = 1024
"""Most of a command id, key or app a rejection records: far more than a valid one has."""


@dataclass(frozen=True, slots=True)
class Consumed:
    """A message as read from the commands topic, independent of the Kafka client's types."""

    source: Source
    value: bytes
    key: bytes | None = None
    traceparent: str | None = None
    """The producer's W3C trace context, continued by the command's rejection if it has one."""
    timestamp_ms: int | None = None
    """The message's Kafka timestamp: with its bytes, what tells a batch read again after a crash
    from a new message at the same position of a topic recreated since."""


@dataclass(frozen=True, slots=True)
class ValidCommand:
    """A decoded command whose fields are fit to apply; ``spec`` is set for create and update."""

    consumed: Consumed
    command: ScheduleCommand
    spec: ScheduleSpec | None
    payload: str | None
    """The spec's payload as the JSON text to store (create and update)."""

    @property
    def source(self) -> Source:
        return self.consumed.source

    @property
    def key(self) -> tuple[str, str]:
        return (self.command.app, self.command.schedule_key)

    @property
    def actor(self) -> str:
        """What the audit log names: the command's actor and its id."""
        return f"{self.command.actor or 'producer'} (command {self.command.command_id})"


def _storable(text: str | None) -> str | None:
    """``text`` as PostgreSQL can store it (and Avro can encode): a rejection records whatever the
    command carried, a NUL or a lone surrogate included, escaped and visible, and cut where it is
    longer than any valid one (the command's bytes keep it whole)."""
    return None if text is None else capped_text(text, MAX_REJECTION_ID_CHARS)


def rejection(
    code: str, reason: str, consumed: Consumed, command: ScheduleCommand | Mapping[str, Any] | None = None
) -> Rejection:
    """``command`` names the rejected command: decoded, or its Avro record as read without logical
    types (a field that is not text there is left out)."""
    if isinstance(command, Mapping):
        named = {name: command.get(name) for name in _IDENTITY}
    else:
        named = {name: getattr(command, name) if command else None for name in _IDENTITY}
    return Rejection(
        code=code,
        # Capped: the rejection must fit its topic without the command's bytes whatever it quotes.
        reason=capped_text(reason) or code,
        **{name: _storable(value) if isinstance(value, str) else None for name, value in named.items()},
        original_bytes=consumed.value,
        source=consumed.source,
        source_timestamp_ms=consumed.timestamp_ms,
    )


_IDENTITY = ("command_id", "schedule_key", "app", "operation")


def domain_spec(command: ScheduleCommand, spec: SpecMessage) -> ScheduleSpec:
    """The command's spec in the terms validation checks; raises :class:`InvalidSchedule`."""
    payload = parse_payload(spec.payload)
    # The command gives whole seconds: its limit is said in them, from the spec's own.
    most = MAX_TIMEOUT_MS // 1000
    if not 1 <= spec.timeout_seconds <= most:
        raise InvalidSchedule(f"timeout_seconds must be 1 to {most}, got {spec.timeout_seconds}")
    return ScheduleSpec(
        app=command.app,
        # A schedule made by a command is named by its key unless it says otherwise.
        name=spec.name or command.schedule_key,
        kind=str(spec.kind),  # a StrEnum, or the text a producer built the message with
        handler=spec.handler,
        cron=spec.cron,
        tz=spec.tz or "UTC",  # an empty zone is UTC, as over the API
        run_at=spec.run_at,
        start_at=spec.start_at,
        end_at=spec.end_at,
        payload=payload,
        max_attempts=spec.max_attempts,
        timeout_ms=spec.timeout_seconds * 1000,
        misfire_policy=str(spec.misfire),
        overlap_policy=str(spec.overlap),
        backoff_base_ms=spec.backoff_base_ms,
        backoff_max_ms=spec.backoff_max_ms,
        jitter_ms=spec.jitter_ms,
    )


def _check_identity(command: ScheduleCommand) -> None:
    for value, what in ((command.command_id, "command_id"), (command.schedule_key, "schedule_key")):
        if not 1 <= len(value) <= MAX_ID_LENGTH:
            raise InvalidSchedule(f"{what} must be 1 to {MAX_ID_LENGTH} characters, got {len(value)}")
    # The audit log's actor of every change the command makes, shown by `audit list`.
    if command.actor is not None and len(command.actor) > MAX_ID_LENGTH:
        raise InvalidSchedule(f"actor must be at most {MAX_ID_LENGTH} characters, got {len(command.actor)}")
    texts = {"command_id": command.command_id, "schedule_key": command.schedule_key, "actor": command.actor}
    texts |= {"app": command.app}
    for what, text in texts.items():
        if text is not None:
            check_text(text, what)
    # Each is printed on a line of its own (`audit list`, `quarantine list`, the logs in plain text):
    # a line break, a tab or an invisible character would forge or hide a line, or an entry's actor.
    for what, text in (("command_id", command.command_id), ("actor", command.actor)):
        if text and not SCHEDULE_KEY_RE.fullmatch(text):
            raise InvalidSchedule(f"{what} {quoted(text)} must be {VISIBLE_TEXT_RULE}", what)
    # The spec's own texts (name, handler, cron, tz, payload) are checked by validate, as for the CLI.
    validate_app_name(command.app)
    if command.operation == "create":
        # The rule the CLI and the API hold a new key to (no blanks at its ends, no tab, line break
        # or invisible character). Only for a create: other commands name a schedule that exists.
        validate_schedule_key(command.schedule_key)
    if command.expected_version is not None and command.expected_version < 1:
        raise InvalidSchedule(f"expected_version must be 1 or more, got {command.expected_version}")


# The instants Python's datetime holds, in Avro's timestamp-micros: fastavro fails the whole record on
# one beyond them, before our code sees its command id.
_FIRST_MICROS = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
_LAST_MICROS = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
_SPEC_TIMES = ("run_at", "start_at", "end_at")


def _beyond_python(codec: AvroCodec, consumed: Consumed) -> Rejection | None:
    """The rejection of a command that is well-formed Avro but whose time Python cannot hold: invalid,
    with its command id, so its producer can tell which command it was; None for any other failure."""
    try:
        record = codec.decode_record(ScheduleCommand.SCHEMA, consumed.value, logical_types=False)
    except MessageDecodeError:
        return None
    spec = record.get("spec")
    times = spec if isinstance(spec, dict) else {}
    beyond = [
        f"spec.{name}"
        for name in _SPEC_TIMES
        if isinstance(times.get(name), int) and not _FIRST_MICROS <= times[name] <= _LAST_MICROS
    ]
    if not beyond:
        return None
    return rejection(
        "invalid", f"{' and '.join(beyond)} must be between the years 1 and 9999", consumed, record
    )


def check_command(command: ScheduleCommand) -> tuple[ScheduleSpec, str] | None:
    """What the ingestor checks of a command on its own (not against the database: the app, its
    handlers, the key's schedule): its spec in the domain's terms and the encoded payload, None for
    an operation without a spec. Raises :class:`InvalidSchedule` (or ValueError, TypeError,
    OverflowError for a value the domain cannot hold). Producers run it before they send, so that a
    command certain to be rejected fails at once."""
    _check_identity(command)
    if command.operation in SPEC_OPERATIONS:
        if command.spec is None:
            raise InvalidSchedule(f"the {command.operation} command needs a spec")
        spec = domain_spec(command, command.spec)
        return spec, validate_encoded(spec)
    if command.spec is not None:
        raise InvalidSchedule(
            f"the {command.operation} command takes no spec (only create and update take one)"
        )
    return None


def decode_command(codec: AvroCodec, consumed: Consumed) -> ValidCommand | Rejection:
    """The command in ``consumed``, validated, or why it cannot be applied."""
    try:
        command = codec.decode(ScheduleCommand, consumed.value)
    except MessageDecodeError as exc:
        return _beyond_python(codec, consumed) or rejection("undecodable", str(exc), consumed)
    try:
        checked = check_command(command)
        if checked is None:
            return ValidCommand(consumed, command, None, None)
        return ValidCommand(consumed, command, *checked)
    except InvalidSchedule as exc:
        return rejection("invalid", str(exc), consumed, command)
    except (ValueError, TypeError, OverflowError) as exc:
        # Values Avro carries but the domain cannot hold (a time beyond year 9999, say): still a bad
        # command, never a reason to stop the batch.
        return rejection("invalid", f"{type(exc).__name__}: {exc}", consumed, command)
