"""Rows as the API's messages, and requests as schedule specs: the one mapping both transports use.

A payload is a ``google.protobuf.Value``, whose numbers are doubles; a whole number within a
double's exact range is read as an integer, so a payload sent as ``{"n": 1}`` is stored, sent to
the handler and returned as ``{"n": 1}``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from google.protobuf import json_format, struct_pb2, timestamp_pb2
from google.protobuf.message import DecodeError, Message

from scheduler.api.errors import ApiError, Code, invalid
from scheduler.domain.schedule import ScheduleKind, ScheduleState
from scheduler.schedule.spec import (
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_VALUES,
    InvalidSchedule,
    LimitExceeded,
    PayloadTooLarge,
    ScheduleSpec,
    check_limits,
    encoded_payload,
    validate_schedule_key,
)
from scheduler.v1 import scheduler_pb2 as pb

Row = Mapping[str, Any]
EXACT_INTEGER = 2**53
# Any string of a request beyond what any field takes (names 200, handlers 300, descriptions
# 2,000): refused before it reaches validation or a statement.
MAX_STRING_LENGTH = 4096
# A schedule's payload may be 1 MiB, and JSON escaping can double it; a batch holds up to 1,000.
# The same limits on both transports: HTTP counts the body, gRPC the serialized message.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
MAX_BATCH_REQUEST_BYTES = 32 * 1024 * 1024
# A time as RFC 3339 writes one (upper-case T and Z, as protobuf's JSON mapping reads them), its
# offset one that exists. protobuf's own parser reads "+25:00", "-00:60", "+ 2:00" and
# "2027-1-1T9:00:00Z" as some instant or other rather than refuse them.
TIME_RE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
    r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
TIME_FORM = (
    "an RFC 3339 time such as 2027-01-01T09:00:00Z or 2027-01-01T09:00:00+02:00 (offsets -23:59 to +23:59)"
)


def max_request_bytes(method: str) -> int:
    return MAX_BATCH_REQUEST_BYTES if method == "CreateSchedules" else MAX_REQUEST_BYTES


def max_request_values(method: str) -> int:
    """How many JSON values the payloads of one request may hold together: a batch's ten payloads'
    worth. Counted before any is converted (:func:`count_values`), each conversion costing about
    2 µs a value: a batch of 31 MiB of zeros, 16 million values, took 44 s to parse and 22 s to answer."""
    return 10 * MAX_PAYLOAD_VALUES if method == "CreateSchedules" else MAX_PAYLOAD_VALUES


def too_many_values(limit: int) -> ApiError:
    message = f"the request's payloads hold more than {limit:,} values (numbers, strings, lists, objects...)"
    return ApiError(Code.PAYLOAD_TOO_LARGE, message, {"limit_values": limit})


_VALUE_TYPES = ("google.protobuf.Value", "google.protobuf.Struct", "google.protobuf.ListValue")


def count_values(request: Any, descriptor: Any, limit: int) -> int:
    """How many JSON values the payloads (Value fields) of ``request`` hold, as JSON data (what
    HTTP parsed) or as a message (what gRPC parsed); :func:`too_many_values` past ``limit``, found
    by walking no further than it."""
    found = 0
    pending: list[Any] = []
    requests: list[tuple[Any, Any]] = [(request, descriptor)]
    while requests:
        data, described = requests.pop()
        fields = data.ListFields() if isinstance(data, Message) else _fields_of(data, described)
        for field, value in fields:
            if field.message_type is None:
                continue
            items = list(value) if field.is_repeated and not isinstance(value, Mapping) else [value]
            if field.message_type.full_name in _VALUE_TYPES:
                pending.extend(items)
            elif field.message_type.full_name.startswith("scheduler."):
                requests.extend((item, field.message_type) for item in items)
    while pending:
        value = pending.pop()
        found += 1
        if found > limit:
            raise too_many_values(limit)
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, struct_pb2.Value):
            kind = value.WhichOneof("kind")
            if kind == "struct_value":
                pending.extend(value.struct_value.fields.values())
            elif kind == "list_value":
                pending.extend(value.list_value.values)
        elif isinstance(value, struct_pb2.Struct):
            pending.extend(value.fields.values())
        elif isinstance(value, struct_pb2.ListValue):
            pending.extend(value.values)
    return found


def _fields_of(data: Any, descriptor: Any) -> list[tuple[Any, Any]]:
    """The fields a JSON object gives, by their proto or JSON name; none for anything else (which
    protobuf's parser refuses)."""
    if not isinstance(data, dict):
        return []
    fields = (
        (descriptor.fields_by_name.get(name) or descriptor.fields_by_camelcase_name.get(name), value)
        for name, value in data.items()
    )
    return [(field, value) for field, value in fields if field is not None and value is not None]


def too_large(limit: int) -> ApiError:
    message = f"the request is larger than {limit} bytes"
    return ApiError(Code.PAYLOAD_TOO_LARGE, message, {"limit_bytes": limit})


# --- values ---------------------------------------------------------------------------------------


def timestamp(moment: datetime | str | None) -> timestamp_pb2.Timestamp | None:
    """An instant as a message. A text is one as an audit value keeps it: PostgreSQL's JSON of a
    ``timestamptz`` (``2027-01-01T09:00:00.123+00:00``) or Python's ``str`` of a datetime (with a
    space for the ``T``); one without an offset, or not an instant, is refused (ValueError)."""
    if moment is None:
        return None
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
        if moment.tzinfo is None:
            raise ValueError("an instant without an offset")
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(moment.astimezone(UTC))
    return message


def moment_of(message: Message, field: str) -> datetime | None:
    """A Timestamp field as an aware datetime; None when not set."""
    if not message.HasField(field):
        return None
    value: timestamp_pb2.Timestamp = getattr(message, field)
    try:
        return value.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise invalid(f"{field} is not a representable time", field=field) from None


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < EXACT_INTEGER:
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def gives_payload(message: Message, field: str = "payload") -> bool:
    """Whether a Value field is given: a null is one left out, as for every other field (proto3's
    JSON mapping reads a null as "not set" everywhere but in a Value, which can hold one)."""
    return message.HasField(field) and getattr(message, field).WhichOneof("kind") not in (None, "null_value")


def payload_of(message: Message, field: str = "payload") -> Any:
    """A Value field as JSON data ({} when not given); 413 past the payload limit."""
    if not gives_payload(message, field):
        return {}
    try:
        value = _integral(json_format.MessageToDict(getattr(message, field)))
    except (ValueError, RecursionError):  # NaN or an infinity, which JSON cannot carry; or too deep
        raise ApiError(
            Code.INVALID_SCHEDULE,
            f"{field} holds a value JSON cannot carry (NaN, an infinity, or too deep)",
            {"field": field},
        ) from None
    try:
        encoded_payload(value)
    except PayloadTooLarge as exc:
        raise ApiError(Code.PAYLOAD_TOO_LARGE, str(exc), {"limit_bytes": MAX_PAYLOAD_BYTES}) from None
    except InvalidSchedule as exc:
        raise ApiError(Code.INVALID_SCHEDULE, str(exc), {"field": field}) from None
    return value


def json_value(data: Any) -> struct_pb2.Value:
    value = struct_pb2.Value()
    json_format.ParseDict(data, value)
    return value


def stored_value(data: Any) -> struct_pb2.Value:
    """A stored JSON value as a message. Stored before payloads were limited to the depth protobuf
    carries, a value may be deeper; and jsonb keeps an integer of any size exact (the CLI stores
    one), past what a double holds, or a number written by hand in SQL (``1e400``), which reads as
    infinity and which no JSON carries. Each is shown as a string saying so, so that the listing
    holding it still answers (the CLI shows it whole)."""
    try:
        if not _finite(data):
            raise OverflowError
        return json_value(data)
    except (DecodeError, json_format.ParseError, RecursionError, ValueError):
        return json_value("(nested too deeply for the API to carry: read it with `scheduler schedules get`)")
    except OverflowError:
        return json_value(
            "(holds a number too large for the API to carry: read it with `scheduler schedules get`)"
        )


def _finite(data: Any) -> bool:
    """Whether every number in ``data`` is finite (psycopg reads jsonb's numbers past a double's
    range as infinity, which a message holds and its JSON form cannot)."""
    if isinstance(data, float):
        return math.isfinite(data)
    if isinstance(data, dict):
        return all(_finite(value) for value in data.values())
    if isinstance(data, list):
        return all(_finite(value) for value in data)
    return True


def as_dict(message: Message) -> dict[str, Any]:
    """A message in its JSON form (what HTTP sends, and what idempotency keys keep)."""
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _integral_values(message, data)


def _integral_values(message: Message, data: dict[str, Any]) -> dict[str, Any]:
    """Whole numbers of the Value fields as integers, at any depth of nested messages."""
    for field, value in message.ListFields():
        name = field.name
        if name not in data:
            continue
        if field.message_type is not None and field.message_type.full_name == "google.protobuf.Value":
            data[name] = _integral(data[name])
        elif field.message_type is not None and field.message_type.full_name.startswith("scheduler."):
            if field.is_repeated:
                data[name] = [_integral_values(m, d) for m, d in zip(value, data[name], strict=True)]
            else:
                data[name] = _integral_values(value, data[name])
    return data


def check_strings(message: Message, path: str = "") -> None:
    """Refuse any string longer than any field takes, or holding a NUL (which no PostgreSQL text
    column can store: a filter or a key would otherwise fail in the statement), at any depth.
    Payloads are checked apart, by the schedule's validation."""
    for field, value in message.ListFields():
        name = f"{path}{field.name}"
        if field.type == field.TYPE_STRING:
            for text in value if field.is_repeated else [value]:
                if len(text) > MAX_STRING_LENGTH:
                    raise invalid(f"{name} is longer than {MAX_STRING_LENGTH} characters", field=name)
                if "\x00" in text:
                    raise invalid(f"{name} contains a NUL character", field=name)
        elif field.message_type is not None and field.message_type.full_name.startswith("scheduler."):
            for index, item in enumerate(value if field.is_repeated else [value]):
                check_strings(item, f"{name}[{index}]." if field.is_repeated else f"{name}.")


def check_times(data: Any, descriptor: Any, path: str = "") -> None:
    """Refuse a Timestamp field of ``data`` (at any depth of the API's messages) that is not
    :data:`TIME_FORM`, naming it as the client wrote it (``schedules[2].run_at``). Values of another
    type are left to protobuf's parser, which refuses them."""
    if not isinstance(data, dict):
        return
    for name, value in data.items():
        field = descriptor.fields_by_name.get(name) or descriptor.fields_by_camelcase_name.get(name)
        if field is None or field.message_type is None or value is None:
            continue
        where = f"{path}{name}"
        if field.message_type.full_name == "google.protobuf.Timestamp":
            if isinstance(value, str) and not is_time(value):
                raise invalid(f"{where} must be {TIME_FORM}", field=where)
        elif field.message_type.full_name.startswith("scheduler."):
            if not field.is_repeated:
                check_times(value, field.message_type, f"{where}.")
            elif isinstance(value, list):
                for index, item in enumerate(value):
                    check_times(item, field.message_type, f"{where}[{index}].")


def is_time(text: str) -> bool:
    if not TIME_RE.fullmatch(text):
        return False
    try:
        datetime.fromisoformat(text[:19])  # a month 13, a day 31 in April, an hour 24
    except ValueError:
        return False
    return True


def uuid_of(text: str, what: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise invalid(f"{what} {text[:80]!r} is not an id (a UUID)", field=what) from None


def optional_uuid(text: str, what: str) -> UUID | None:
    return uuid_of(text, what) if text else None


# --- cursors --------------------------------------------------------------------------------------


def encode_cursor(*parts: str) -> str:
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, arity: int) -> list[str] | None:
    """The parts of a cursor this API gave; None for none. A cursor is only a position: whatever
    it holds, the caller's scope and filters still apply to the page."""
    if not cursor:
        return None
    try:
        parts = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):  # "[[[[..." nests too deep
        parts = None
    if not isinstance(parts, list) or len(parts) != arity or not all(isinstance(p, str) for p in parts):
        raise invalid("cursor is not one this API gave (pass next_cursor as it came)", field="cursor")
    return parts


def instant_of(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise invalid("cursor is not one this API gave", field="cursor") from None
    if moment.tzinfo is None:
        raise invalid("cursor is not one this API gave", field="cursor")
    return moment


MAX_PAGE = 500
# A page of schedules or audit entries also ends once their payloads pass this many bytes of JSON
# text (one row over it is a page of its own): 500 payloads of a megabyte would be an answer of
# half a gigabyte, built in the server's memory. One megabyte, because a gRPC client receives at
# most 4 MiB by default, and protobuf's form of a payload of numbers is up to four times its JSON.
MAX_PAGE_BYTES = 1024 * 1024


def page_limit(limit: int, default: int = 50, maximum: int = MAX_PAGE) -> int:
    # 0 is proto3's "not given" (gRPC cannot tell them apart); over HTTP a 0 given is refused.
    if limit == 0:
        return default
    if not 1 <= limit <= maximum:
        raise invalid(f"limit must be 1 to {maximum}, got {limit}", field="limit")
    return limit


# --- rows as messages -----------------------------------------------------------------------------


def _seconds(ms: int) -> float:
    return ms / 1000


# The API's Schedule field by field, each read from a row of the schedules table with its key: the
# one mapping of that row to the API's words, units and time format, for GetSchedule's answers and
# for the values of audit entries about a schedule alike.
SCHEDULE_FIELDS: dict[str, Callable[[Row], Any]] = {
    "id": lambda row: str(row["id"]),
    "app": lambda row: row["app"],
    "schedule_key": lambda row: row["schedule_key"] or str(row["id"]),
    "name": lambda row: row["name"],
    "description": lambda row: row["description"] or "",
    "kind": lambda row: row["kind"],
    "cron_expression": lambda row: row["cron"] or "",
    "timezone": lambda row: row["tz"],
    "run_at": lambda row: timestamp(row["run_at"]),
    "start_at": lambda row: timestamp(row["start_at"]),
    "end_at": lambda row: timestamp(row["end_at"]),
    "handler": lambda row: row["handler"],
    "payload": lambda row: stored_value(row["payload"]),
    "enabled": lambda row: row["state"] == ScheduleState.ACTIVE,
    "retry_config": lambda row: pb.RetryConfig(
        max_attempts=row["max_attempts"],
        backoff_seconds=_seconds(row["backoff_base_ms"]),
        max_backoff_seconds=_seconds(row["backoff_max_ms"]),
    ),
    "timeout_seconds": lambda row: _seconds(row["timeout_ms"]),
    "jitter_seconds": lambda row: _seconds(row["jitter_ms"]),
    "misfire_policy": lambda row: row["misfire_policy"],
    "overlap_policy": lambda row: row["overlap_policy"],
    "state": lambda row: row["state"],
    "error": lambda row: row["error"] or "",
    "next_run_time": lambda row: timestamp(row["next_fire_at"]),
    "version": lambda row: row["version"],
    "created_at": lambda row: timestamp(row["created_at"]),
    "updated_at": lambda row: timestamp(row["updated_at"]),
}


def schedule_message(row: Row) -> pb.Schedule:
    return pb.Schedule(**{name: read(row) for name, read in SCHEDULE_FIELDS.items()})


# What reading a column the row lacks, or holds in a form its field does not take, raises.
UNREADABLE = (KeyError, TypeError, ValueError, AttributeError, OverflowError)


def schedule_fields(row: Row) -> dict[str, Any]:
    """The fields of a Schedule that ``row`` holds, in their JSON form (GetSchedule's over HTTP).
    ``row`` is a schedules row as an audit value keeps it, written by this release or an earlier
    one, whole or in part (the scanner's error records the state and its reason). A field is left
    out when a column it reads is missing or holds what the field does not take: ``schedule_key``,
    no column of schedules, is there when the change recorded it (a single create) or the caller
    added it from the key's row (:func:`audit_value`). Columns no field shows (``traceparent``,
    ``errored_at``) are not shown, as GetSchedule shows neither."""
    values: dict[str, Any] = {}
    for name, read in SCHEDULE_FIELDS.items():
        with contextlib.suppress(*UNREADABLE):
            values[name] = read(row)
    try:
        message = pb.Schedule(**values)
    except UNREADABLE:  # a value of another type than its field takes: the fields one by one
        message = pb.Schedule()
        for name, value in list(values.items()):
            try:
                message.MergeFrom(pb.Schedule(**{name: value}))
            except UNREADABLE:
                del values[name]
    data = as_dict(message)
    # A time that is not set is left out, as in GetSchedule's answer.
    return {name: data[name] for name in values if name in data}


def attempt_message(row: Row) -> pb.Attempt:
    return pb.Attempt(
        attempt=row["attempt"],
        kind=row["kind"],
        outcome=row["outcome"],
        worker=row["worker"] or "",
        started_at=timestamp(row["started_at"]),
        finished_at=timestamp(row["finished_at"]),
        error=row["error"] or "",
        received_at=timestamp(row["received_at"]),
    )


def run_message(row: Row) -> pb.Run:
    return pb.Run(
        id=str(row["id"]),
        schedule_id=str(row["schedule_id"]),
        app=row["app"],
        scheduled_for=timestamp(row["scheduled_for"]),
        state=row["state"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        dispatched_at=timestamp(row["dispatched_at"]),
        started_at=timestamp(row["started_at"]),
        finished_at=timestamp(row["finished_at"]),
        worker=row["worker"] or "",
        error=row["error"] or "",
        skip_reason=row["skip_reason"] or "",
        next_attempt_at=timestamp(row["next_attempt_at"]),
        created_at=timestamp(row["created_at"]),
        attempts=[attempt_message(a) for a in row.get("attempts", [])],
    )


def dead_letter_message(row: Row) -> pb.DeadLetter:
    return pb.DeadLetter(
        id=str(row["id"]),
        kind=row["kind"],
        app=row["app"] or "",
        schedule_id=str(row["schedule_id"] or ""),
        attempt=row["attempt"] or 0,
        error=row["error"] or "",
        dead_at=timestamp(row["dead_at"]),
        worker=row["worker"] or "",
    )


# The actions of which an audit entry about a schedule keeps the schedule's row, whole (create,
# update, pause, resume, cancel: scheduler/schedule/service.py) or its state and reason (error: the
# scanner). A trigger's value names the run it made, no field of a schedule.
SCHEDULE_ROW_ACTIONS = frozenset({"create", "update", "pause", "resume", "cancel", "error"})


def audit_value(row: Row, stored: Any) -> struct_pb2.Value | None:
    """An audit entry's old or new value: a schedule's row as the API's Schedule names its fields
    (:func:`schedule_fields`), anything else (an app's row, a run's state and attempt, a trigger's
    run) as it was recorded."""
    if stored is None:
        return None
    if row["entity"] == "schedule" and row["action"] in SCHEDULE_ROW_ACTIONS and isinstance(stored, dict):
        # A whole row (not the scanner's error, which holds a few fields) gets the schedule's key,
        # which its row does not hold; a key the entry recorded stays as recorded.
        key = row.get("schedule_key")
        if key is not None and "schedule_key" not in stored and "handler" in stored:
            stored = {**stored, "schedule_key": key}
        return stored_value(schedule_fields(stored))
    return stored_value(stored)


def audit_message(row: Row) -> pb.AuditEntry:
    return pb.AuditEntry(
        id=str(row["id"]),
        at=timestamp(row["at"]),
        actor=row["actor"],
        action=row["action"],
        entity=row["entity"],
        entity_id=row["entity_id"],
        app=row["app"] or "",
        old_value=audit_value(row, row["old_value"]),
        new_value=audit_value(row, row["new_value"]),
    )


# --- requests as specs ----------------------------------------------------------------------------


def _ms(seconds: float, field: str) -> int:
    if not (seconds == seconds) or abs(seconds) > 1e9:  # NaN, or beyond any setting
        raise ApiError(Code.INVALID_SCHEDULE, f"{field} is out of range", {"field": field})
    return round(seconds * 1000)


def _retry(spec: dict[str, Any], retry: pb.RetryConfig) -> None:
    if retry.HasField("max_attempts"):
        spec["max_attempts"] = retry.max_attempts
    if retry.HasField("backoff_seconds"):
        spec["backoff_base_ms"] = _ms(retry.backoff_seconds, "retry_config.backoff_seconds")
    if retry.HasField("max_backoff_seconds"):
        spec["backoff_max_ms"] = _ms(retry.max_backoff_seconds, "retry_config.max_backoff_seconds")


SpecRequest = pb.CreateScheduleRequest | pb.UpdateScheduleRequest
# The spec's limited numbers as a request names them, and whether the spec holds them in
# milliseconds (the request gives seconds).
LIMITED_FIELDS: dict[str, tuple[str, bool]] = {
    "max_attempts": ("retry_config.max_attempts", False),
    "backoff_base_ms": ("retry_config.backoff_seconds", True),
    "backoff_max_ms": ("retry_config.max_backoff_seconds", True),
    "timeout_ms": ("timeout_seconds", True),
    "jitter_ms": ("jitter_seconds", True),
}


# The spec's fields the API names otherwise; every other one (run_at, handler, payload…) it names
# alike.
REQUEST_FIELDS = {"cron": "cron_expression", "tz": "timezone"} | {
    spec: request for spec, (request, _) in LIMITED_FIELDS.items()
}


def request_field(spec_field: str) -> str:
    """The request's name of a field of the spec (``tz`` is ``timezone``)."""
    return REQUEST_FIELDS.get(spec_field, spec_field)


def _gives(request: Message, path: str) -> bool:
    """Whether ``request`` sets the field at ``path`` (``retry_config.backoff_seconds``)."""
    *parents, name = path.split(".")
    for parent in parents:
        if not request.HasField(parent):
            return False
        request = getattr(request, parent)
    return request.HasField(name)


def limit_refusal(exc: LimitExceeded, request: SpecRequest) -> ApiError:
    """A limit the spec's validation refused, said in the request's fields and units (seconds)
    rather than the spec's (milliseconds). A bound the request leaves out (a backoff's max, say) is
    the stored or default one, and said so."""
    field, in_ms = LIMITED_FIELDS[exc.field]

    def shown(value: int) -> str:
        # Every digit of the milliseconds (at most 13: the request's seconds are within 1e9), where
        # `g`'s six said 86400 for 86400.001 and 1e+09 for a billion.
        return f"{value / 1000:.15g}" if in_ms else str(value)

    if exc.bounded_by is None:
        message = f"{field} must be {shown(exc.low)} to {shown(exc.high)}, got {shown(exc.value)}"
        return ApiError(Code.INVALID_SCHEDULE, message, {"field": field})
    bound, _ = LIMITED_FIELDS[exc.bounded_by]
    given, bound_given = _gives(request, field), _gives(request, bound)

    def named(path: str, in_request: bool) -> str:
        return path if in_request else f"{path} (as stored or by default)"

    message = (
        f"{named(field, given)} ({shown(exc.value)}) must not be over {named(bound, bound_given)} "
        f"({shown(exc.high)})"
    )
    return ApiError(Code.INVALID_SCHEDULE, message, {"field": field if given else bound})


def _within_limits(spec: ScheduleSpec, request: SpecRequest) -> ScheduleSpec:
    # The service validates the spec again, limits included; here the refusal can name the
    # request's fields (and which of them it gave), and a batch's item with its index.
    try:
        check_limits(spec)
    except LimitExceeded as exc:
        raise limit_refusal(exc, request) from None
    return spec


def spec_of_create(request: pb.CreateScheduleRequest) -> ScheduleSpec:
    """The spec a create asks for: cron when it has an expression, delayed when it has run_at,
    immediate otherwise."""
    if not request.app:
        # Before the caller's scope is checked: a token scoped to apps would answer "no app ''".
        raise ApiError(Code.INVALID_SCHEDULE, "app is required", {"field": "app"})
    run_at = moment_of(request, "run_at")
    if request.cron_expression and run_at is not None:
        raise ApiError(Code.INVALID_SCHEDULE, "give cron_expression or run_at, not both", {"field": "run_at"})
    kind = (
        ScheduleKind.CRON
        if request.cron_expression
        else ScheduleKind.DELAYED
        if run_at
        else ScheduleKind.IMMEDIATE
    )
    values: dict[str, Any] = {
        "app": request.app,
        "handler": request.handler,
        "kind": str(kind),
        "name": request.name or None,
        "description": request.description or None,
        "cron": request.cron_expression or None,
        "tz": request.timezone or "UTC",
        "run_at": run_at,
        "start_at": moment_of(request, "start_at"),
        "end_at": moment_of(request, "end_at"),
        "payload": payload_of(request),
    }
    if request.HasField("retry_config"):
        _retry(values, request.retry_config)
    if request.HasField("timeout_seconds"):
        values["timeout_ms"] = _ms(request.timeout_seconds, "timeout_seconds")
    if request.HasField("jitter_seconds"):
        values["jitter_ms"] = _ms(request.jitter_seconds, "jitter_seconds")
    if request.misfire_policy:
        values["misfire_policy"] = request.misfire_policy
    if request.overlap_policy:
        values["overlap_policy"] = request.overlap_policy
    return _within_limits(ScheduleSpec(**values), request)


def schedule_key_of(request: pb.CreateScheduleRequest) -> str | None:
    """The key a create gives (None: the schedule's id), checked here to name its field."""
    if not request.schedule_key:
        return None
    try:
        return validate_schedule_key(request.schedule_key)
    except InvalidSchedule as exc:
        raise ApiError(Code.INVALID_SCHEDULE, str(exc), {"field": "schedule_key"}) from None


SPEC_CHANGES = (
    "name", "description", "cron_expression", "run_at", "timezone", "start_at", "end_at", "handler",
    "payload", "retry_config", "timeout_seconds", "jitter_seconds", "misfire_policy", "overlap_policy",
)  # fmt: skip


def changes_spec(request: pb.UpdateScheduleRequest) -> bool:
    return any(request.HasField(field) for field in SPEC_CHANGES if field != "payload") or gives_payload(
        request
    )


# An update's strings that a schedule cannot be without: given empty, they are refused rather than
# read as "keep it" (a client that clears a form's field would see its change dropped) or stored.
# An empty description clears it, and an empty timezone is UTC, as on create.
NOT_EMPTY_IN_UPDATE = ("name", "handler", "cron_expression", "misfire_policy", "overlap_policy")


def spec_of_update(stored: ScheduleSpec, request: pb.UpdateScheduleRequest) -> ScheduleSpec:
    """``stored`` with the fields the update gives; a cron expression or run_at changes the kind."""
    for field in NOT_EMPTY_IN_UPDATE:
        if request.HasField(field) and not getattr(request, field):
            raise ApiError(
                Code.INVALID_SCHEDULE,
                f"{field} cannot be empty; leave it out to keep the schedule's",
                {"field": field},
            )
    values: dict[str, Any] = {}
    plain = {"name": "name", "description": "description", "timezone": "tz", "handler": "handler",
             "misfire_policy": "misfire_policy", "overlap_policy": "overlap_policy"}  # fmt: skip
    for field, column in plain.items():
        if request.HasField(field):
            values[column] = getattr(request, field) or (None if column in ("name", "description") else "")
    if request.HasField("timezone") and not request.timezone:
        values["tz"] = "UTC"  # an empty zone is UTC, as on create and in schedule commands
    if request.HasField("cron_expression") and request.HasField("run_at"):
        raise ApiError(Code.INVALID_SCHEDULE, "give cron_expression or run_at, not both", {"field": "run_at"})
    if request.HasField("cron_expression"):
        values |= {"kind": str(ScheduleKind.CRON), "cron": request.cron_expression, "run_at": None}
    if request.HasField("run_at"):
        values |= {"kind": str(ScheduleKind.DELAYED), "cron": None, "run_at": moment_of(request, "run_at")}
    for field in ("start_at", "end_at"):
        if request.HasField(field):
            values[field] = moment_of(request, field)
        elif values.get("kind", stored.kind) != ScheduleKind.CRON:
            # A one-shot has no bounds: a cron schedule's go with its expression (and a one-shot
            # stored with them before they were refused loses them), unless given (then refused).
            values[field] = None
    if gives_payload(request):
        values["payload"] = payload_of(request)
    if request.HasField("retry_config"):
        _retry(values, request.retry_config)
    if request.HasField("timeout_seconds"):
        values["timeout_ms"] = _ms(request.timeout_seconds, "timeout_seconds")
    if request.HasField("jitter_seconds"):
        values["jitter_ms"] = _ms(request.jitter_seconds, "jitter_seconds")
    return _within_limits(dataclasses.replace(stored, **values), request)
