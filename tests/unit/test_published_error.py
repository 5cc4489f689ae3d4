"""A failed attempt's error as the worker publishes it: redacted first (a masked payload value must
not hide the key or URL around a secret), the payload values it quotes masked, cut to what is kept
without leaving the start of a value the cut went through."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from scheduler.domain.storable import MAX_ERROR_CHARS
from scheduler.kafka.messages import JobMessage, RetryPolicy
from scheduler.worker.worker import SCANNED_ERROR_CHARS, _published_error

CARD = "4111111111111111"


def job(payload: Any, handler: str = "billing.jobs:charge") -> JobMessage:
    now = datetime.now(UTC)
    return JobMessage(
        run_id=uuid.uuid4(),
        schedule_id=uuid.uuid4(),
        app="billing",
        attempt=1,
        idempotency_key="k",
        scheduled_for=now,
        handler=handler,
        payload=json.dumps(payload),
        timeout_ms=1000,
        deadline=now,
        retry=RetryPolicy(max_attempts=1, backoff_base_ms=1, backoff_max_ms=1),
    )


def test_secrets_are_redacted_before_payload_values_are_masked() -> None:
    published = _published_error(
        "GET https://api.example.com/v1?signature=abc123 with password=s3cr3t",
        job({"base": "https://api.example.com", "field": "password"}),
    )
    assert "abc123" not in published and "s3cr3t" not in published


def test_a_quoted_payload_value_is_masked_but_not_in_a_builtins_error() -> None:
    assert _published_error(f"card {CARD} declined", job({"card": CARD})) == "card *** declined"
    own = _published_error("needs a JSON object, got 'abcd'", job({"x": "abcd"}, handler="builtin:fail"))
    assert own == "needs a JSON object, got 'abcd'"


def test_a_long_error_is_cut_without_the_start_of_a_value_the_cut_went_through() -> None:
    for at in range(SCANNED_ERROR_CHARS - len(CARD), SCANNED_ERROR_CHARS + 1):
        error = f"ValueError: {'x' * (at - 12)}{CARD}{'y' * 100_000}"
        published = _published_error(error, job({"card": CARD}))
        assert CARD[:6] not in published, at
        assert len(published) <= MAX_ERROR_CHARS
        assert published.endswith(f" [truncated: the error had {len(error)} characters]")


def test_masking_shrinks_the_text_but_no_unsearched_text_is_kept() -> None:
    error = (f"card {CARD} " * 2000) + f"and {CARD[:8]}"
    published = _published_error(error, job({"card": CARD}))
    assert CARD[:8] not in published and published.startswith("card *** card ***")


def test_a_value_longer_than_the_margin_is_masked_wherever_the_scan_would_cut_it() -> None:
    """A PEM key or a long token (longer than the 256 characters scanned past what is kept) quoted
    across the scan's end: none of it is kept."""
    key = "-----BEGIN KEY-----" + "".join(f"{n:04x}" for n in range(250)) + "-----END KEY-----"
    for at in (MAX_ERROR_CHARS - 600, SCANNED_ERROR_CHARS - 500, SCANNED_ERROR_CHARS - 20):
        error = f"ValueError: {'c' * (at - 12)}{key} end{'z' * 2000}"
        published = _published_error(error, job({"key": key}))
        assert key[19:40] not in published and "0040" not in published, at
        assert len(published) <= MAX_ERROR_CHARS
