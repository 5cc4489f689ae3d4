"""The benchmarks' percentiles are rounded to a tenth of a millisecond, whatever the count."""

from __future__ import annotations

from bench.common import percentiles


def test_one_value_is_rounded_as_many_are() -> None:
    assert percentiles([64.40977400006886]) == {"p50": 64.4, "p90": 64.4, "p99": 64.4, "max": 64.4}
    assert percentiles([64.40977400006886, 64.40977400006886])["max"] == 64.4
