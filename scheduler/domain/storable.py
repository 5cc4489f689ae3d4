"""Text and JSON from handlers, made storable and deliverable whatever they contain.

A handler's result or error is whatever its code produced: it may hold a NUL character (which
PostgreSQL's ``text`` and ``jsonb`` refuse), lone surrogates (text that is not valid UTF-8, from
bytes decoded with ``surrogateescape``), or megabytes. Any of those reaching PostgreSQL or Kafka
unchanged would stop a component or lose the outcome, so they are made storable at both ends: the
worker caps what it publishes, and the reconciler escapes what it stores. Escaping is visible
(``\\u0000`` as six characters) rather than silent, so an operator sees what the handler sent; a cut
carries a marker that says how much was cut.
"""

from __future__ import annotations

import json
from typing import Any

# An error is one line for an operator; a result is data for a caller. Both are far under the
# message limit, so an outcome always fits in its Kafka message whatever the handler returned.
MAX_ERROR_CHARS = 8 * 1024
MAX_RESULT_BYTES = 256 * 1024
# The errors of earlier attempts travel in every later job message and dead letter.
MAX_HISTORY_ERROR_CHARS = 1024


# What an error quotes of a value it refuses: enough to recognise it. A refused value can be megabytes
# (a cron expression in a Kafka command), and an error quoting it whole, twice, was too large for
# the topic its rejection goes to.
MAX_QUOTED_CHARS = 120


def quoted(value: object, limit: int = MAX_QUOTED_CHARS) -> str:
    """``repr(value)``, cut to about ``limit`` characters with a count of the rest."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def _escape_char(char: str) -> str:
    return f"\\u{ord(char):04x}"


def storable_text(text: str) -> str:
    """``text`` with NUL and lone surrogates escaped (``\\u0000``, ``\\udcff``), all else unchanged."""
    if "\x00" not in text and text.isascii():
        return text  # the common case, checked cheaply
    return "".join(
        _escape_char(char) if char == "\x00" or "\ud800" <= char <= "\udfff" else char for char in text
    )


def capped_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Storable ``text`` of at most ``limit`` characters; a longer one is cut with a marker."""
    text = storable_text(text)
    if len(text) <= limit:
        return text
    marker = f" [truncated {len(text) - limit} characters]"
    return text[: max(0, limit - len(marker))] + marker


def storable_json(value: Any) -> Any:
    """A JSON value (as from ``json.loads``) whose strings, keys included, PostgreSQL can store."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(str(key)): storable_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [storable_json(item) for item in value]
    return value


def capped_result(result_json: str, limit: int = MAX_RESULT_BYTES) -> str:
    """A result's JSON text of at most ``limit`` UTF-8 bytes, still JSON when it is cut.

    A result over the limit is replaced by an object that says so and keeps the result's start
    as text, so the outcome is delivered and stored instead of refused.
    """
    size = len(result_json.encode("utf-8", "surrogatepass"))
    if size <= limit:
        return result_json
    keep = max(0, limit // 2)
    head = result_json.encode("utf-8", "surrogatepass")[:keep].decode("utf-8", "ignore")
    return json.dumps({"truncated": True, "size_bytes": size, "limit_bytes": limit, "head": head})
