"""How often the scanner comes back for fires leased ahead: one scan per slice of the look-ahead,
half the window while fires are sparse, shorter when they are dense (smaller bursts downstream)."""

from __future__ import annotations

import math

import pytest

from scheduler.scan.scanner import MAX_SLICE_SHARE, MIN_SLICE_SHARE, SLICE_FIRES, wake_share


def slice_s(dispatched: int, since_last_s: float, lookahead_s: float = 1.0) -> float:
    return (1.0 - wake_share(dispatched, since_last_s, lookahead_s)) * lookahead_s


def test_sparse_fires_are_scanned_every_half_window() -> None:
    assert slice_s(0, 0.5) == pytest.approx(MAX_SLICE_SHARE)
    assert slice_s(50, 0.5) == pytest.approx(MAX_SLICE_SHARE)  # 100 fires/s
    assert slice_s(3, math.inf) == pytest.approx(MAX_SLICE_SHARE)  # the first scan
    assert slice_s(1, 60.0, lookahead_s=30.0) == pytest.approx(15.0)


def test_dense_fires_are_scanned_so_a_slice_holds_about_slice_fires() -> None:
    # 1,000 fires/s, seen over a half-window slice, then kept at the slice it leads to.
    first = slice_s(500, 0.5)
    assert first * 1000 == pytest.approx(SLICE_FIRES)
    assert slice_s(round(first * 1000), first) == pytest.approx(first)
    # 400 fires/s: half a second would hold exactly SLICE_FIRES.
    assert slice_s(200, 0.5) == pytest.approx(0.5)


def test_a_flood_is_scanned_no_more_often_than_a_tenth_of_the_window() -> None:
    assert slice_s(2000, 0.1) == pytest.approx(MIN_SLICE_SHARE)
    assert slice_s(10_000, 0.5, lookahead_s=10.0) == pytest.approx(10.0 * MIN_SLICE_SHARE)


def test_a_scan_woken_at_once_does_not_pass_for_a_flood() -> None:
    # One create's NOTIFY right after a scan: one fire 2 ms later is not 500 fires/s.
    assert slice_s(1, 0.002) == pytest.approx(MAX_SLICE_SHARE)
    # Nor are a hundred right after one (1,000/s over the shortest slice, not 50,000/s).
    assert slice_s(100, 0.002) == pytest.approx(SLICE_FIRES / 1000)


def test_no_look_ahead_no_share() -> None:
    assert wake_share(1000, 0.1, 0.0) == 0.0
