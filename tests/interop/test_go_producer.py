"""A Go program that knows only the README's wire format produces commands the ingestor applies.

``tests/interop/go`` hand-encodes Avro and CRC-64-AVRO with Go's standard library (no Avro library,
no module downloads); this test builds it, produces its bytes with a plain Kafka producer, and checks
what the ingestor (a real process) made of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as RawProducer

from scheduler.config import Settings
from scheduler.kafka.avro import default_schemas_dir
from scheduler.store import connect
from tests.support import SCHEDULER, components, wait_for

pytestmark = pytest.mark.e2e

GO_PROGRAM = Path(__file__).resolve().parent / "go"
APP = "interop"
CRON_SCHEDULES = 50


def go_binary() -> str:
    found = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )
    assert found, "the Go toolchain (`go`) is needed for the interoperability test"
    return found


def build(tmp_path: Path) -> Path:
    binary = tmp_path / "producer"
    env = dict(os.environ) | {
        "GOTOOLCHAIN": "local",
        "GOPROXY": "off",
        "GOFLAGS": "-mod=mod",
        "CGO_ENABLED": "0",
    }
    if "HOME" not in env and "GOCACHE" not in env:
        env["GOCACHE"] = str(tmp_path / "gocache")
    done = subprocess.run(
        [go_binary(), "build", "-o", str(binary), "."],
        cwd=GO_PROGRAM,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return binary


def keyed(settings: Settings) -> dict[str, dict[str, Any]]:
    with connect(settings.database_url) as conn:
        rows = conn.execute(
            "select k.schedule_key, s.* from schedule_keys k join schedules s on s.id = k.schedule_id"
        ).fetchall()
    return {str(row["schedule_key"]): row for row in rows}


def test_commands_encoded_in_go_from_the_readme_are_applied(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    binary = build(tmp_path)
    produced = subprocess.run(
        [str(binary), "-schema", str(default_schemas_dir() / "ScheduleCommand.avsc"), "-app", APP,
         "-n", str(CRON_SCHEDULES)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    messages = [line.split("\t") for line in produced.stdout.splitlines()]
    assert len(messages) == CRON_SCHEDULES + 5

    for args in (["init"], ["apps", "create", APP, "--partitions", "3"]):
        done = subprocess.run([SCHEDULER, *args], env=settings_env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    producer = RawProducer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    for key, value in messages:
        producer.produce(settings.schedules_topic, bytes.fromhex(value), key=bytes.fromhex(key))
    assert producer.flush(30) == 0

    with components(settings_env, tmp_path, "ingestor"):
        found = wait_for(
            lambda: (
                k
                if len(k := keyed(settings)) == CRON_SCHEDULES + 2 and k["go-cron-1"]["version"] == 2
                else None
            ),
            120,
            "every schedule the Go program created, and its update applied",
        )
        wait_for(
            lambda: keyed(settings)["go-cron-0"]["state"] == "paused", 60, "the pause of go-cron-0 applied"
        )
        with connect(settings.database_url) as conn:
            wait_for(
                lambda: (
                    conn.execute("select sum(duplicates) as n from applied_commands").fetchone() == {"n": 1}
                ),
                60,
                "the resent create counted as a duplicate",
            )
            rejected = conn.execute("select code, reason from ingest_rejections").fetchall()
    assert rejected == []
    assert found is not None

    cron7 = found["go-cron-7"]
    assert (cron7["name"], cron7["kind"], cron7["cron"], cron7["tz"], cron7["handler"]) == (
        "go-cron-7", "cron", "7 4 * * *", "America/New_York", "builtin:noop",
    )  # fmt: skip
    assert cron7["payload"] == {"i": 7, "from": "go"}
    assert (cron7["max_attempts"], cron7["timeout_ms"], cron7["misfire_policy"], cron7["overlap_policy"]) == (
        3, 120_000, "skip", "buffer_one",
    )  # fmt: skip
    delayed = found["go-delayed"]
    assert delayed["name"] == "Zeitplan für Grüße ✓" and delayed["kind"] == "delayed"
    assert delayed["run_at"] == datetime(2030, 6, 1, 12, 34, 56, 789012, tzinfo=UTC)
    assert delayed["handler"] == "builtin:sleep" and delayed["payload"] == {"seconds": 1}
    bounded = found["go-bounded"]
    assert (bounded["start_at"], bounded["end_at"]) == (
        datetime(2029, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    assert (
        datetime(2029, 1, 1, tzinfo=UTC) <= bounded["next_fire_at"] <= datetime(2029, 1, 1, 0, 5, tzinfo=UTC)
    )
    updated = found["go-cron-1"]
    assert (updated["name"], updated["cron"], updated["tz"], updated["payload"]) == (
        "renamed by go", "45 23 * * *", "Asia/Kolkata", {"updated": True},
    )  # fmt: skip
    with connect(settings.database_url) as conn:
        actors = {r["actor"] for r in conn.execute("select actor from audit_log").fetchall()}
    assert "go-producer (command go-update-1)" in actors and "go-producer (command go-pause-0)" in actors
