"""What the built-in handlers take as payload, checked where a schedule is made and where it runs.

A payload a built-in handler cannot take fails every attempt of every fire the same way; refused
when the schedule is created or changed (CLI, API, Kafka command), it never makes a run at all. The
worker applies the same checks to what it is given (a schedule stored before a check existed, a job
produced by other means). Each problem is said in words that name fields and shapes, never a
payload's values: the text is an API error, a command's rejection, a run's error and a log line.

Light on purpose: the schedule service imports it into the CLI, the API and the ingestor.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from scheduler.telemetry.redact import describe_payload

# RFC 9110's token: a method or a header name.
TOKEN_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
BAD_HEADER_VALUE_RE = re.compile(r"[\r\n\x00]")


def payload_problem(handler: str, payload: Any) -> str | None:
    """What is wrong with ``payload`` for the built-in ``handler``; None when it takes it, or when
    ``handler`` is not a built-in one (a registered handler's payload is its own business)."""
    match handler:
        case "builtin:sleep":
            return sleep_problem(payload)
        case "builtin:fail":
            return fail_problem(payload)
        case "builtin:http":
            return http_problem(payload)
    return None


def sleep_problem(payload: Any) -> str | None:
    if not isinstance(payload, Mapping) or "seconds" not in payload:
        return f'builtin:sleep needs a JSON object payload with "seconds", got {describe_payload(payload)}'
    seconds = payload["seconds"]
    if not _finite_number(seconds):
        return f'builtin:sleep needs {{"seconds": a number >= 0}}, got {_not_a_number(seconds)}'
    if seconds < 0:
        return "builtin:sleep cannot sleep a negative time"
    return None


def fail_problem(payload: Any) -> str | None:
    payload = payload if payload is not None else {}
    if not isinstance(payload, Mapping):
        return (
            f'builtin:fail needs a JSON object payload like {{"times": 2}}, got {describe_payload(payload)}'
        )
    times = payload.get("times")
    if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 0):
        shown = "a negative integer" if isinstance(times, int) and not isinstance(times, bool) else None
        return f"builtin:fail needs an integer times >= 0, got {shown or describe_payload(times)}"
    retryable = payload.get("retryable", True)
    if not isinstance(retryable, bool):
        return f"builtin:fail needs a boolean retryable, got {describe_payload(retryable)}"
    return None


def http_problem(payload: Any) -> str | None:
    """The payload's shape; the worker parses the URL itself too, and checks where it points."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("url"), str):
        return f'builtin:http needs a JSON object payload with a "url", got {describe_payload(payload)}'
    try:
        url = urlsplit(payload["url"])
        host, _ = url.hostname, url.port  # a port that is not a number raises here
    except ValueError:
        return "builtin:http: the url is not a valid URL"
    if url.scheme.lower() not in ("http", "https") or not host:
        return "builtin:http: only http and https URLs with a host are allowed"
    method = payload.get("method", "GET")
    if not isinstance(method, str) or not TOKEN_RE.match(method):
        return f"builtin:http: the method is not an HTTP method name (got {describe_payload(method)})"
    headers = payload.get("headers") or {}
    if not isinstance(headers, Mapping):
        return f"builtin:http: headers must be a JSON object, got {describe_payload(headers)}"
    for name, value in headers.items():
        if not isinstance(name, str) or not TOKEN_RE.match(name):
            return "builtin:http: a header name is not an HTTP token"
        if not isinstance(value, str):
            return f"builtin:http: header {name!r} must be a string, got {describe_payload(value)}"
        if BAD_HEADER_VALUE_RE.search(value):
            return f"builtin:http: header {name!r} holds a line break or NUL character"
    timeout = payload.get("timeout", 1)
    if not _finite_number(timeout):
        return f"builtin:http: timeout must be a number of seconds, got {_not_a_number(timeout)}"
    if timeout <= 0:
        return "builtin:http: timeout must be positive"
    return None


def _finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _not_a_number(value: Any) -> str:
    if isinstance(value, float):
        return "a number that is not finite"
    return describe_payload(value)
