"""While Kafka is down the relay backs off and retries; nothing in the outbox is lost.

The outage is real: a second single-node Kafka of the test's own is stopped and started again
under a running relay."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.chaos_stack import free_port
from scheduler.config import Settings, load_settings
from scheduler.devstack.kafka import LocalKafka
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobMessage
from scheduler.kafka.transport import TopicAdmin
from scheduler.store import connect
from scheduler.wiring import Wiring
from tests.e2e.test_fire_on_time import PUBLISHED
from tests.support import Component, read_topic, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[LocalKafka]:
    stack_dir = tmp_path / "stack"
    stack_dir.mkdir()
    shared_jars = load_settings().stack_dir / "kafka-libs"
    if shared_jars.exists():
        (stack_dir / "kafka-libs").symlink_to(shared_jars)
    kafka = LocalKafka(stack_dir, free_port(), free_port())
    kafka.up(kafka.preflight())
    try:
        yield kafka
    finally:
        kafka.down()


def schedule_due_runs(settings: Settings, count: int) -> None:
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values ('out', 3) on conflict do nothing")
        conn.execute(
            "insert into schedules (id, app, name, kind, handler, next_fire_at) "
            "select gen_random_uuid(), 'out', 'n' || g, 'immediate', 'builtin:noop', now() "
            "from generate_series(1, %s) g",
            (count,),
        )
        conn.commit()
        while Wiring(settings).scanner().scan_once(conn).schedules:
            pass


def counts(settings: Settings) -> dict[str, int]:
    with connect(settings.database_url) as conn:
        row: dict[str, Any] | None = conn.execute(
            f"select (select count(*) from runs where {PUBLISHED}) as dispatched, "
            "(select count(*) from outbox) as outbox"
        ).fetchone()
    assert row is not None
    return {"dispatched": int(row["dispatched"]), "outbox": int(row["outbox"])}


def test_relay_rides_out_a_kafka_outage_without_losing_a_row(
    settings: Settings, settings_env: dict[str, str], own_kafka: LocalKafka, tmp_path: Path
) -> None:
    settings = load_settings(settings_env | {"SCHEDULER_KAFKA_BOOTSTRAP": own_kafka.bootstrap})
    TopicAdmin(own_kafka.bootstrap).ensure_topics([settings.jobs_topic("out")], partitions=3)
    env = settings_env | {
        "SCHEDULER_KAFKA_BOOTSTRAP": own_kafka.bootstrap,
        "SCHEDULER_RELAY_CLAIM_SECONDS": "4",
    }
    relay = Component("relay", env, tmp_path)
    try:
        schedule_due_runs(settings, 100)
        wait_for(lambda: counts(settings)["dispatched"] == 100, 60, "the first 100 runs dispatched")

        own_kafka.down()
        schedule_due_runs(settings, 200)
        wait_for(
            lambda: "retrying" in relay.output() or "Retrying" in relay.output(), 60, "the relay to back off"
        )
        assert counts(settings) == {"dispatched": 100, "outbox": 200}, (
            "nothing marked sent while Kafka is down"
        )

        own_kafka.up(own_kafka.preflight())
        wait_for(lambda: counts(settings) == {"dispatched": 300, "outbox": 0}, 120, "every run dispatched")
    finally:
        code = relay.stop()
    assert code == 0, relay.output()[-3000:]

    codec = AvroCodec()
    published = {
        codec.decode(JobMessage, v).run_id
        for _, v, _ in read_topic(own_kafka.bootstrap, settings.jobs_topic("out"))
    }
    with connect(settings.database_url) as conn:
        assert published == {r["id"] for r in conn.execute("select id from runs").fetchall()}
