"""W3C trace context on every message: a run's trace starts when it is scheduled, and each message
that follows from it (outcomes, dead letters) carries the same trace id with a span of its own."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence

HEADER = "traceparent"
_TRACEPARENT_RE = re.compile(r"^00-([0-9a-f]{32})-[0-9a-f]{16}-([0-9a-f]{2})$")


def new_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def child_traceparent(parent: str | None) -> str:
    """A new span in the parent's trace, or a new trace when the parent is missing or malformed."""
    match = _TRACEPARENT_RE.match(parent or "")
    if match is None:
        return new_traceparent()
    return f"00-{match.group(1)}-{secrets.token_hex(8)}-{match.group(2)}"


def traceparent_of(
    headers: Mapping[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]] | None,
) -> str | None:
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        if name == HEADER and value is not None:
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return None
