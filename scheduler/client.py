"""The Python client of the ingestor: produce schedule commands onto ``<prefix>.schedules``.

A service that wants schedules without calling the CLI produces commands; the
ingestor applies them to PostgreSQL and reports what it could not apply on
``<prefix>.schedules.rejected``. This module is all a Python producer needs::

    with ScheduleClient("127.0.0.1:19092", "sched") as client:
        command_id = client.create(
            key="billing:nightly", app="billing", cron="30 2 * * *", tz="Europe/Berlin",
            handler="builtin:noop", payload={"invoice_run": True},
        )
        client.pause(key="billing:nightly", app="billing")
    # leaving the block flushes: every command acknowledged by Kafka, or DeliveryError (when the
    # block raised, its exception instead, with the delivery failure as a note)

Every command carries a command id (a new UUID unless given): resending a command with the same id
is harmless, it is applied once. Commands are keyed by ``<app>/<schedule_key>``, so those of one
schedule stay in order on one partition. The producer is idempotent with ``acks=all``; sending is
asynchronous and :meth:`ScheduleClient.flush` waits and reports failures. Messages are in Avro
single-object encoding, or in Confluent framing when a schema registry URL is given.
:func:`command_from_json` reads the JSON form of a command that ``scheduler produce`` takes.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Self, get_args

from scheduler.config import Settings
from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind
from scheduler.ingest.commands import check_command
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.connection import KafkaConnection
from scheduler.kafka.messages import ScheduleCommand, ScheduleOperation, ScheduleSpec
from scheduler.kafka.registry import Framing, registry_for
from scheduler.kafka.tracing import HEADER, new_traceparent
from scheduler.kafka.transport import DeliveryError, OutgoingMessage, Producer, producer_config
from scheduler.schedule.spec import InvalidSchedule

__all__ = ["CommandFormatError", "DeliveryError", "ScheduleClient", "command_from_json", "spec"]

KAFKA_LOG = logging.getLogger("scheduler.client.kafka")

DeliveryCallback = Callable[[str | None], None]
"""Called once per command with None once Kafka acknowledged it, or with the error."""


EXIT_ON_ERROR_FLUSH_S = 10.0
"""How long leaving the ``with`` block by an exception waits for Kafka's acknowledgements."""


class CommandFormatError(ValueError):
    """A command in JSON that does not have the documented shape; ``str()`` is one line."""


def spec(
    *,
    handler: str,
    name: str = "",
    kind: ScheduleKind | str | None = None,
    cron: str | None = None,
    tz: str = "UTC",
    run_at: datetime | None = None,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    payload: Any = None,
    max_attempts: int = 3,
    timeout_seconds: int = 300,
    misfire: MisfirePolicy | str = MisfirePolicy.FIRE_ONCE,
    overlap: OverlapPolicy | str = OverlapPolicy.ALLOW,
    backoff_base_ms: int = 1000,
    backoff_max_ms: int = 300_000,
    jitter_ms: int = 0,
) -> ScheduleSpec:
    """A schedule spec; ``kind`` follows from ``cron`` (cron) or ``run_at`` (delayed) when omitted,
    and ``payload`` is any JSON value (an empty object when omitted). An empty name lets the
    ingestor name the schedule after its key."""
    if kind is None:
        kind = (
            ScheduleKind.CRON
            if cron is not None
            else ScheduleKind.DELAYED
            if run_at
            else ScheduleKind.IMMEDIATE
        )
    try:
        payload_text = json.dumps({} if payload is None else payload, separators=(",", ":"), allow_nan=False)
        return ScheduleSpec(
            name=name,
            kind=ScheduleKind(kind),
            handler=handler,
            payload=payload_text,
            cron=cron,
            tz=tz,
            run_at=run_at,
            start_at=start_at,
            end_at=end_at,
            max_attempts=max_attempts,
            timeout_seconds=timeout_seconds,
            misfire=MisfirePolicy(misfire),
            overlap=OverlapPolicy(overlap),
            backoff_base_ms=backoff_base_ms,
            backoff_max_ms=backoff_max_ms,
            jitter_ms=jitter_ms,
        )
    except (TypeError, ValueError) as exc:
        raise CommandFormatError(str(exc)) from None


class ScheduleClient:
    """Produces ``ScheduleCommand``s; each method returns the command id without waiting for Kafka.

    ``kafka`` is the cluster: a :class:`~scheduler.kafka.connection.KafkaConnection` (with its TLS
    and SASL settings) or, for a PLAINTEXT cluster, its bootstrap servers.
    """

    def __init__(
        self,
        kafka: KafkaConnection | str,
        topic_prefix: str = "sched",
        *,
        schema_registry_url: str | None = None,
        actor: str | None = None,
        config: Mapping[str, Any] | None = None,
        client_id: str = "scheduler-client",
    ) -> None:
        self.topic = f"{topic_prefix}.schedules"
        self.actor = actor
        self._codec = AvroCodec()
        self._framing = Framing(
            registry_for(schema_registry_url), ScheduleCommand.SCHEMA, self.topic, self._codec.catalog
        )
        connection = KafkaConnection(kafka) if isinstance(kafka, str) else kafka
        overrides = {
            # librdkafka's own log lines (reconnect attempts) go to Python logging, not to stderr: a
            # failed command is reported through its delivery outcome.
            "logger": KAFKA_LOG,
        } | dict(config or {})
        # The transport's producer defaults leave room for a command with a 1 MiB payload.
        self._producer = Producer(producer_config(connection, client_id, overrides))
        self._failures: list[str] = []

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> Self:
        """A client for the configured cluster, topic prefix and schema registry."""
        return cls(
            settings.kafka,
            settings.topic_prefix,
            schema_registry_url=settings.schema_registry_url,
            **kwargs,
        )

    def create(self, *, key: str, app: str, command_id: str | None = None, **spec_fields: Any) -> str:
        """A new schedule named ``key`` in ``app``; ``spec_fields`` are those of :func:`spec`."""
        return self._command("create", key, app, command_id, spec=spec(**spec_fields))

    def update(
        self,
        *,
        key: str,
        app: str,
        expected_version: int | None = None,
        command_id: str | None = None,
        **spec_fields: Any,
    ) -> str:
        """Replace the whole spec of the schedule named ``key`` (fields left out take their defaults)."""
        return self._command(
            "update", key, app, command_id, spec=spec(**spec_fields), version=expected_version
        )

    def pause(
        self, *, key: str, app: str, expected_version: int | None = None, command_id: str | None = None
    ) -> str:
        return self._command("pause", key, app, command_id, version=expected_version)

    def resume(
        self, *, key: str, app: str, expected_version: int | None = None, command_id: str | None = None
    ) -> str:
        return self._command("resume", key, app, command_id, version=expected_version)

    def cancel(
        self, *, key: str, app: str, expected_version: int | None = None, command_id: str | None = None
    ) -> str:
        return self._command("cancel", key, app, command_id, version=expected_version)

    def trigger(
        self, *, key: str, app: str, expected_version: int | None = None, command_id: str | None = None
    ) -> str:
        """Run the schedule once now, in addition to its own fires."""
        return self._command("trigger", key, app, command_id, version=expected_version)

    def _command(
        self,
        operation: ScheduleOperation,
        key: str,
        app: str,
        command_id: str | None,
        *,
        spec: ScheduleSpec | None = None,
        version: int | None = None,
    ) -> str:
        command = ScheduleCommand(
            command_id=command_id or str(uuid.uuid4()),
            schedule_key=key,
            app=app,
            operation=operation,
            spec=spec,
            expected_version=version,
            actor=self.actor,
        )
        return self.send(command)

    def send(self, command: ScheduleCommand, on_delivery: DeliveryCallback | None = None) -> str:
        """Produce ``command`` (encoding errors, and what the ingestor would reject whatever the
        database holds, raise :class:`CommandFormatError` at once); returns its id.

        ``on_delivery`` is called from :meth:`flush` (or a later send) with the outcome, and at once
        for a command the client refuses itself (too large). Without it, failures are collected and
        raised by :meth:`flush`.
        """
        value = self._codec.encode(command, confluent_schema_id=self._framing.schema_id)
        try:
            check_command(command)
        except InvalidSchedule as exc:
            # Certain to be rejected by the ingestor: the producer learns it now, not from the
            # rejected topic later. What needs the database (the app, its handlers) is not checked.
            raise CommandFormatError(str(exc)) from None
        except (ValueError, TypeError, OverflowError) as exc:  # as the ingestor words them
            raise CommandFormatError(f"{type(exc).__name__}: {exc}") from None

        def delivered(error: DeliveryError | None) -> None:
            reason = None if error is None else str(error)
            if on_delivery is not None:
                on_delivery(reason)
            elif reason is not None:
                self._failures.append(f"command {command.command_id}: {reason}")

        message = OutgoingMessage(
            self.topic, value, f"{command.app}/{command.schedule_key}".encode(), [(HEADER, new_traceparent())]
        )
        try:
            self._producer.produce(message, delivered)
        except DeliveryError as exc:
            delivered(exc)
        self._producer.poll(0)
        return command.command_id

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until Kafka acknowledged every command sent; raise :class:`DeliveryError` otherwise."""
        remaining = self._producer.flush(timeout_s)
        failures, self._failures = self._failures, []
        if remaining:
            failures.append(f"{remaining} commands still unacknowledged after {timeout_s:.0f} s")
        if failures:
            raise DeliveryError(f"{len(failures)} failures, the first: {failures[0]}")

    def close(self, timeout_s: float = 60.0) -> None:
        self.flush(timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.flush()
            return
        # Commands sent before the error were given ids and must not vanish with the client; the
        # caller's exception goes on, noting any that Kafka did not acknowledge.
        try:
            # Not the full minute: the caller is on its way out (an error, Ctrl-C), and a broker that
            # does not answer within this will not be waited for; what is lost is noted.
            self.flush(EXIT_ON_ERROR_FLUSH_S)
        except DeliveryError as failed:
            exc.add_note(f"scheduler client: {failed}")


_COMMAND_FIELDS = frozenset(f for f in ScheduleCommand.__dataclass_fields__)
_SPEC_FIELDS = frozenset(ScheduleSpec.__dataclass_fields__)
_TIME_FIELDS = ("run_at", "start_at", "end_at")
_OPERATIONS = frozenset(get_args(ScheduleOperation))


def _instant(value: Any, what: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise CommandFormatError(f"{what} must be an ISO 8601 string with an offset, got {value!r}")
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise CommandFormatError(f"{what} {value!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise CommandFormatError(f"{what} {value!r} needs an offset (e.g. 2027-01-01T09:00:00Z)")
    return moment


def _typed(document: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = document.get(name)
    # bool is an int in Python, never in JSON's sense of a count.
    if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is int)):
        raise CommandFormatError(f"{where}{name} has the wrong type ({type(value).__name__})")
    return value


def _spec_from_json(document: Any) -> ScheduleSpec:
    if not isinstance(document, Mapping):
        raise CommandFormatError("spec must be a JSON object")
    unknown = set(document) - _SPEC_FIELDS
    if unknown:
        raise CommandFormatError(f"unknown spec field(s): {', '.join(sorted(unknown))}")
    handler = _typed(document, "handler", str, "spec.")
    if handler is None:
        raise CommandFormatError("spec.handler is required")
    fields: dict[str, Any] = {"handler": handler}
    for name in ("name", "kind", "cron", "tz", "misfire", "overlap"):
        value = _typed(document, name, str, "spec.")
        if value is not None:
            fields[name] = value
    for name in ("max_attempts", "timeout_seconds", "backoff_base_ms", "backoff_max_ms", "jitter_ms"):
        value = _typed(document, name, int, "spec.")
        if value is not None:
            fields[name] = value
    for name in _TIME_FIELDS:
        fields[name] = _instant(document.get(name), f"spec.{name}")
    fields["payload"] = document.get("payload")
    return spec(**fields)


def command_from_json(document: Any, *, default_command_id: str) -> ScheduleCommand:
    """The command a JSON object describes (the shape ``scheduler produce`` reads, see the README).

    ``command_id`` may be left out: ``default_command_id`` is used instead.
    """
    if not isinstance(document, Mapping):
        raise CommandFormatError("a command must be a JSON object")
    unknown = set(document) - _COMMAND_FIELDS
    if unknown:
        raise CommandFormatError(f"unknown field(s): {', '.join(sorted(unknown))}")
    for name in ("schedule_key", "app", "operation"):
        if not isinstance(document.get(name), str) or not document[name]:
            raise CommandFormatError(f"{name} is required (a non-empty string)")
    operation = document["operation"]
    if operation not in _OPERATIONS:
        raise CommandFormatError(f"operation {operation!r} must be one of {', '.join(sorted(_OPERATIONS))}")
    command_id = _typed(document, "command_id", str, "") or default_command_id
    has_spec = document.get("spec") is not None
    if operation in ("create", "update") and not has_spec:
        raise CommandFormatError(f"the {operation} command needs a spec")
    if operation not in ("create", "update") and has_spec:
        raise CommandFormatError(f"the {operation} command takes no spec (only create and update take one)")
    return ScheduleCommand(
        command_id=command_id,
        schedule_key=document["schedule_key"],
        app=document["app"],
        operation=operation,
        spec=_spec_from_json(document["spec"]) if has_spec else None,
        expected_version=_typed(document, "expected_version", int, ""),
        actor=_typed(document, "actor", str, ""),
    )
