"""The lease sweeper sweeps nothing until Kafka has answered without a break for longer than a lease
window: workers cut off from Kafka still hold their heartbeats in their producers."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.reconcile import lease_sweeper
from scheduler.reconcile.lease_sweeper import LeaseSweeper
from scheduler.runtime.service import Check
from scheduler.store.database import Database


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sweeps_wait_for_kafka_to_have_answered_longer_than_a_lease_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr("scheduler.reconcile.lease_sweeper.time.monotonic", clock)
    kafka_up = True

    def probe() -> str | None:
        if not kafka_up:
            raise ConnectionError("1/1 brokers are down")
        return None

    positions: Any = None  # never reached: no sweep happens in this test
    sweeper = LeaseSweeper(
        Database("postgresql://nobody@127.0.0.1:1/none", "test"),
        positions,
        positions,
        positions,
        Check("kafka", probe),
        "p.dlq",
        lease_window_s=30,
    )
    assert sweeper.settle_s == 30 + lease_sweeper.KAFKA_SETTLE_GRACE_S
    assert sweeper._kafka_unsettled() == (  # just started
        "Kafka has answered for 0 s only; workers' heartbeats may be queued"
    )
    clock.now += sweeper.settle_s + 1
    assert sweeper._kafka_unsettled() is None
    kafka_up = False
    clock.now += 1
    assert sweeper._kafka_unsettled() is not None
    kafka_up = True
    clock.now += 1
    assert sweeper._kafka_unsettled() is not None
    clock.now += sweeper.settle_s - 2
    assert sweeper._kafka_unsettled() is not None
    clock.now += 3
    assert sweeper._kafka_unsettled() is None
