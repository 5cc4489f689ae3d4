"""Structured logs: one JSON line per record (a human line on a terminal), tied to the trace and the job.

A component calls :func:`configure_logging` once at start-up; every module then logs through the
standard :mod:`logging` loggers. Each JSON line carries ``timestamp`` (ISO 8601, UTC, milliseconds),
``level``, ``component``, ``logger``, ``message``, the current OpenTelemetry span's ``trace_id`` and
``span_id`` (hex; absent outside a span), and ``app``, ``schedule_id``, ``run_id``, ``attempt`` when
known, from ``extra={...}`` on the call or from an enclosing :func:`log_context`. Other ``extra``
fields follow; an exception is rendered as ``error`` (``type``, ``message``, ``stack_trace``).

Everything is redacted (:mod:`scheduler.telemetry.redact`): the message, the exception and its stack
trace, string extras, and mapping extras key by key. An extra named ``payload`` (or ``*_payload``) is
rendered as its shape, never its values.

Environment (a value that is not one of these is a ``ValueError`` naming the variable):

- ``SCHEDULER_LOG_FORMAT``: ``json``, ``human`` or ``auto`` (the default: human on a terminal, else
  JSON).
- ``SCHEDULER_LOG_LEVEL``: ``DEBUG``, ``INFO`` (the default), ``WARNING``, ``ERROR``, ``CRITICAL``.
- ``SCHEDULER_LOG_JOB_OUTCOMES``: the level of the ``scheduler.jobs`` logger (:data:`JOB_OUTCOMES_LOGGER`),
  where a component writes its one line per job outcome; ``INFO`` by default, so outcomes are logged
  even under ``SCHEDULER_LOG_LEVEL=WARNING``; every outcome is logged at ``INFO``, so ``WARNING``
  or above turns those lines off.
- ``SCHEDULER_REDACT_KEYS``: more sensitive key patterns (see :mod:`scheduler.telemetry.redact`).

``httpx``, ``httpcore`` and ``urllib3`` log at ``WARNING`` or above: one line per HTTP job request
would drown the component's own log. psycopg's lines (its pool's included) are one line each: the
lines of a libpq error they quote are joined with ``; ``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import date, datetime
from types import MappingProxyType
from typing import IO, Any, Final
from uuid import UUID

from opentelemetry import trace
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from scheduler.telemetry import redact
from scheduler.telemetry.redact import MASK, PayloadMask, Redactor, describe_payload, exception_text
from scheduler.telemetry.terminal import shown

__all__ = [
    "FORMAT_ENV",
    "JOB_OUTCOMES_ENV",
    "JOB_OUTCOMES_LOGGER",
    "LEVEL_ENV",
    "check_environment",
    "configure_logging",
    "job_outcomes",
    "log_context",
]

FORMAT_ENV: Final = "SCHEDULER_LOG_FORMAT"
LEVEL_ENV: Final = "SCHEDULER_LOG_LEVEL"
JOB_OUTCOMES_ENV: Final = "SCHEDULER_LOG_JOB_OUTCOMES"

JOB_OUTCOMES_LOGGER: Final = "scheduler.jobs"
job_outcomes: Final = logging.getLogger(JOB_OUTCOMES_LOGGER)
"""The logger of the one line per job outcome; its level is ``SCHEDULER_LOG_JOB_OUTCOMES``."""

_FORMATS: Final = ("json", "human", "auto")
_LEVELS: Final = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}
_NOISY: Final = ("httpx", "httpcore", "urllib3")
# Libraries whose lines quote libpq's errors, which span lines ("... Connection refused\n\tIs the
# server running on that host and accepting TCP/IP connections?"): psycopg_pool warns so of every
# connection it fails to make while PostgreSQL is down. Their message is made one line, its lines
# joined with "; ", so that a human line is one line and a message reads the same in both formats.
_ONE_LINE: Final = ("psycopg",)
_ONE_LINE_CHILDREN: Final = tuple(f"{name}." for name in _ONE_LINE)

# The fields every line places first, in this order, when they are known.
_JOB_FIELDS: Final = ("app", "schedule_id", "run_id", "attempt")
_TRACE_FIELDS: Final = ("trace_id", "span_id")
# LogRecord attributes that are not extras: the standard ones, and those rendered by name here.
# uvicorn's color_message repeats its message with terminal colour codes.
_NOT_EXTRA: Final = frozenset(
    (*RESERVED_ATTRS, "message", "asctime", "taskName", "color_message", *_TRACE_FIELDS, *_JOB_FIELDS)
)

_EMPTY: Final[Mapping[str, object]] = MappingProxyType({})
# A ContextVar, not a thread-local: asyncio tasks and threads started with contextvars.copy_context()
# (asyncio.to_thread does) see the fields of the code that started them, and nothing leaks back.
_job_context: ContextVar[Mapping[str, object]] = ContextVar("scheduler_log_context", default=_EMPTY)


class _JobPayload:
    """The running job's payload, whose values a line its handler logs must not show; decoded at
    the first such line, so that a job that logs nothing costs nothing."""

    __slots__ = ("_mask", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._mask: PayloadMask | None = None

    def mask(self, text: str) -> str:
        if self._mask is None:
            self._mask = PayloadMask(self._text)
        return self._mask.mask(text)


_job_payload: ContextVar[_JobPayload | None] = ContextVar("scheduler_job_payload", default=None)


@contextmanager
def log_context(
    *,
    app: str | None = None,
    schedule_id: UUID | str | None = None,
    run_id: UUID | str | None = None,
    attempt: int | None = None,
    payload: str | None = None,
) -> Iterator[None]:
    """Add the job's ids to every line logged inside the block (``None`` keeps the enclosing value).
    With ``payload`` (the job's JSON), the values it holds are masked in every line logged inside
    the block but the outcome line, as they are in a failed attempt's error: a handler's own
    ``log.info("charging %s", card)`` would show them.

    >>> with log_context(app="billing", run_id=run.id, attempt=run.attempt):  # doctest: +SKIP
    ...     execute(run)
    """
    given = {"app": app, "schedule_id": schedule_id, "run_id": run_id, "attempt": attempt}
    fields = {**_job_context.get(), **{k: v for k, v in given.items() if v is not None}}
    token = _job_context.set(MappingProxyType(fields))
    masked = _job_payload.set(_JobPayload(payload)) if payload is not None else None
    try:
        yield
    finally:
        if masked is not None:
            _job_payload.reset(masked)
        _job_context.reset(token)


def check_environment() -> None:
    """Raise ``ValueError`` naming the variable when a logging variable holds a bad value: for the
    commands that never configure logging, so that a typo is said rather than ignored."""
    _format(_env(FORMAT_ENV, "auto"), FORMAT_ENV)
    _level(_env(LEVEL_ENV, "INFO"), LEVEL_ENV)
    _level(_env(JOB_OUTCOMES_ENV, "INFO"), JOB_OUTCOMES_ENV)
    Redactor.from_env()


def configure_logging(
    component: str, *, fmt: str | None = None, level: str | None = None, stream: IO[str] | None = None
) -> None:
    """Send the process's logs to ``stream`` (stderr) as JSON lines or human lines, redacted.

    ``fmt`` and ``level`` override ``SCHEDULER_LOG_FORMAT`` and ``SCHEDULER_LOG_LEVEL``. Calling it
    again replaces the handler it installed before; other handlers (pytest's) are left alone.
    """
    if not component:
        raise ValueError("configure_logging: component must not be empty")
    # Everything is validated before anything changes: a bad value leaves the logging as it was.
    chosen_fmt = _format(fmt, "fmt") if fmt is not None else _format(_env(FORMAT_ENV, "auto"), FORMAT_ENV)
    root_level = _level(level, "level") if level is not None else _level(_env(LEVEL_ENV, "INFO"), LEVEL_ENV)
    outcomes_level = _level(_env(JOB_OUTCOMES_ENV, "INFO"), JOB_OUTCOMES_ENV)
    redactor = Redactor.from_env()

    out: IO[str] = stream if stream is not None else sys.stderr
    human = chosen_fmt == "human" or (chosen_fmt == "auto" and _is_terminal(out))
    handler = _Handler(out)
    handler.addFilter(_stamp)
    handler.setFormatter(
        HumanFormatter(component, redactor) if human else JsonLineFormatter(component, redactor)
    )

    root = logging.getLogger()
    for previous in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(previous)
        previous.flush()
    root.addHandler(handler)
    root.setLevel(root_level)
    job_outcomes.setLevel(outcomes_level)
    for name in _NOISY:
        # Never louder than the root: under SCHEDULER_LOG_LEVEL=ERROR their warnings stay out too.
        logging.getLogger(name).setLevel(max(logging.WARNING, root_level))
    # Error texts stored in PostgreSQL and Kafka are redacted with the same patterns as the logs.
    redact.install(redactor)


class _Handler(logging.StreamHandler[IO[str]]):
    """The handler configure_logging installs, a type of its own so that a second call finds it."""


def _stamp(record: logging.LogRecord) -> bool:
    # A handler filter runs in the thread and context that logged, so the span and the job ids are
    # those of the call, whatever formats the record later.
    span = trace.get_current_span().get_span_context()
    if span.is_valid:
        if "trace_id" not in record.__dict__:
            record.trace_id = format(span.trace_id, "032x")
        if "span_id" not in record.__dict__:
            record.span_id = format(span.span_id, "016x")
    for key, value in _job_context.get().items():
        # An explicit extra={...} on the call is the more specific value.
        if key not in record.__dict__:
            setattr(record, key, value)
    payload = _job_payload.get()
    if payload is not None and record.name != "scheduler" and not record.name.startswith("scheduler."):
        # Masked here, where the job's context is: the formatter may run elsewhere. Only the
        # handler's lines: the scheduler's own (the outcome line, whose error is masked already)
        # quote no payload, and an app or topic name that a payload happens to hold stays readable.
        _mask_record(record, payload)
    return True


def _mask_record(record: logging.LogRecord, payload: _JobPayload) -> None:
    try:
        message = record.getMessage()
    except Exception:
        # A handler's bad format ("%d" of a text, a __str__ that raises) must not fail its job: the
        # logging module reports it as a logging error, not the caller's. The template alone, then.
        try:
            message = f"{record.msg} (its arguments could not be formatted)"
        except Exception:
            message = "(a message that could not be formatted)"
    record.msg = payload.mask(message)
    record.args = None
    for key, value in list(record.__dict__.items()):
        if key not in _NOT_EXTRA and not key.startswith("_") and isinstance(value, str):
            setattr(record, key, payload.mask(value))
    if record.exc_info and record.exc_info[1] is not None:
        # log.exception("charge failed") inside a job: the exception's text (and the traceback's
        # last line, and any chained exception's) may quote the payload as an error does.
        record._masked_exception = _MaskedException(
            payload.mask(exception_text(record.exc_info[1])),
            payload.mask("".join(traceback.format_exception(*record.exc_info)).rstrip("\n")),
        )


@dataclass(frozen=True, slots=True)
class _MaskedException:
    """A handler's exception as its job's line shows it, the payload's values masked; the
    formatters render it in place of the exception itself."""

    message: str
    text: str
    """The formatted traceback."""


def _masked_exception(record: logging.LogRecord) -> _MaskedException | None:
    masked = record.__dict__.get("_masked_exception")
    return masked if isinstance(masked, _MaskedException) else None


def _env(name: str, default: str) -> str:
    # An empty value (VAR= in a compose file) means "not set".
    return os.environ.get(name, "").strip() or default


def _format(value: str, name: str) -> str:
    chosen = value.strip().lower()
    if chosen not in _FORMATS:
        raise ValueError(f"{name} must be one of {', '.join(_FORMATS)}, not {_shown(value)}")
    return chosen


def _level(value: str, name: str) -> int:
    chosen = _LEVELS.get(value.strip().upper())
    if chosen is None:
        raise ValueError(f"{name} must be one of {', '.join(_LEVELS)}, not {_shown(value)}")
    return chosen


def _shown(value: str) -> str:
    # repr() escapes newlines, which keeps the error on one line; the cut keeps it short.
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _job_value(value: object) -> object:
    # Ids are UUIDs in the code and strings on the line; the attempt stays a number.
    return value if isinstance(value, int | str) else str(value)


class _Fields:
    """What both formats share: the redacted extras and the exception."""

    def __init__(self, component: str, redactor: Redactor) -> None:
        self.component = component
        self.redactor = redactor

    def message(self, record: logging.LogRecord, text: str) -> str:
        # Asked of every line (a job's outcome line too): two string tests, no generator.
        if record.name in _ONE_LINE or record.name.startswith(_ONE_LINE_CHILDREN):
            text = "; ".join(line.strip() for line in text.splitlines() if line.strip())
        return self.redactor.text(text)

    def extra(self, key: str, value: object) -> object:
        if self.redactor.is_sensitive(key):
            return None if value is None else MASK
        if key == "payload" or key.endswith("_payload"):
            return describe_payload(value)
        if isinstance(value, str):
            return self.redactor.text(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        return self.redactor.value(value)

    def error(self, record: logging.LogRecord, stack_trace: str) -> dict[str, str] | None:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            return None
        kind = type(exc)
        name = (
            kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        )
        masked = _masked_exception(record)
        return {
            "type": name,
            "message": self.redactor.text(masked.message if masked else exception_text(exc)),
            "stack_trace": self.redactor.text(masked.text if masked else stack_trace),
        }

    def json_default(self, value: object) -> object:
        # Whatever json cannot encode is written as its text, and that text is redacted like the rest.
        if isinstance(value, datetime | date):
            return value.isoformat()
        return self.redactor.text(str(value))


class JsonLineFormatter(JsonFormatter):
    """One JSON object per record, the fields of the module docstring first, redacted."""

    def __init__(self, component: str, redactor: Redactor | None = None) -> None:
        self._fields = _Fields(component, redactor if redactor is not None else redact.default_redactor())
        super().__init__(json_default=self._fields.json_default)

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        fields, attrs = self._fields, record.__dict__
        log_data["timestamp"] = _timestamp(record)
        log_data["level"] = record.levelname
        log_data["component"] = fields.component
        log_data["logger"] = record.name
        log_data["message"] = fields.message(record, record.message)
        for key in _TRACE_FIELDS:
            if attrs.get(key) is not None:
                log_data[key] = attrs[key]
        for key in _JOB_FIELDS:
            if attrs.get(key) is not None:
                log_data[key] = _job_value(attrs[key])
        # The base class puts the formatted traceback and stack in message_dict; they are rendered
        # below, not as extras.
        stack_trace = message_dict.pop("exc_info", None)
        stack_info = message_dict.pop("stack_info", None)
        for key, value in message_dict.items():  # logger.info({...}): the dict's keys are extras
            log_data[key] = fields.extra(str(key), value)
        for key, value in attrs.items():
            if key not in _NOT_EXTRA and not key.startswith("_"):
                log_data[key] = fields.extra(key, value)
        error = fields.error(record, stack_trace or "")
        if error is not None:
            log_data["error"] = error
        if stack_info:
            log_data["stack_info"] = fields.redactor.text(stack_info)


class HumanFormatter(logging.Formatter):
    """``<timestamp> <LEVEL> <component> <logger>: <message>  key=value...``, then any traceback;
    terminal controls shown as escapes (:func:`scheduler.telemetry.terminal.shown`)."""

    def __init__(self, component: str, redactor: Redactor | None = None) -> None:
        super().__init__()
        self._fields = _Fields(component, redactor if redactor is not None else redact.default_redactor())

    def format(self, record: logging.LogRecord) -> str:
        fields, attrs = self._fields, record.__dict__
        message = fields.message(record, record.getMessage())
        context = [
            f"{key}={_job_value(attrs[key])}"
            for key in (*_JOB_FIELDS, *_TRACE_FIELDS)
            if attrs.get(key) is not None
        ]
        context += [
            f"{key}={fields.extra(key, value)}"
            for key, value in attrs.items()
            if key not in _NOT_EXTRA and not key.startswith("_")
        ]
        line = f"{_timestamp(record)} {record.levelname:<8} {fields.component} {record.name}: {message}"
        if context:
            line += "  " + " ".join(context)
        if record.exc_info:
            masked = _masked_exception(record)
            text = masked.text if masked else self.formatException(record.exc_info)
            line += "\n" + fields.redactor.text(text)
        if record.stack_info:
            line += "\n" + fields.redactor.text(self.formatStack(record.stack_info))
        # Read on a terminal: a schedule's name or a handler's error it quotes cannot act on it.
        return shown(line)
