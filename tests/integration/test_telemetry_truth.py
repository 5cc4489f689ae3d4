"""Metrics compared with what PostgreSQL holds: a counter says what really happened."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from scheduler.config import Settings
from scheduler.kafka.transport import Received, TopicAdmin
from scheduler.reconcile import metrics as reconcile_metrics
from scheduler.reconcile.reconciler import Reconciler
from scheduler.scan import metrics as scan_metrics
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, schedules
from scheduler.wiring import Wiring

pytestmark = pytest.mark.integration


@pytest.fixture
def app(settings: Settings) -> str:
    with connect(settings.database_url) as conn:
        service.create_app(conn, TopicAdmin(settings.kafka_bootstrap), settings, "truth", 1, "test")
    return "truth"


def scheduled(kind: str) -> float:
    labels = {"app": "truth", "kind": kind}
    return scan_metrics.REGISTRY.get_sample_value("job_scheduled_total", labels) or 0.0


def fire_lags() -> float:
    return scan_metrics.REGISTRY.get_sample_value("scheduler_scanner_fire_lag_seconds_count") or 0.0


def test_a_fire_created_before_is_not_counted_again_as_scheduled(settings: Settings, app: str) -> None:
    """An update between a fire's look-ahead lease and its instant puts next_fire_at back on that
    fire; the scanner plans it again and UNIQUE (schedule_id, scheduled_for) drops it. The counter
    said one run more than the runs table for each such update."""
    spec = ScheduleSpec(app="truth", handler="builtin:noop", kind="cron", cron="*/5 * * * * *")
    with connect(settings.database_url) as conn:
        row = service.create_schedule(conn, spec, "test")
    first = row["next_fire_at"]
    scanner = Wiring(replace(settings, lookahead_s=1.0)).scanner()
    before, lags_before = scheduled("cron"), fire_lags()
    with connect(settings.database_url) as conn:
        scanner.scan_once(conn, now=first - timedelta(milliseconds=900))
        # What an update does to a schedule leased ahead: its next fire is that fire again.
        conn.execute("update schedules set next_fire_at = %s where id = %s", (first, row["id"]))
        scanner.scan_once(conn, now=first - timedelta(milliseconds=500))
        runs: list[Any] = conn.execute(
            "select scheduled_for from runs where schedule_id = %s", (row["id"],)
        ).fetchall()
        after = schedules.get_schedule(conn, row["id"])
    assert [r["scheduled_for"] for r in runs] == [first]
    assert after is not None and after["next_fire_at"] == first + timedelta(seconds=5)
    assert scheduled("cron") - before == 1
    assert fire_lags() - lags_before == 1


def test_an_undecodable_outcome_read_again_after_a_failed_batch_is_counted_once(settings: Settings) -> None:
    """A batch whose transaction fails (PostgreSQL gone) is read again from the committed offsets:
    its poison message is quarantined once, and scheduler_reconciler_undecodable_total said two."""
    reconciler: Reconciler = Wiring(settings).reconciler_service()
    poison = Received(settings.results_topic, 0, 7, b"\xc3\x01 not an avro record at all")
    before = reconcile_metrics.UNDECODABLE._value.get()
    broken = connect(settings.database_url)
    broken.close()
    with pytest.raises(psycopg.OperationalError):
        reconciler.apply(broken, [poison])
    with connect(settings.database_url) as conn:
        reconciler.apply(conn, [poison])
        kept = conn.execute("select count(*) as n from quarantine where component = 'reconciler'").fetchone()
    assert kept is not None and kept["n"] == 1
    assert reconcile_metrics.UNDECODABLE._value.get() - before == 1
