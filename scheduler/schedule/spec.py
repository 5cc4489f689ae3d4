"""What a user asks for when creating a schedule, validated before anything is stored.

The CLI and the Avro ingestor both build a :class:`ScheduleSpec` and call :func:`validate`; each
rule fails with one line that names the field, so every entry point reports bad input the same way.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scheduler.domain.cron import CronSchedule, InvalidCronExpression, UnknownTimeZone, time_zone
from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind

APP_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
HANDLER_RE = re.compile(r"^(builtin:(noop|sleep|fail|http)|[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*)$")
MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_NAME_LENGTH = 200
KINDS = tuple(str(k) for k in ScheduleKind)
MISFIRE_POLICIES = tuple(str(p) for p in MisfirePolicy)
OVERLAP_POLICIES = tuple(str(p) for p in OverlapPolicy)


class InvalidSchedule(ValueError):
    """A schedule request that cannot be stored; the message is one line naming the field."""


@dataclass(frozen=True)
class ScheduleSpec:
    app: str
    handler: str
    kind: str
    name: str | None = None
    cron: str | None = None
    tz: str = "UTC"
    run_at: datetime | None = None
    start_at: datetime | None = None
    end_at: datetime | None = None
    payload: Any = field(default_factory=dict)
    max_attempts: int = 3
    backoff_base_ms: int = 1000
    backoff_max_ms: int = 300_000
    timeout_ms: int = 300_000
    misfire_policy: str = MisfirePolicy.FIRE_ONCE
    overlap_policy: str = OverlapPolicy.ALLOW
    jitter_ms: int = 0


def validate_app_name(name: str) -> str:
    if not APP_NAME_RE.match(name):
        raise InvalidSchedule(
            f"app name {name!r} must match [a-z0-9][a-z0-9-]{{0,47}} (lowercase, digits, '-', at most 48)"
        )
    return name


def encoded_payload(payload: Any) -> str:
    """The payload as the JSON text stored and sent; refuses what JSON cannot carry or is too big."""
    try:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidSchedule(f"payload is not JSON: {exc}") from None
    size = len(text.encode())
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidSchedule(f"payload is {size} bytes encoded; the limit is {MAX_PAYLOAD_BYTES} (1 MiB)")
    return text


def _aware(moment: datetime | None, what: str) -> None:
    if moment is not None and moment.utcoffset() is None:
        raise InvalidSchedule(f"{what} must carry a time zone offset (e.g. 2027-01-01T09:00:00Z)")


def validate(spec: ScheduleSpec) -> ScheduleSpec:
    """Return ``spec`` if it can be stored as it is, else raise :class:`InvalidSchedule`."""
    validate_app_name(spec.app)
    if spec.name is not None and not 1 <= len(spec.name) <= MAX_NAME_LENGTH:
        raise InvalidSchedule(f"name must be 1 to {MAX_NAME_LENGTH} characters, got {len(spec.name)}")
    if spec.kind not in KINDS:
        raise InvalidSchedule(f"kind {spec.kind!r} must be one of {', '.join(KINDS)}")
    if len(spec.handler) > 300 or not HANDLER_RE.match(spec.handler):
        raise InvalidSchedule(
            f"handler {spec.handler!r} must be builtin:noop|sleep|fail|http or package.module:function"
        )
    try:
        time_zone(spec.tz)
    except UnknownTimeZone as exc:
        raise InvalidSchedule(str(exc)) from None
    if spec.kind == ScheduleKind.CRON:
        if not spec.cron:
            raise InvalidSchedule("a cron schedule needs a cron expression")
        try:
            CronSchedule.of(spec.cron, spec.tz)
        except InvalidCronExpression as exc:
            raise InvalidSchedule(str(exc)) from None
    elif spec.cron is not None:
        raise InvalidSchedule(f"a {spec.kind} schedule takes no cron expression")
    if spec.kind == ScheduleKind.DELAYED and spec.run_at is None:
        raise InvalidSchedule("a delayed schedule needs run_at (--at)")
    for moment, what in ((spec.run_at, "run_at"), (spec.start_at, "start_at"), (spec.end_at, "end_at")):
        _aware(moment, what)
    if spec.start_at and spec.end_at and spec.end_at <= spec.start_at:
        raise InvalidSchedule("end_at must be after start_at")
    encoded_payload(spec.payload)
    if not 1 <= spec.max_attempts <= 100:
        raise InvalidSchedule(f"max_attempts must be 1 to 100, got {spec.max_attempts}")
    if not 1 <= spec.timeout_ms <= 86_400_000:
        raise InvalidSchedule(f"timeout must be 1 ms to 24 h, got {spec.timeout_ms} ms")
    if spec.backoff_base_ms < 0 or spec.backoff_max_ms < spec.backoff_base_ms:
        raise InvalidSchedule("backoff must satisfy 0 <= base <= max")
    if spec.misfire_policy not in MISFIRE_POLICIES:
        raise InvalidSchedule(
            f"misfire policy {spec.misfire_policy!r} must be one of {', '.join(MISFIRE_POLICIES)}"
        )
    if spec.overlap_policy not in OVERLAP_POLICIES:
        raise InvalidSchedule(
            f"overlap policy {spec.overlap_policy!r} must be one of {', '.join(OVERLAP_POLICIES)}"
        )
    if spec.jitter_ms < 0:
        raise InvalidSchedule("jitter must not be negative")
    return spec


def spec_columns(spec: ScheduleSpec) -> dict[str, Any]:
    """The schedule table's columns as the spec sets them (the caller adds id, name and next fire)."""
    return dataclasses.asdict(spec)
