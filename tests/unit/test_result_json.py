"""A handler's result as the worker publishes it: JSON that PostgreSQL's jsonb takes, each value JSON
cannot carry converted on its own (operations.md, Text from handlers), the rest kept as it is."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.reconcile.reconciler import storable_result
from scheduler.worker.worker import _result_json


def strict(text: str) -> Any:
    """``text`` read as JSON proper: NaN and Infinity are not JSON."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} in {text}")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinities_become_their_text_each_leaving_the_rest_of_the_result_as_it_was() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    result = {
        "ratio": math.nan,
        "limits": [math.inf, -math.inf, 1.5],
        "count": 3,
        "when": when,
        "nested": {"ok": True, "none": None, "big": 10**30, "tags": ("a",)},
        math.nan: "a key",
    }
    converted = strict(_result_json(result) or "")
    assert converted == {
        "ratio": "NaN",
        "limits": ["Infinity", "-Infinity", 1.5],
        "count": 3,
        "when": str(when),
        "nested": {"ok": True, "none": None, "big": 10**30, "tags": ["a"]},
        "NaN": "a key",
    }
    # What the reconciler stores is that result, as it would store the same JSON with NaN in it.
    assert storable_result(_result_json(result)) == converted


@pytest.mark.parametrize(("result", "text"), [(math.nan, '"NaN"'), ([math.inf], '["Infinity"]')])
def test_a_result_that_is_only_such_a_number_is_its_text(result: Any, text: str) -> None:
    assert _result_json(result) == text


def test_a_result_json_cannot_write_at_all_is_still_its_repr() -> None:
    cyclic: list[Any] = [math.nan]
    cyclic.append(cyclic)
    assert _result_json(cyclic) == json.dumps("[nan, [...]]")
    assert _result_json({(1, 2): "a tuple key"}) == json.dumps("{(1, 2): 'a tuple key'}")
