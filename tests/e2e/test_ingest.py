"""Schedule commands over Kafka as a user runs them: `scheduler produce`, the ingestor as a process,
the rejected topic, and `scheduler run all` taking a command all the way to a finished run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as RawProducer

from scheduler.client import spec
from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import ScheduleCommand, ScheduleCommandRejected
from scheduler.kafka.transport import TopicAdmin
from scheduler.store import connect
from tests.support import SCHEDULER, Component, components, read_topic, wait_for

pytestmark = pytest.mark.e2e

APP = "bulk"
CODEC = AvroCodec()
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def cli(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDULER, *args], env=env, input=stdin, capture_output=True, text=True, check=False, timeout=300
    )


@pytest.fixture
def stack(settings: Settings, settings_env: dict[str, str]) -> Settings:
    """Core topics and the app. The commands and rejected topics take messages of up to 4 MiB, so that
    a command whose payload is over the 1 MiB limit reaches the ingestor and its rejection the topic."""
    big = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
    TopicAdmin(settings.kafka_bootstrap).ensure_topics(
        [settings.schedules_topic, settings.rejected_topic], 3, config=big
    )
    assert cli(settings_env, "init").returncode == 0
    done = cli(settings_env, "apps", "create", APP, "--partitions", "3")
    assert done.returncode == 0, done.stderr
    return settings


@pytest.fixture
def ingestor(stack: Settings, settings_env: dict[str, str], tmp_path: Path) -> Iterator[Settings]:
    with components(settings_env, tmp_path, "ingestor"):
        yield stack


def count(settings: Settings, sql: str) -> int:
    with connect(settings.database_url) as conn:
        row: dict[str, Any] | None = conn.execute(sql).fetchone()
    assert row is not None
    return int(next(iter(row.values())) or 0)


def rejections(settings: Settings) -> list[ScheduleCommandRejected]:
    return [
        CODEC.decode(ScheduleCommandRejected, value)
        for _, value, _ in read_topic(settings.kafka_bootstrap, settings.rejected_topic)
    ]


def test_thousands_of_creates_produced_twice_make_each_schedule_once(
    ingestor: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    n = 2000
    commands = tmp_path / "commands.jsonl"
    with commands.open("w") as out:
        for i in range(n):
            line = {
                "schedule_key": f"job-{i}", "app": APP, "operation": "create",
                "spec": {"cron": f"{i % 60} {i % 24} * * *", "tz": "Europe/Berlin", "handler": "builtin:noop",
                         "payload": {"i": i}},
            }  # fmt: skip
            out.write(json.dumps(line) + "\n")

    first = cli(settings_env, "produce", "--file", str(commands), "--json")
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert (summary["produced"], summary["failed"]) == (n, 0) and summary["rate"] > 0
    wait_for(lambda: count(ingestor, "select count(*) from schedules") == n, 120, f"{n} schedules")

    second = cli(settings_env, "produce", "--file", str(commands), "--json")
    assert second.returncode == 0 and json.loads(second.stdout)["produced"] == n
    wait_for(
        lambda: count(ingestor, "select sum(duplicates) from applied_commands") == n,
        120,
        "the second copy of every command recognised as a duplicate",
    )
    assert count(ingestor, "select count(*) from schedules") == n
    assert count(ingestor, "select count(distinct schedule_key) from schedule_keys") == n
    assert count(ingestor, "select count(*) from ingest_rejections") == 0
    with connect(ingestor.database_url) as conn:
        row = conn.execute(
            "select s.* from schedules s join schedule_keys k on k.schedule_id = s.id "
            "where k.schedule_key = 'job-61'"
        ).fetchone()
    assert row is not None
    assert (row["cron"], row["tz"], row["payload"], row["state"]) == (
        "1 13 * * *",
        "Europe/Berlin",
        {"i": 61},
        "active",
    )


def test_bad_commands_are_rejected_with_reasons_and_never_hold_up_good_ones(
    ingestor: Settings, settings_env: dict[str, str]
) -> None:
    def create(key: str, **fields: Any) -> bytes:
        values: dict[str, Any] = {"handler": "builtin:noop", "cron": "0 6 * * *"}
        command = ScheduleCommand(
            command_id=f"id-{key}",
            schedule_key=key,
            app=APP,
            operation="create",
            spec=spec(**(values | fields)),
        )
        return CODEC.encode(command)

    header = CODEC.catalog.current("ScheduleCommand").header
    random_blob = os.urandom(700 * 1024).hex()  # 1.4 MB of JSON that compression cannot shrink
    bad = {
        "malformed": header + b"\x7f\xff\xff\xff\xff\xff",
        "fingerprint": b"\xc3\x01" + bytes.fromhex("0123456789abcdef") + create("x")[10:],
        "cron": create("bad-cron", cron="0 25 * * *"),
        "payload": create("too-big", payload={"blob": random_blob}),
        "garbage": b"hello, scheduler",
        "empty": b"",
    }
    good = [create(f"good-{i}") for i in range(10)]
    producer = RawProducer(
        {"bootstrap.servers": ingestor.kafka_bootstrap, "message.max.bytes": MAX_MESSAGE_BYTES}
    )
    # Good and bad interleaved on one partition (one key), then more good after the last bad one.
    for value in [good[0], *bad.values(), *good[1:5]]:
        producer.produce(ingestor.schedules_topic, value, key=b"mixed")
    for value in good[5:]:
        producer.produce(ingestor.schedules_topic, value)
    assert producer.flush(30) == 0

    wait_for(
        lambda: count(ingestor, "select count(*) from schedules") == 10, 120, "every good command applied"
    )
    rejected = wait_for(
        lambda: r if len(r := rejections(ingestor)) == len(bad) else None, 120, "every bad one rejected"
    )
    assert rejected is not None
    by_bytes = {r.original_bytes: r for r in rejected}
    reason = {name: (by_bytes[value].code, by_bytes[value].reason) for name, value in bad.items()}
    assert reason["malformed"][0] == "undecodable" and "corrupt or truncated" in reason["malformed"][1]
    assert reason["fingerprint"] == (
        "undecodable",
        "unknown schema fingerprint 0123456789abcdef: written with a schema version this scheduler does not "
        "know (a newer producer?)",
    )
    assert reason["cron"][0] == "invalid" and "25" in reason["cron"][1]
    assert reason["payload"][0] == "invalid" and "the limit is 1048576 (1 MiB)" in reason["payload"][1]
    assert reason["garbage"][0] == "undecodable" and "unknown framing" in reason["garbage"][1]
    assert reason["empty"] == ("undecodable", "empty message where a ScheduleCommand was expected")
    assert by_bytes[bad["cron"]].command_id == "id-bad-cron" and by_bytes[bad["garbage"]].command_id is None
    assert all(r.source.topic == ingestor.schedules_topic for r in rejected)

    listed = cli(settings_env, "schedules", "rejected", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["code"] for r in json.loads(listed.stdout)) == sorted(c for c, _ in reason.values())


def test_produce_reports_each_bad_line_and_exits_non_zero(
    stack: Settings, settings_env: dict[str, str]
) -> None:
    lines = [
        json.dumps(
            {"schedule_key": "a", "app": APP, "operation": "create", "spec": {"handler": "builtin:noop"}}
        ),
        "{not json",
        json.dumps({"schedule_key": "b", "operation": "pause"}),
        "",
        json.dumps(
            {
                "schedule_key": "c",
                "app": APP,
                "operation": "create",
                "spec": {"handler": "builtin:noop", "colour": "red"},
            }
        ),
        json.dumps({"schedule_key": "d", "app": APP, "operation": "create"}),
        json.dumps(
            {
                "schedule_key": "e",
                "app": APP,
                "operation": "create",
                "spec": {"handler": "builtin:noop", "run_at": "2027-01-01T09:00:00"},
            }
        ),
        json.dumps({"command_id": "fixed", "schedule_key": "a", "app": APP, "operation": "trigger"}),
    ]
    done = cli(settings_env, "produce", "--json", stdin="\n".join(lines) + "\n")
    assert done.returncode == 1
    summary = json.loads(done.stdout)
    assert (summary["produced"], summary["failed"]) == (2, 5)
    errors = [line for line in done.stderr.splitlines() if line.startswith("line ")]
    assert errors == [
        errors[0],
        "line 3: app is required (a non-empty string)",
        "line 5: unknown spec field(s): colour",
        "line 6: the create command needs a spec",
        "line 7: spec.run_at '2027-01-01T09:00:00' needs an offset (e.g. 2027-01-01T09:00:00Z)",
    ]
    assert errors[0].startswith("line 2: not JSON:")

    produced = [
        CODEC.decode(ScheduleCommand, value)
        for _, value, _ in read_topic(stack.kafka_bootstrap, stack.schedules_topic)
    ]
    assert sorted((c.schedule_key, c.operation) for c in produced) == [("a", "create"), ("a", "trigger")]
    again = cli(settings_env, "produce", "--json", stdin=lines[0] + "\n")
    assert again.returncode == 0
    creates = [
        CODEC.decode(ScheduleCommand, value).command_id
        for _, value, _ in read_topic(stack.kafka_bootstrap, stack.schedules_topic)
        if CODEC.decode(ScheduleCommand, value).operation == "create"
    ]
    assert len(creates) == 2 and len(set(creates)) == 1, (
        "a line without a command id gets the same one every time"
    )


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_a_line_that_is_not_utf8_deep_or_huge_is_one_bad_line_and_the_others_are_produced(
    stack: Settings, settings_env: dict[str, str], tmp_path: Path, source: str
) -> None:
    """Each bad line is one line on stderr, and the lines after it are produced: not UTF-8, JSON
    nested deeper than the reader goes, a line longer than 16 MiB (read past, not held)."""

    def create(key: str) -> bytes:
        return json.dumps(
            {"schedule_key": key, "app": APP, "operation": "create", "spec": {"handler": "builtin:noop"}}
        ).encode()

    # A byte-order mark before the first line (as editors on Windows write) is no bad line.
    deep = b'{"schedule_key": "deep", "operation": "create", "spec": {"payload": ' + b"[" * 5000 + b"]" * 5000
    huge = b'{"schedule_key": "huge", "payload": "' + b"x" * (17 * 1024 * 1024) + b'"}'
    data = b"\n".join(
        [
            b"\xef\xbb\xbf" + create("first"),
            create("bad-\xff").replace(b"\\u00ff", b"\xff"),
            deep + b"}}",
            huge,
            create("third"),
        ]
    )
    assert b"\xff" in data.splitlines()[1]
    if source == "file":
        (tmp_path / "commands.jsonl").write_bytes(data + b"\n")
        args, stdin = ["--file", str(tmp_path / "commands.jsonl")], None
    else:
        args, stdin = [], data + b"\n"
    done = subprocess.run(
        [SCHEDULER, "produce", "--json", *args],
        env=settings_env,
        input=stdin,
        capture_output=True,
        timeout=300,
    )
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert [line for line in stderr.splitlines() if line.startswith("line ")] == [
        "line 2: not UTF-8 (byte 23 of the line)",
        "line 3: not JSON this reader can take: it nests about a thousand levels deep",
        "line 4: longer than 16 MiB; not read",
    ]
    assert (json.loads(done.stdout)["produced"], json.loads(done.stdout)["failed"]) == (2, 3)
    produced = [
        CODEC.decode(ScheduleCommand, value).schedule_key
        for _, value, _ in read_topic(stack.kafka_bootstrap, stack.schedules_topic)
    ]
    assert sorted(produced) == ["first", "third"]


def test_run_all_takes_a_produced_command_to_a_finished_run(
    stack: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    everything = Component("all", env, tmp_path, "--app", APP)
    try:
        line = {"schedule_key": "now", "app": APP, "operation": "create",
                "spec": {"kind": "immediate", "handler": "builtin:noop"}}  # fmt: skip
        done = cli(env, "produce", stdin=json.dumps(line))
        assert done.returncode == 0, done.stderr
        assert "produced 1 commands" in done.stdout and "0 failed" in done.stdout
        wait_for(
            lambda: count(stack, "select count(*) from runs where state = 'succeeded'") == 1,
            120,
            "the run of the produced schedule succeeded",
        )
    finally:
        assert everything.stop(60) == 0, everything.output()[-3000:]


def test_two_ingestors_apply_a_command_once_when_its_copies_land_on_different_partitions(
    stack: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    n = 1000
    values = [
        CODEC.encode(
            ScheduleCommand(
                command_id=f"cmd-{i}", schedule_key=f"k-{i}", app=APP, operation="create",
                spec=spec(handler="builtin:noop", cron="0 6 * * *"),
            )
        )
        for i in range(n)
    ]  # fmt: skip
    with components(settings_env, tmp_path, "ingestor", "ingestor"):
        # A producer that retries without a key: each copy goes to a random partition, so the two
        # ingestors may well meet the same command at the same moment.
        producer = RawProducer({"bootstrap.servers": stack.kafka_bootstrap, "partitioner": "random"})
        for value in values + values:
            producer.produce(stack.schedules_topic, value)
        assert producer.flush(30) == 0
        wait_for(
            lambda: count(stack, "select coalesce(sum(duplicates), 0) from applied_commands") == n,
            120,
            "every second copy recognised as a duplicate",
        )
    assert count(stack, "select count(*) from schedules") == n
    assert count(stack, "select count(*) from applied_commands") == n
    assert count(stack, "select count(*) from ingest_rejections") == 0


def test_ctrl_c_stops_produce_with_what_it_sent_delivered_and_counted(
    stack: Settings, settings_env: dict[str, str]
) -> None:
    """Interrupted, `scheduler produce` still delivers and counts what it sent, says the rest was not
    produced (exit 130), and producing the same input again sends each line's command once more,
    with its command id: a duplicate the ingestor ignores."""

    def create(key: int) -> bytes:
        return json.dumps(
            {
                "schedule_key": f"k{key}",
                "app": APP,
                "operation": "create",
                "spec": {"handler": "builtin:noop"},
            }
        ).encode()

    lines = [create(i) for i in range(50)]
    proc = subprocess.Popen(
        [SCHEDULER, "produce", "--json"],
        env=settings_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdin is not None
    proc.stdin.write(b"\n".join(lines) + b"\n")
    proc.stdin.flush()
    wait_for(
        lambda: len(read_topic(stack.kafka_bootstrap, stack.schedules_topic)) == 50, 60, "50 commands sent"
    )
    proc.send_signal(signal.SIGINT)  # while it waits for more input
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err.decode()
    assert (
        err.decode()
        .strip()
        .endswith(
            "error: interrupted: the rest of the input was not produced; producing the same input again "
            "sends what is missing (its lines keep their command ids, so none is applied twice)"
        )
    ), err
    summary = json.loads(out)
    assert (summary["produced"], summary["failed"], summary["interrupted"]) == (50, 0, True), summary

    again = cli(settings_env, "produce", stdin=(b"\n".join(lines) + b"\n").decode())
    assert again.returncode == 0, again.stderr
    ids = [
        CODEC.decode(ScheduleCommand, value).command_id
        for _, value, _ in read_topic(stack.kafka_bootstrap, stack.schedules_topic)
    ]
    assert len(ids) == 100 and len(set(ids)) == 50


def test_produce_refuses_a_line_the_ingestor_would_reject_with_its_reason(
    stack: Settings, settings_env: dict[str, str]
) -> None:
    bad = {"schedule_key": "b", "app": APP, "operation": "create",
           "spec": {"handler": "builtin:noop", "cron": "0 3 * * *", "tz": "Europe/Nowhere"}}  # fmt: skip
    good = {"schedule_key": "g", "app": APP, "operation": "pause"}
    done = cli(settings_env, "produce", "--json", stdin=f"{json.dumps(bad)}\n{json.dumps(good)}\n")
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("line ")]
    assert len(errors) == 1 and errors[0].startswith("line 1: ") and "Europe/Nowhere" in errors[0], errors
    assert (json.loads(done.stdout)["produced"], json.loads(done.stdout)["failed"]) == (1, 1)
    produced = [
        CODEC.decode(ScheduleCommand, value).schedule_key
        for _, value, _ in read_topic(stack.kafka_bootstrap, stack.schedules_topic)
    ]
    assert produced == ["g"]


def test_produce_without_the_commands_topic_says_so_at_once(
    stack: Settings, settings_env: dict[str, str]
) -> None:
    line = {"schedule_key": "k", "app": APP, "operation": "pause"}
    env = settings_env | {"SCHEDULER_TOPIC_PREFIX": "nosuch"}
    done = cli(env, "produce", stdin=json.dumps(line) + "\n")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "error: topic nosuch.schedules does not exist: `scheduler init` creates it\n"
