"""bench.compare sets ours beside the peers: our figures are taken from latest.json only when they
were measured the way the comparison asks for, otherwise measured again."""

from __future__ import annotations

from typing import Any

import pytest

import bench.compare
import bench.e2e
import bench.lag

E2E = {
    "jobs": 1000,
    "partitions": 12,
    "workers": 4,
    "concurrency": 64,
    "scanners": 1,
    "relays": 1,
    "seconds": 1.0,
    "jobs_per_s": 1000.0,
    "cost": {"watcher_cpu_ms": 1.0},
}
LAG = {
    "rate_per_s": 1000,
    "window_s": 10.0,
    "idle_schedules": 0,
    "workers": 4,
    "concurrency": 64,
    "partitions": 12,
    "pg_options": None,
    "p99_ms": 5.0,
}


def measured_again(monkeypatch: pytest.MonkeyPatch, e2e: dict[str, Any], lag: dict[str, Any]) -> list[str]:
    """Which of our two runs ``ours`` measures again, given what latest.json holds."""
    measured: list[str] = []

    def run_e2e(*args: Any, **kwargs: Any) -> dict[str, Any]:
        measured.append("e2e")
        return E2E

    def run_lag(*args: Any, **kwargs: Any) -> dict[str, Any]:
        measured.append("lag")
        return LAG

    monkeypatch.setattr(bench.compare, "latest", lambda: {"e2e": e2e, "lag": {"1000": lag}})
    monkeypatch.setattr(bench.compare, "record", lambda section, figures: None)
    monkeypatch.setattr(bench.e2e, "run_e2e", run_e2e)
    monkeypatch.setattr(bench.lag, "run_lag", run_lag)
    bench.compare.ours(1000, 4, 64, 12, 1000, 10.0)
    return measured


def test_figures_measured_as_asked_are_taken_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    assert measured_again(monkeypatch, E2E, LAG) == []


@pytest.mark.parametrize(
    ("e2e", "lag"),
    [
        (E2E | {"concurrency": 8}, LAG),
        (E2E | {"partitions": 2}, LAG),
        (E2E | {"scanners": 2}, LAG),
        (E2E | {"relays": 2}, LAG),
    ],
    ids=["concurrency", "partitions", "scanners", "relays"],
)
def test_an_e2e_run_of_another_setup_is_measured_again(
    monkeypatch: pytest.MonkeyPatch, e2e: dict[str, Any], lag: dict[str, Any]
) -> None:
    assert measured_again(monkeypatch, e2e, lag) == ["e2e"]


@pytest.mark.parametrize(
    "lag",
    [
        LAG | {"concurrency": 8},
        LAG | {"partitions": 2},
        LAG | {"pg_options": "-c jit=off"},
    ],
    ids=["concurrency", "partitions", "pg_options"],
)
def test_a_lag_run_of_another_setup_is_measured_again(
    monkeypatch: pytest.MonkeyPatch, lag: dict[str, Any]
) -> None:
    assert measured_again(monkeypatch, E2E, lag) == ["lag"]
