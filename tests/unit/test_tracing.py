"""W3C trace context helpers."""

from __future__ import annotations

import re

from scheduler.kafka.tracing import child_traceparent, new_traceparent, traceparent_of

TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def test_a_child_keeps_the_trace_and_flags_with_a_new_span() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    child = child_traceparent(parent)
    assert TRACEPARENT.match(child)
    assert child.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert child.split("-")[2] != "b7ad6b7169203331" and child.endswith("-01")


def test_a_missing_or_malformed_parent_starts_a_new_trace() -> None:
    for parent in (None, "", "garbage", "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"):
        assert TRACEPARENT.match(child_traceparent(parent))
    assert new_traceparent() != new_traceparent()


def test_the_header_is_found_in_lists_and_mappings() -> None:
    value = new_traceparent()
    assert traceparent_of([("other", b"x"), ("traceparent", value.encode())]) == value
    assert traceparent_of({"traceparent": value}) == value
    assert traceparent_of(None) is None
