"""The ingestor's batch step against the real PostgreSQL: what a batch of commands does to schedules.

The batches are built here (no Kafka), so each test states exactly which messages arrive in which
order; the Kafka loop around this step is tested in test_ingest_kafka.py and the e2e tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from scheduler.config import Settings
from scheduler.domain.cron import CronSchedule
from scheduler.ingest.apply import BatchResult, RecordedRejection, apply_batch
from scheduler.ingest.commands import Consumed, decode_command
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import ScheduleCommand, ScheduleOperation, ScheduleSpec
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec as CliSpec
from scheduler.store import connect, schedules
from scheduler.store.ingest import Source

pytestmark = pytest.mark.integration

CODEC = AvroCodec()
APP = "billing"
Row = dict[str, Any]


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection[Row]]:
    with connect(settings.database_url) as conn:
        schedules.create_app(conn, APP, 3)
        conn.commit()
        yield conn


class Topic:
    """Hands out increasing offsets, as one partition of the commands topic would, and message
    timestamps after those of every topic made before (a recreated topic's messages are newer)."""

    clock_ms = 1_800_000_000_000

    def __init__(self, settings: Settings) -> None:
        self.name = settings.schedules_topic
        self.offset = 0

    def message(self, value: bytes | ScheduleCommand) -> Consumed:
        data = CODEC.encode(value) if isinstance(value, ScheduleCommand) else value
        self.offset += 1
        Topic.clock_ms += 1
        return Consumed(Source(self.name, 0, self.offset), data, timestamp_ms=Topic.clock_ms)


@pytest.fixture
def topic(settings: Settings) -> Topic:
    return Topic(settings)


def spec(**fields: Any) -> ScheduleSpec:
    values: dict[str, Any] = {"name": "", "kind": "cron", "cron": "0 3 * * *", "handler": "builtin:noop"}
    return ScheduleSpec(**(values | fields))


def command(cid: str, key: str, operation: ScheduleOperation = "create", **fields: Any) -> ScheduleCommand:
    if operation in ("create", "update"):
        fields.setdefault("spec", spec())
    return ScheduleCommand(
        command_id=cid, schedule_key=key, app=fields.pop("app", APP), operation=operation, **fields
    )


def ingest(
    conn: psycopg.Connection[Row],
    settings: Settings,
    batch: list[Consumed],
    published: list[RecordedRejection] | None = None,
) -> BatchResult:
    decoded = [decode_command(CODEC, item) for item in batch]
    return apply_batch(conn, settings, decoded, before_commit=None if published is None else published.extend)


def by_key(conn: psycopg.Connection[Row], key: str) -> Row:
    row = conn.execute(
        "select s.* from schedules s join schedule_keys k on k.schedule_id = s.id "
        "where k.app = %s and k.schedule_key = %s",
        (APP, key),
    ).fetchone()
    assert row is not None, f"no schedule for key {key}"
    return row


def audit_of(conn: psycopg.Connection[Row], schedule_id: Any) -> list[Row]:
    return conn.execute(
        "select actor, action, old_value, new_value from audit_log where entity_id = %s order by id",
        (str(schedule_id),),
    ).fetchall()


def codes(result: BatchResult) -> list[tuple[str, str | None]]:
    return [(r.rejection.code, r.rejection.command_id) for r in result.rejected]


def test_a_batch_of_creates_becomes_schedules_with_keys_and_audit_rows(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    batch = [
        topic.message(command(f"c{i}", f"nightly-{i}", spec=spec(cron=f"{i} 2 * * *", tz="Europe/Berlin")))
        for i in range(50)
    ]
    batch.append(
        topic.message(
            command(
                "c-delayed",
                "once",
                actor="billing-service",
                spec=spec(
                    name="one shot",
                    kind="delayed",
                    cron=None,
                    run_at=datetime(2031, 1, 1, tzinfo=UTC),
                    payload='{"invoice": 42}',
                    max_attempts=5,
                    timeout_seconds=60,
                ),
            )
        )
    )
    result = ingest(conn, settings, batch)
    assert (result.applied, result.duplicates, result.rejected) == (51, 0, [])

    nightly = by_key(conn, "nightly-7")
    assert nightly["name"] == "nightly-7", "a schedule without a name is named after its key"
    assert (nightly["kind"], nightly["cron"], nightly["tz"], nightly["state"], nightly["version"]) == (
        "cron",
        "7 2 * * *",
        "Europe/Berlin",
        "active",
        1,
    )
    assert nightly["next_fire_at"].astimezone(UTC).minute == 7
    once = by_key(conn, "once")
    assert (once["name"], once["kind"], once["payload"], once["max_attempts"], once["timeout_ms"]) == (
        "one shot",
        "delayed",
        {"invoice": 42},
        5,
        60_000,
    )
    assert once["next_fire_at"] == datetime(2031, 1, 1, tzinfo=UTC)
    [audit] = audit_of(conn, once["id"])
    assert audit["action"] == "create" and audit["new_value"]["name"] == "one shot"
    assert audit["actor"] == "billing-service (command c-delayed)"
    assert conn.execute("select count(*) as n from applied_commands").fetchone() == {"n": 51}


def test_the_same_command_id_is_applied_once_and_its_copies_are_counted(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    create = command("same", "k1")
    first = ingest(conn, settings, [topic.message(create), topic.message(create)])
    again = ingest(conn, settings, [topic.message(create)])
    assert (first.applied, first.duplicates, again.applied, again.duplicates) == (1, 1, 0, 1)
    assert first.rejected == [] and again.rejected == [], "a replayed command is ignored, not rejected"
    assert conn.execute("select count(*) as n from schedules").fetchone() == {"n": 1}
    row = conn.execute("select duplicates from applied_commands where command_id = 'same'").fetchone()
    assert row == {"duplicates": 2}


def test_a_create_of_an_existing_key_is_a_conflict(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    ingest(conn, settings, [topic.message(command("a", "k"))])
    published: list[RecordedRejection] = []
    result = ingest(
        conn,
        settings,
        [
            topic.message(command("b", "k")),
            topic.message(command("c", "k2")),
            topic.message(command("d", "k2")),
        ],
        published,
    )
    assert result.applied == 1
    assert codes(result) == [("conflict", "b"), ("conflict", "d")]
    assert "schedule key 'k' already exists in app 'billing'" in result.rejected[0].rejection.reason
    assert published == result.rejected, "rejections are handed over for publishing before the commit"
    assert conn.execute("select count(*) as n from schedules").fetchone() == {"n": 2}


def test_state_changes_by_key_follow_the_batch_order(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    result = ingest(
        conn,
        settings,
        [
            topic.message(command("1", "k")),
            topic.message(command("2", "k", "pause")),
            topic.message(command("3", "k", "resume")),
            topic.message(command("4", "k", "pause")),
            topic.message(command("5", "other")),
            topic.message(command("6", "other", "cancel")),
            topic.message(command("7", "other", "resume")),
        ],
    )
    assert result.applied == 6 and codes(result) == [("conflict", "7")]
    assert "cannot resume" in result.rejected[0].rejection.reason
    paused = by_key(conn, "k")
    assert (paused["state"], paused["version"]) == ("paused", 4)
    assert [a["action"] for a in audit_of(conn, paused["id"])] == ["create", "pause", "resume", "pause"]
    assert by_key(conn, "other")["state"] == "cancelled"
    assert conn.execute("select count(*) as n from applied_commands").fetchone() == {"n": 6}


def test_trigger_by_key_creates_a_run_with_its_job_in_the_outbox(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    result = ingest(
        conn, settings, [topic.message(command("1", "k")), topic.message(command("2", "k", "trigger"))]
    )
    assert result.applied == 2
    schedule = by_key(conn, "k")
    [run] = conn.execute("select * from runs where schedule_id = %s", (schedule["id"],)).fetchall()
    assert run["state"] == "pending"
    [job] = conn.execute("select topic from outbox where run_id = %s", (run["id"],)).fetchall()
    assert job["topic"] == settings.jobs_topic(APP)


def test_update_replaces_the_spec_with_a_new_version_and_an_audit_row(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    ingest(
        conn, settings, [topic.message(command("1", "k", spec=spec(cron="0 3 * * *", payload='{"v": 1}')))]
    )
    before = by_key(conn, "k")
    result = ingest(
        conn,
        settings,
        [
            topic.message(
                command(
                    "2",
                    "k",
                    "update",
                    expected_version=1,
                    spec=spec(
                        name="renamed", cron="15 4 * * *", tz="Asia/Tokyo", payload='{"v": 2}', max_attempts=7
                    ),
                )
            ),
            topic.message(command("3", "k", "update", expected_version=1)),
        ],
    )
    assert result.applied == 1 and codes(result) == [("conflict", "3")]
    assert "is at version 2, not 1" in result.rejected[0].rejection.reason
    after = by_key(conn, "k")
    assert (
        after["name"],
        after["cron"],
        after["tz"],
        after["payload"],
        after["max_attempts"],
        after["version"],
    ) == (
        "renamed",
        "15 4 * * *",
        "Asia/Tokyo",
        {"v": 2},
        7,
        2,
    )
    assert after["next_fire_at"].astimezone(UTC).strftime("%H:%M") == "19:15", "04:15 in Tokyo"
    update = audit_of(conn, after["id"])[-1]
    assert update["action"] == "update"
    assert (update["old_value"]["cron"], update["new_value"]["cron"]) == (before["cron"], "15 4 * * *")


def test_commands_that_name_no_schedule_or_no_app_are_rejected(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    result = ingest(
        conn,
        settings,
        [
            topic.message(command("1", "missing", "pause")),
            topic.message(command("2", "missing", "update")),
            topic.message(command("3", "k", app="nosuchapp")),
            topic.message(command("4", "k", "cancel")),  # the create before it was rejected
        ],
    )
    assert codes(result) == [("not_found", "1"), ("not_found", "2"), ("invalid", "3"), ("not_found", "4")]
    assert "unknown app 'nosuchapp'" in result.rejected[2].rejection.reason
    assert conn.execute("select count(*) as n from applied_commands").fetchone() == {"n": 0}


def test_a_rejected_command_sent_again_later_is_judged_again(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    pause = command("p", "k", "pause")
    assert codes(ingest(conn, settings, [topic.message(pause)])) == [("not_found", "p")]
    ingest(conn, settings, [topic.message(command("c", "k"))])
    assert ingest(conn, settings, [topic.message(pause)]).applied == 1
    assert by_key(conn, "k")["state"] == "paused"


@pytest.mark.parametrize(
    ("bad", "code", "reason"),
    [
        (b"\x01\x02 not avro", "undecodable", "unknown framing"),
        (b"\xc3\x01" + bytes(8) + b"\x02", "undecodable", "unknown schema fingerprint 0000000000000000"),
        (b"\x00\x00\x00\x00\x07\x02", "undecodable", "no schema registry is configured"),
        ("truncated", "undecodable", "corrupt or truncated ScheduleCommand"),
        (command("x", "k", spec=spec(cron="61 * * * *")), "invalid", "61"),
        (command("x", "k", spec=spec(tz="Mars/Olympus")), "invalid", "Mars/Olympus"),
        (command("x", "k", spec=spec(payload="{not json")), "invalid", "payload is not JSON"),
        (command("x", "k", spec=spec(payload=json.dumps({"blob": "x" * (1024 * 1024)}))), "invalid", "1 MiB"),
        (command("x", "k", spec=spec(handler="os:system; rm")), "invalid", "handler"),
        (command("x", "k", spec=spec(kind="delayed", cron=None)), "invalid", "run_at"),
        (command("x", "k", spec=spec(timeout_seconds=0)), "invalid", "timeout_seconds"),
        (command("x", "k", spec=None), "invalid", "the create command needs a spec"),
        (command("x", "k", "pause", spec=spec()), "invalid", "takes no spec"),
        (command("", "k"), "invalid", "command_id must be 1 to 200 characters"),
        (command("x", "k" * 201), "invalid", "schedule_key must be 1 to 200 characters"),
        (command("x", "k", app="Not An App"), "invalid", "app name"),
        (command("x\x00y", "k"), "invalid", "command_id contains a NUL character"),
        (command("x", "k", actor="\x00"), "invalid", "actor contains a NUL character"),
        (command("x", "k", actor="a" * 201), "invalid", "actor must be at most 200 characters, got 201"),
    ],
)
def test_every_kind_of_bad_message_is_rejected_with_a_clear_reason(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic, bad: Any, code: str, reason: str
) -> None:
    if bad == "truncated":
        bad = CODEC.encode(command("x", "k"))[:-3]
    message = topic.message(bad)
    result = ingest(conn, settings, [message, topic.message(command("good", "fine"))])
    assert result.applied == 1, "a bad message never holds up the good ones"
    [recorded] = result.rejected
    assert recorded.rejection.code == code
    assert reason in recorded.rejection.reason
    assert recorded.rejection.original_bytes == message.value and recorded.rejection.source == message.source
    [row] = conn.execute(
        "select code, reason, original_bytes, source_offset from ingest_rejections"
    ).fetchall()
    assert (row["code"], row["reason"], bytes(row["original_bytes"]), row["source_offset"]) == (
        code,
        recorded.rejection.reason,
        message.value,
        message.source.offset,
    )


def test_a_create_that_passes_validation_but_not_a_constraint_is_rejected_alone(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    # A rule of the database that validation does not know (this test's database only).
    conn.execute("alter table schedules add constraint no_forbidden_names check (name <> 'forbidden')")
    conn.commit()
    result = ingest(
        conn,
        settings,
        [
            topic.message(command("1", "a")),
            topic.message(command("2", "b", spec=spec(name="forbidden"))),
            topic.message(command("3", "c")),
        ],
    )
    assert result.applied == 2 and codes(result) == [("invalid", "2")]
    assert "check constraint" in result.rejected[0].rejection.reason
    keys = {r["schedule_key"] for r in conn.execute("select schedule_key from schedule_keys").fetchall()}
    assert keys == {"a", "c"}


def test_a_cron_expression_longer_than_the_database_holds_is_rejected_alone(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    # A valid cron expression longer than the 200 characters the column allows.
    long_cron = f"{','.join(str(m) for m in range(60))} {','.join(str(h) for h in range(24))} * * *"
    assert len(long_cron) > 200
    result = ingest(
        conn,
        settings,
        [topic.message(command("1", "a")), topic.message(command("2", "b", spec=spec(cron=long_cron)))],
    )
    assert result.applied == 1 and codes(result) == [("invalid", "2")]
    assert "at most 200 characters" in result.rejected[0].rejection.reason


def test_a_replayed_batch_applies_and_rejects_nothing_twice(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    batch = [
        topic.message(command("1", "k")),
        topic.message(b"garbage"),
        topic.message(command("2", "k", "pause")),
    ]
    published: list[RecordedRejection] = []
    first = ingest(conn, settings, batch, published)
    replay = ingest(conn, settings, batch, published)
    assert (first.applied, len(first.rejected)) == (2, 1)
    assert (replay.applied, replay.duplicates, replay.replayed, replay.rejected) == (0, 2, 1, [])
    assert len(published) == 1
    assert conn.execute("select count(*) as n from ingest_rejections").fetchone() == {"n": 1}


def test_nothing_of_a_batch_is_committed_when_publishing_its_rejections_fails(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    def kafka_down(_rejected: list[RecordedRejection]) -> None:
        raise RuntimeError("Kafka is down")

    batch = [topic.message(command("1", "k")), topic.message(b"garbage")]
    decoded = [decode_command(CODEC, item) for item in batch]
    with pytest.raises(RuntimeError, match="Kafka is down"):
        apply_batch(conn, settings, decoded, before_commit=kafka_down)
    for table in ("schedules", "schedule_keys", "applied_commands", "ingest_rejections"):
        query = sql.SQL("select count(*) as n from {}").format(sql.Identifier(table))
        assert conn.execute(query).fetchone() == {"n": 0}
    result = ingest(conn, settings, batch)
    assert (result.applied, len(result.rejected)) == (1, 1), "the batch applies when it is read again"


def test_a_cron_schedule_that_never_fires_is_rejected(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    past = datetime.now(UTC) - timedelta(days=1)
    result = ingest(conn, settings, [topic.message(command("1", "k", spec=spec(end_at=past)))])
    assert codes(result) == [("invalid", "1")]
    assert "never fires" in result.rejected[0].rejection.reason


def test_retry_backoff_and_jitter_travel_in_commands_and_are_validated(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    tuned = spec(backoff_base_ms=250, backoff_max_ms=10_000, jitter_ms=5_000)
    result = ingest(
        conn,
        settings,
        [
            topic.message(command("1", "k", spec=tuned)),
            topic.message(command("2", "k", "update", spec=spec(backoff_base_ms=0, backoff_max_ms=0))),
            topic.message(command("3", "bad-order", spec=spec(backoff_base_ms=10, backoff_max_ms=5))),
            topic.message(command("4", "bad-jitter", spec=spec(jitter_ms=-1))),
        ],
    )
    assert result.applied == 2
    assert [(code, reason.split(",")[0]) for code, reason in reasons(result)] == [
        ("invalid", "backoff must satisfy 0 <= base <= max <= 24 h"),
        ("invalid", "jitter must be 0 to 24 h"),
    ]
    row = by_key(conn, "k")
    assert (row["backoff_base_ms"], row["backoff_max_ms"], row["jitter_ms"], row["version"]) == (0, 0, 0, 2)
    [created] = [a for a in audit_of(conn, row["id"]) if a["action"] == "create"]
    assert (created["new_value"]["backoff_base_ms"], created["new_value"]["jitter_ms"]) == (250, 5_000)


def reasons(result: BatchResult) -> list[tuple[str, str]]:
    return [(r.rejection.code, r.rejection.reason) for r in result.rejected]


def test_an_app_that_declares_its_handlers_refuses_commands_naming_others(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    schedules.set_app_handlers(conn, APP, ["builtin:noop", "billing.jobs"])
    conn.commit()
    result = ingest(
        conn,
        settings,
        [
            topic.message(command("1", "ok", spec=spec(handler="billing.jobs:invoice"))),
            topic.message(command("2", "exit", spec=spec(handler="sys:exit"))),
            topic.message(
                command(
                    "3", "http", spec=spec(handler="builtin:http", payload='{"url": "https://example.test"}')
                )
            ),
            topic.message(command("4", "ok", "update", spec=spec(handler="os:system"))),
            topic.message(command("5", "ok", "update", spec=spec(handler="builtin:noop"))),
        ],
    )
    assert result.applied == 2
    assert [(code, reason.split(" (")[0]) for code, reason in reasons(result)] == [
        ("invalid", "handler 'sys:exit' is not declared by app 'billing'"),
        ("invalid", "handler 'builtin:http' is not declared by app 'billing'"),
        ("invalid", "handler 'os:system' is not declared by app 'billing'"),
    ]
    assert by_key(conn, "ok")["handler"] == "builtin:noop"


def test_an_update_command_fixes_a_schedule_in_error(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    ingest(conn, settings, [topic.message(command("1", "k", spec=spec(tz="Europe/Berlin")))])
    conn.execute(
        "update schedules set state = 'error', error = 'UnknownTimeZone: gone', errored_at = now(), "
        "tz = 'Mars/Olympus'"
    )
    conn.commit()
    refused = ingest(conn, settings, [topic.message(command("2", "k", "resume"))])
    assert reasons(refused)[0][0] == "conflict" and "still cannot be computed" in reasons(refused)[0][1]
    result = ingest(conn, settings, [topic.message(command("3", "k", "update", spec=spec(tz="Asia/Tokyo")))])
    assert result.applied == 1
    row = by_key(conn, "k")
    assert (row["state"], row["error"], row["errored_at"], row["tz"]) == ("active", None, None, "Asia/Tokyo")


def test_a_create_with_jenkins_h_fires_at_the_minute_its_own_id_hashes_to(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    batch = [topic.message(command(f"h{i}", f"spread-{i}", spec=spec(cron="H H * * *"))) for i in range(20)]
    result = ingest(conn, settings, batch)
    assert codes(result) == []
    fires = set()
    for i in range(20):
        row = by_key(conn, f"spread-{i}")
        expected = CronSchedule.of("H H * * *", "UTC", schedule_id=row["id"]).next_fire_after(
            row["created_at"]
        )
        assert row["next_fire_at"] == expected
        fires.add((expected.hour, expected.minute))
    assert len(fires) > 1, "H spreads schedules over the day by their ids"


def test_a_command_reaches_a_schedule_the_cli_created_by_its_id_as_key(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    created = service.create_schedule(
        conn, CliSpec(app=APP, kind="cron", cron="0 3 * * *", handler="builtin:noop"), "cli:someone"
    )
    assert created["schedule_key"] == str(created["id"])
    result = ingest(conn, settings, [topic.message(command("p1", str(created["id"]), "pause"))])
    assert codes(result) == []
    assert by_key(conn, str(created["id"]))["state"] == "paused"


def test_an_empty_time_zone_is_utc_as_over_the_api(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    result = ingest(conn, settings, [topic.message(command("tz", "no-zone", spec=spec(tz="")))])
    assert result.applied == 1 and not result.rejected
    assert by_key(conn, "no-zone")["tz"] == "UTC"


@pytest.mark.parametrize("field", ["run_at", "end_at"])
def test_a_time_beyond_year_9999_is_an_invalid_command_with_its_id(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic, field: str
) -> None:
    # Avro's timestamp-micros reaches year 294,000; the command must still be named by its id, so its
    # producer can tell which one failed, and the batch goes on.
    kind = {"run_at": {"kind": "delayed", "cron": None, "run_at": datetime(2030, 1, 1, tzinfo=UTC)}}
    record = command("far-future", "far", spec=spec(**kind.get(field, {}))).to_avro()
    record["spec"][field] = 2**62
    far = topic.message(CODEC.encode_record(ScheduleCommand.SCHEMA, record))
    result = ingest(conn, settings, [far, topic.message(command("good", "fine"))])
    assert result.applied == 1
    [recorded] = result.rejected
    assert (recorded.rejection.code, recorded.rejection.command_id) == ("invalid", "far-future")
    assert (recorded.rejection.schedule_key, recorded.rejection.app) == ("far", APP)
    assert recorded.rejection.operation == "create"
    assert recorded.rejection.reason == f"spec.{field} must be between the years 1 and 9999"


def test_a_create_command_is_held_to_the_key_rule_of_the_cli_and_the_api(
    conn: psycopg.Connection[Row], settings: Settings, topic: Topic
) -> None:
    # A key a CLI user could not type back (a tab, a trailing blank, a line break) is refused as it
    # is over the API; the batch goes on, and a key in another script is a key like any other.
    bad = ["tab\tkey", "trailing ", " leading", "two\nlines", "zero\u200bwidth"]
    messages = [topic.message(command(f"bad-{i}", key)) for i, key in enumerate(bad)]
    result = ingest(conn, settings, [*messages, topic.message(command("good", "clé du jour"))])
    assert result.applied == 1
    assert codes(result) == [("invalid", f"bad-{i}") for i in range(len(bad))]
    assert all("schedule key" in r.rejection.reason for r in result.rejected)
    assert by_key(conn, "clé du jour")["name"] == "clé du jour"
