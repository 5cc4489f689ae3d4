"""What a user asks for when creating a schedule, validated before anything is stored.

The CLI and the Avro ingestor both build a :class:`ScheduleSpec` and call :func:`validate`; each
rule fails with one line that names the field, so every entry point reports bad input the same way.
A number outside its limits (:func:`check_limits`) fails with a :class:`LimitExceeded` that also
carries the field, its bounds and the value, in the spec's units: the API says it in its own field
names and seconds from those, not from limits of its own.
Whatever validation accepts can be stored and delivered: text PostgreSQL cannot hold (a NUL
character, a lone surrogate) and JSON nested deeper than any reader of the payload copes with are
refused here, with the reason, rather than failing later in a component.

An app may declare the handlers its schedules may name (:func:`validate_handler_refs`,
:func:`check_declared_handler`); the workers refuse anything their operator did not register
anyway, so a declaration only moves that refusal forward to the moment the schedule is made. A
built-in handler's payload is checked here as its handler checks it (``builtin_payloads``): a
``builtin:sleep`` without ``seconds`` is refused now, not dead-lettered at every fire.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from scheduler.domain.cron import CronSchedule, InvalidCronExpression, UnknownTimeZone, time_zone
from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind
from scheduler.domain.storable import quoted
from scheduler.worker.builtin_payloads import payload_problem

APP_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,47}")
BUILTIN_MODULE = "builtin"
BUILTINS = ("noop", "sleep", "fail", "http")
MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# A Python callable (package.module:function, or package.module:Class.method, as workers resolve
# them), or one of the builtins: `builtin` is not an importable module, so only its own names
# count. Matched whole (fullmatch).
HANDLER_RE = re.compile(
    rf"(?!{BUILTIN_MODULE}:){MODULE_RE.pattern}:{MODULE_RE.pattern}|{BUILTIN_MODULE}:({'|'.join(BUILTINS)})"
)
MAX_PAYLOAD_BYTES = 1024 * 1024
# Deep enough for any document people write; shallow enough that every reader of the payload stays
# within its own limit: json in the workers, jsonb in PostgreSQL, a recursive handler, and the
# API's protobuf Value, the tightest (protobuf nests at most 100 messages, three per JSON object
# level, and an audit entry carries a payload two levels below its response).
MAX_PAYLOAD_DEPTH = 30
# Every number, string, boolean, null, list and object counts as one value. The bytes alone do not
# bound a payload's cost: a megabyte of zeros is half a million values, and each costs about 2 µs to
# turn between JSON and the API's protobuf Value and back (a second a payload; a 31 MiB batch, 66 s).
MAX_PAYLOAD_VALUES = 100_000
MAX_NAME_LENGTH = 200
MAX_CRON_LENGTH = 200
MAX_DESCRIPTION_LENGTH = 2000
MAX_HANDLER_LENGTH = 300
# Retry waits and fire jitter are stored as integer milliseconds; a day is far beyond any sensible
# setting and well inside the column's range.
MAX_DELAY_MS = 86_400_000
MAX_TIMEOUT_MS = 86_400_000
MAX_ATTEMPTS = 100
# What an app may declare: handlers as schedules name them, or modules (HANDLER_RE, MODULE_RE).
MAX_DECLARED_HANDLERS = 100
KINDS = tuple(str(k) for k in ScheduleKind)
MISFIRE_POLICIES = tuple(str(p) for p in MisfirePolicy)
OVERLAP_POLICIES = tuple(str(p) for p in OverlapPolicy)


class InvalidSchedule(ValueError):
    """A schedule request that cannot be stored; the message is one line naming the field, and
    ``field`` is that field's name in the spec (``cron``, ``tz``, ``run_at``…) when the refusal is
    of one field, for an answer that names it in the caller's own words (the API's)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class PayloadTooLarge(InvalidSchedule):
    """The payload's encoded size is over the limit (the API answers 413 for it)."""


class LimitExceeded(InvalidSchedule):
    """A number of the spec outside its limits: ``field`` (the spec's) must be ``low`` to ``high``
    and is ``value``, in the spec's units (durations in milliseconds). ``bounded_by`` names the
    field whose value ``high`` is, when the bound is another field (a backoff's base is at most its
    max). The message is the spec's own wording, which the CLI and Kafka commands show."""

    field: str

    def __init__(
        self, message: str, field: str, low: int, high: int, value: int, bounded_by: str | None = None
    ) -> None:
        super().__init__(message, field)
        self.low = low
        self.high = high
        self.value = value
        self.bounded_by = bounded_by


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
    description: str | None = None


# Any id will do to check the form of an expression with H: none is hashed for real with it.
SYNTAX_CHECK_ID = uuid.UUID(int=0)


MAX_KEY_LENGTH = 200
# A key is how people and commands name a schedule (`scheduler schedules get APP/KEY`), so it must
# read back as it was written: no control character, tab, line break or invisible character, and no
# blank at either end (which a form, a terminal or a shell would silently lose). Written so that
# Python and ECMA-262 (the OpenAPI document's patterns) read it the same: \s is whitespace in both,
# once U+FEFF, which only ECMA-262 counts, is named. Invisible besides those: the soft hyphen, the
# combining grapheme joiner, the Arabic letter mark, the Hangul fillers, the Khmer inherent vowels,
# the Mongolian vowel separator, and the interlinear and other specials of U+FFF0-U+FFFB, each of
# which would let two keys that look alike name two schedules.
VISIBLE_CHARACTER = (
    r"[^\s\x00-\x1f\x7f-\x9f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f"
    r"\u202a-\u202e\u2060-\u206f\u3164\ufeff\uffa0\ufff0-\ufffb]"
)
# Between visible characters, besides the space: the zero-width non-joiner and joiner, which some
# scripts (Persian, the Indic ones) and emoji sequences (a family, a flag) need to be written at all.
SCHEDULE_KEY_RE = re.compile(
    rf"{VISIBLE_CHARACTER}(?:(?:{VISIBLE_CHARACTER}|[ \u200c\u200d])*{VISIBLE_CHARACTER})?"
)
VISIBLE_TEXT_RULE = (
    "letters, digits, punctuation and symbols, with spaces only between them "
    "(no tab, line break, control or invisible character)"
)
SCHEDULE_KEY_RULE = f"1 to {MAX_KEY_LENGTH} characters: {VISIBLE_TEXT_RULE}"


def validate_schedule_key(key: str) -> str:
    """A schedule key as the CLI, the API and Kafka commands name it (:data:`SCHEDULE_KEY_RE`)."""
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not SCHEDULE_KEY_RE.fullmatch(key):
        raise InvalidSchedule(f"schedule key {quoted(key)} must be {SCHEDULE_KEY_RULE}", "schedule_key")
    return check_text(key, "schedule key")


def validate_app_name(name: str) -> str:
    if not APP_NAME_RE.fullmatch(name):
        raise InvalidSchedule(
            f"app name {quoted(name)} must match [a-z0-9][a-z0-9-]{{0,47}} "
            "(lowercase, digits, '-', at most 48)",
            "app",
        )
    return name


def check_text(text: str, what: str) -> str:
    """``text`` if PostgreSQL can store it as it is; a NUL or a lone surrogate is refused by name."""
    if "\x00" in text:
        raise InvalidSchedule(f"{what} contains a NUL character, which PostgreSQL cannot store", what)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise InvalidSchedule(f"{what} is not valid Unicode (it holds a lone surrogate)", what) from None
    return text


def _check_payload_value(payload: Any) -> int:
    """Depth and text of a payload, walked without recursion (so depth itself cannot break it);
    returns how many more bytes its numbers take as PostgreSQL keeps them than as JSON writes them.

    A payload is stored as ``jsonb``, whose numbers are exact decimals written out in full: JSON's
    ``1e+300`` (6 bytes) is a 1 and 300 zeros in the job message made from it, so 140,000 of them
    (a 980 KB payload) made a 42 MB message that Kafka refused. Only a float written with an
    exponent grows; the rest keep their digits."""
    grows = 0
    values = 0
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        values += 1
        if values > MAX_PAYLOAD_VALUES:
            shown = (
                f"payload holds more than {MAX_PAYLOAD_VALUES:,} values (numbers, strings, lists, objects...)"
            )
            raise InvalidSchedule(shown, "payload")
        if isinstance(value, str):
            check_text(value, "payload")
        elif isinstance(value, float):
            written = repr(value)
            if "e" in written:
                grows += len(format(Decimal(written), "f")) - len(written)
        elif isinstance(value, dict | list | tuple):
            if depth > MAX_PAYLOAD_DEPTH:
                raise InvalidSchedule(f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels", "payload")
            if isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(key, str):
                        check_text(key, "payload")
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)
    return grows


def parse_payload(text: str) -> Any:
    """A payload's JSON text as a value; refuses text that is not JSON or nests too deep."""
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or an integer past Python's 4300 digits
        raise InvalidSchedule(f"payload is not JSON: {exc}", "payload") from None
    except RecursionError:
        # The decoder's own depth limit (about a thousand levels), far beyond ours.
        raise InvalidSchedule(f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels", "payload") from None


# json.dumps with options builds an encoder per call; the ingestor encodes thousands a second.
_PAYLOAD_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encoded_payload(payload: Any) -> str:
    """The payload as the JSON text stored and sent; refuses what JSON cannot carry, what PostgreSQL
    cannot store, what nests too deep, and what is too big."""
    grows = _check_payload_value(payload)
    try:
        text = _PAYLOAD_ENCODER.encode(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidSchedule(f"payload is not JSON: {exc}", "payload") from None
    size = len(text.encode())
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(f"payload is {size} bytes encoded; the limit is {MAX_PAYLOAD_BYTES} (1 MiB)")
    if size + grows > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"payload is {size + grows} bytes with its numbers written out in full, as they are stored "
            f"(1e+300 is 301 digits); the limit is {MAX_PAYLOAD_BYTES} (1 MiB)"
        )
    return text


def validate_handler_refs(refs: Sequence[str]) -> list[str]:
    """What an app declares, checked and deduplicated in the given order.

    Builtins are handlers like any other here: an app that declares its handlers names the builtins
    it uses too (``builtin`` for all of them, ``builtin:http`` for one), so that a declaration is the
    whole list of what its schedules may run.
    """
    if not refs:
        raise InvalidSchedule("declare at least one handler (or none at all: any registered handler)")
    if len(refs) > MAX_DECLARED_HANDLERS:
        raise InvalidSchedule(f"an app declares at most {MAX_DECLARED_HANDLERS} handlers, got {len(refs)}")
    declared: list[str] = []
    for ref in refs:
        check_text(ref, "handler")
        well_formed = HANDLER_RE.fullmatch(ref) or MODULE_RE.fullmatch(ref)
        if len(ref) > MAX_HANDLER_LENGTH or not well_formed:
            raise InvalidSchedule(
                f"handler {quoted(ref)} must be builtin, builtin:noop|sleep|fail|http, package.module "
                "(its public functions) or package.module:function (or :Class.method)"
            )
        if ref not in declared:
            declared.append(ref)
    return declared


def handler_declared(handler: str, declared: Sequence[str]) -> bool:
    """Whether ``handler`` (as a schedule names it) is among ``declared``: named exactly, or a
    public function of a declared module (as a worker registering that module would run it)."""
    module, _, function = handler.partition(":")
    public = not any(name.startswith("_") for name in function.split("."))
    return handler in declared or (module in declared and public)


def check_declared_handler(handler: str, app: str, declared: Sequence[str] | None) -> None:
    """Refuse ``handler`` unless ``app`` admits it; an app that declares nothing admits any."""
    if declared is not None and not handler_declared(handler, declared):
        raise InvalidSchedule(
            f"handler {quoted(handler)} is not declared by app {quoted(app)} "
            f"(it declares {', '.join(declared)}); "
            "an operator changes that with `scheduler apps handlers`",
            "handler",
        )


# Fire times are computed and stored as instants between these; outside them the date arithmetic
# of a cron schedule (and PostgreSQL's own range) has no room.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def _aware(moment: datetime | None, what: str) -> None:
    if moment is None:
        return
    if moment.utcoffset() is None:
        raise InvalidSchedule(f"{what} must carry a time zone offset (e.g. 2027-01-01T09:00:00Z)", what)
    if not EARLIEST <= moment <= LATEST:
        raise InvalidSchedule(f"{what} must be between 1970 and 9000, got {moment.isoformat()}", what)


def validate(spec: ScheduleSpec) -> ScheduleSpec:
    """Return ``spec`` if it can be stored as it is, else raise :class:`InvalidSchedule`."""
    validate_encoded(spec)
    return spec


def validate_encoded(spec: ScheduleSpec) -> str:
    """:func:`validate`, returning the payload's JSON text to store, which validating encodes
    anyway (the ingestor, which stores thousands a second, would otherwise encode it twice)."""
    texts = {
        "app": spec.app,
        "name": spec.name,
        "description": spec.description,
        "handler": spec.handler,
        "cron": spec.cron,
        "tz": spec.tz,
    }
    for what, text in texts.items():
        if text is not None:
            check_text(text, what)
    validate_app_name(spec.app)
    if spec.name is not None and not 1 <= len(spec.name) <= MAX_NAME_LENGTH:
        raise InvalidSchedule(f"name must be 1 to {MAX_NAME_LENGTH} characters, got {len(spec.name)}", "name")
    if spec.description is not None and len(spec.description) > MAX_DESCRIPTION_LENGTH:
        raise InvalidSchedule(
            f"description must be at most {MAX_DESCRIPTION_LENGTH} characters, got {len(spec.description)}",
            "description",
        )
    if spec.kind not in KINDS:
        raise InvalidSchedule(f"kind {quoted(spec.kind)} must be one of {', '.join(KINDS)}", "kind")
    if len(spec.handler) > MAX_HANDLER_LENGTH or not HANDLER_RE.fullmatch(spec.handler):
        raise InvalidSchedule(
            f"handler {quoted(spec.handler)} must be builtin:noop|sleep|fail|http or package.module:function "
            "(or :Class.method)",
            "handler",
        )
    try:
        time_zone(spec.tz)
    except UnknownTimeZone as exc:
        raise InvalidSchedule(str(exc), "tz") from None
    if spec.kind == ScheduleKind.CRON:
        if not spec.cron:
            raise InvalidSchedule("a cron schedule needs a cron expression", "cron")
        if len(spec.cron) > MAX_CRON_LENGTH:
            # The schedules table holds no longer one: said here, not as a failed insert.
            raise InvalidSchedule(
                f"cron expression must be at most {MAX_CRON_LENGTH} characters, got {len(spec.cron)}"
            )
        try:
            # H is checked here for its form only; the schedule's own id picks its values when its
            # fires are computed (first_fire and the scanner), once the id exists.
            CronSchedule.of(spec.cron, spec.tz, schedule_id=SYNTAX_CHECK_ID)
        except InvalidCronExpression as exc:
            raise InvalidSchedule(str(exc), "cron") from None
    elif spec.cron is not None:
        raise InvalidSchedule(f"a {spec.kind} schedule takes no cron expression", "cron")
    if spec.kind == ScheduleKind.DELAYED and spec.run_at is None:
        raise InvalidSchedule("a delayed schedule needs run_at (--at)", "run_at")
    if spec.kind != ScheduleKind.DELAYED and spec.run_at is not None:
        # Taken and ignored, it would let an immediate schedule fire now, years before the time
        # its owner gave, and a cron one on its expression alone.
        raise InvalidSchedule(
            f"run_at is a delayed schedule's instant; a {spec.kind} schedule takes none "
            "(for a later one-shot, the kind is delayed)",
            "run_at",
        )
    if spec.kind != ScheduleKind.CRON and (spec.start_at is not None or spec.end_at is not None):
        # Taken and ignored, they would let a one-shot fire after the end its owner set.
        raise InvalidSchedule(
            f"start_at and end_at bound a cron schedule's fires; a one-shot ({spec.kind}) fires once "
            "and takes neither",
            "start_at" if spec.start_at is not None else "end_at",
        )
    for moment, what in ((spec.run_at, "run_at"), (spec.start_at, "start_at"), (spec.end_at, "end_at")):
        _aware(moment, what)
    if spec.start_at and spec.end_at and spec.end_at <= spec.start_at:
        raise InvalidSchedule("end_at must be after start_at", "end_at")
    payload = encoded_payload(spec.payload)
    if problem := payload_problem(spec.handler, spec.payload):
        raise InvalidSchedule(problem, "payload")  # every fire would fail with it
    check_limits(spec)
    if spec.misfire_policy not in MISFIRE_POLICIES:
        raise InvalidSchedule(
            f"misfire policy {quoted(spec.misfire_policy)} must be one of {', '.join(MISFIRE_POLICIES)}",
            "misfire_policy",
        )
    if spec.overlap_policy not in OVERLAP_POLICIES:
        raise InvalidSchedule(
            f"overlap policy {quoted(spec.overlap_policy)} must be one of {', '.join(OVERLAP_POLICIES)}",
            "overlap_policy",
        )
    return payload


def check_limits(spec: ScheduleSpec) -> None:
    """The spec's attempts and durations within their limits, else :class:`LimitExceeded` (part of
    :func:`validate`; the API runs it first, where it knows which fields its request gave)."""
    attempts, timeout, jitter = spec.max_attempts, spec.timeout_ms, spec.jitter_ms
    if not 1 <= attempts <= MAX_ATTEMPTS:
        said = f"max_attempts must be 1 to {MAX_ATTEMPTS}, got {attempts}"
        raise LimitExceeded(said, "max_attempts", 1, MAX_ATTEMPTS, attempts)
    if not 1 <= timeout <= MAX_TIMEOUT_MS:
        said = f"timeout must be 1 ms to 24 h, got {timeout} ms"
        raise LimitExceeded(said, "timeout_ms", 1, MAX_TIMEOUT_MS, timeout)
    base, most = spec.backoff_base_ms, spec.backoff_max_ms
    if not 0 <= base <= most <= MAX_DELAY_MS:
        said = f"backoff must satisfy 0 <= base <= max <= 24 h, got base {base} ms and max {most} ms"
        if not 0 <= base <= MAX_DELAY_MS:
            raise LimitExceeded(said, "backoff_base_ms", 0, MAX_DELAY_MS, base)
        if not 0 <= most <= MAX_DELAY_MS:
            raise LimitExceeded(said, "backoff_max_ms", 0, MAX_DELAY_MS, most)
        raise LimitExceeded(said, "backoff_base_ms", 0, most, base, bounded_by="backoff_max_ms")
    if not 0 <= jitter <= MAX_DELAY_MS:
        said = f"jitter must be 0 to 24 h, got {jitter} ms"
        raise LimitExceeded(said, "jitter_ms", 0, MAX_DELAY_MS, jitter)


def spec_columns(spec: ScheduleSpec) -> dict[str, Any]:
    """The schedule table's columns as the spec sets them (the caller adds id, name and next fire).
    Shallow: a payload is shared, not copied (asdict's deep copy of a large payload cost more than
    the rest of a bulk create)."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def stored_spec(row: Mapping[str, Any]) -> ScheduleSpec:
    """The spec of a stored schedule (its row), as an update starts from."""
    return ScheduleSpec(
        app=row["app"],
        handler=row["handler"],
        kind=row["kind"],
        name=row["name"],
        description=row.get("description"),
        cron=row["cron"],
        tz=row["tz"],
        # A run_at an earlier release stored on an immediate or cron schedule, which nothing read,
        # is left behind: the update validates the spec as a create does.
        run_at=row["run_at"] if row["kind"] == ScheduleKind.DELAYED else None,
        start_at=row["start_at"],
        end_at=row["end_at"],
        payload=row["payload"],
        max_attempts=row["max_attempts"],
        backoff_base_ms=row["backoff_base_ms"],
        backoff_max_ms=row["backoff_max_ms"],
        timeout_ms=row["timeout_ms"],
        misfire_policy=row["misfire_policy"],
        overlap_policy=row["overlap_policy"],
        jitter_ms=row["jitter_ms"],
    )
