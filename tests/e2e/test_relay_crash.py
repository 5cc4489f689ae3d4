"""A relay killed with SIGKILL in the middle of its work loses nothing: every run reaches Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobMessage
from scheduler.store import connect
from scheduler.wiring import Wiring
from tests.e2e.test_fire_on_time import create_app, dispatched_count
from tests.support import Component, components, read_topic, wait_for

pytestmark = pytest.mark.e2e

RUNS = 20_000


def test_relay_killed_mid_batch_then_restarted_delivers_every_run(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    create_app(settings)
    with connect(settings.database_url) as conn:
        # Bulk-create due immediate schedules (SQL, for speed), then let the scanner fill the outbox.
        conn.execute(
            "insert into schedules (id, app, name, kind, handler, next_fire_at) "
            "select gen_random_uuid(), 'fire', 'n' || g, 'immediate', 'builtin:noop', now() "
            "from generate_series(1, %s) g",
            (RUNS,),
        )
        conn.commit()
        scanner = Wiring(settings).scanner()
        while scanner.scan_once(conn).schedules:
            pass
        assert conn.execute("select count(*) as n from outbox").fetchone() == {"n": RUNS}

    # Small batches and a short claim, so that a kill lands inside a batch and recovery is quick.
    env = settings_env | {"SCHEDULER_RELAY_BATCH_SIZE": "250", "SCHEDULER_RELAY_CLAIM_SECONDS": "3"}
    victim = Component("relay", env, tmp_path)
    try:
        wait_for(lambda: dispatched_count(settings) >= RUNS // 4, 120, "the relay to be well under way")
    finally:
        victim.kill()
    at_kill = dispatched_count(settings)
    assert at_kill < RUNS, "the relay finished before it could be killed"

    with components(env, tmp_path, "relay"):
        wait_for(lambda: dispatched_count(settings) == RUNS, 120, "every run dispatched after the restart")

    with connect(settings.database_url) as conn:
        assert conn.execute("select count(*) as n from outbox").fetchone() == {"n": 0}
        run_ids = {r["id"] for r in conn.execute("select id from runs").fetchall()}
    codec = AvroCodec()
    published = [
        codec.decode(JobMessage, v).run_id
        for _, v, _ in read_topic(settings.kafka_bootstrap, settings.jobs_topic("fire"))
    ]
    assert set(published) == run_ids, "every run is on the topic"
    duplicates = len(published) - len(set(published))
    print(
        f"\nrelay kill -9 after {at_kill} of {RUNS} dispatched: {duplicates} duplicate messages on the topic"
    )
    # A kill can only duplicate what was in flight: at most one batch.
    assert duplicates <= 250
