"""One bad outbox row never wedges the relay: a row Kafka refuses for a fault of the message itself
is quarantined with its run dead, a row that failed for any other reason is handed back alone, a
row whose topic does not exist is held (or its topic made, when its app exists), and the rows after
any of them are published in the same round, once each."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]
from psycopg.types.json import Jsonb

from scheduler.config import Settings
from scheduler.domain.schedule import ExecutionSettings
from scheduler.kafka.connection import KafkaConnection
from scheduler.kafka.messages import ATTEMPT_HEADER, RUN_ID_HEADER
from scheduler.kafka.topics import TOPIC_CONFIG
from scheduler.kafka.transport import DeliveryError, Producer, TopicAdmin, producer_config
from scheduler.relay import metrics
from scheduler.relay.relay import MESSAGE_REFUSED, Relay, refused_for_good
from scheduler.store import connect, outbox
from scheduler.wiring import Wiring
from tests.support import read_records, read_topic, wait_for

pytestmark = pytest.mark.integration

APP = "quar"
BIG = 5 * 1024 * 1024  # over the producers' 4 MiB limit


@pytest.fixture
def relay(settings: Settings) -> Iterator[Relay]:
    # A short claim, so that the producer gives up on a message within two seconds.
    relay = Wiring(dataclasses.replace(settings, relay_claim_s=4.0)).relay()
    try:
        yield relay
    finally:
        relay.close()


def queue(settings: Settings, values: list[bytes], topic: str | None = None) -> list[uuid.UUID]:
    """One pending run per value, each with its outbox row (in this order), all of one schedule."""
    schedule_id = uuid.uuid4()
    run_ids = [uuid.uuid4() for _ in values]
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values (%s, 1) on conflict do nothing", (APP,))
        conn.execute(
            "insert into schedules (id, app, name, kind, handler) "
            "values (%s, %s, 'q', 'immediate', 'builtin:noop')",
            (schedule_id, APP),
        )
        for i, (run_id, value) in enumerate(zip(run_ids, values, strict=True)):
            conn.execute(
                "insert into runs (id, schedule_id, app, scheduled_for, state, attempt, max_attempts) "
                "values (%s, %s, %s, now() + make_interval(secs => %s), 'pending', 1, 3)",
                (run_id, schedule_id, APP, i / 1000),
            )
            conn.execute(
                "insert into outbox (topic, key, value, run_id, attempt) values (%s, %s, %s, %s, 1)",
                (topic or settings.jobs_topic(APP), str(schedule_id).encode(), value, run_id),
            )
        conn.commit()
    return run_ids


def runs(settings: Settings) -> dict[uuid.UUID, dict[str, Any]]:
    with connect(settings.database_url) as conn:
        found = conn.execute("select id, state, error, attempt from runs").fetchall()
    return {uuid.UUID(str(r["id"])): r for r in found}


def rows(settings: Settings, sql: str) -> list[dict[str, Any]]:
    with connect(settings.database_url) as conn:
        return conn.execute(sql).fetchall()


def make_due(settings: Settings) -> None:
    """The rows held back by their delay may be claimed now (instead of waiting seconds for it)."""
    with connect(settings.database_url) as conn:
        conn.execute("update outbox set available_at = null")
        conn.commit()


def topic_limit(settings: Settings, topic: str) -> str:
    client = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = client.describe_configs([resource])[resource].result(timeout=10)
    return str(configs["max.message.bytes"].value)


def test_a_row_over_the_producers_limit_is_quarantined_and_the_rows_after_it_go_in_the_same_round(
    settings: Settings, relay: Relay
) -> None:
    TopicAdmin(settings.kafka).ensure_topics([settings.jobs_topic(APP)], 1, config=TOPIC_CONFIG)
    values = [f"job {i}".encode() for i in range(10)]
    values[3] = os.urandom(BIG)
    run_ids = queue(settings, values)

    report = relay.relay_once()

    assert (report.taken, report.published, report.quarantined, report.released) == (10, 9, 1, 0)
    states = runs(settings)
    assert [states[r]["state"] for r in run_ids] == ["pending"] * 3 + ["dead"] + ["pending"] * 6
    error = states[run_ids[3]]["error"]
    assert error.startswith("RelayRefused: ") and "too large" in error.lower() and str(BIG) in error
    [held] = rows(settings, "select component, reason, run_id, app, original_bytes from quarantine")
    assert (held["component"], held["run_id"], held["app"]) == ("relay", run_ids[3], APP)
    assert bytes(held["original_bytes"]) == values[3]
    assert "MSG_SIZE_TOO_LARGE" in held["reason"]
    [verdict] = rows(settings, "select kind, outcome, worker, error_class from attempts")
    assert verdict == {"kind": "dead", "outcome": "applied", "worker": "relay", "error_class": "RelayRefused"}
    assert rows(settings, "select count(*) as n from outbox") == [{"n": 0}]

    # Nothing is published again: the next round finds an empty outbox, the topic has each once.
    assert relay.relay_once().taken == 0
    published = [value for _, value, _ in read_topic(settings.kafka_bootstrap, settings.jobs_topic(APP))]
    assert sorted(published) == sorted(v for i, v in enumerate(values) if i != 3)


def test_a_message_the_broker_refuses_in_a_batch_is_found_and_the_others_of_its_batch_go_through(
    settings: Settings, relay: Relay
) -> None:
    # Under the producer's limit, over the topic's: the broker refuses the whole record batch.
    topic = settings.jobs_topic(APP)
    TopicAdmin(settings.kafka).ensure_topics([topic], 1, config={"max.message.bytes": "20000"})
    values = [f"job {i}".encode() for i in range(12)]
    values[5] = os.urandom(50_000)  # incompressible
    run_ids = queue(settings, values)

    report = relay.relay_once()

    assert (report.published, report.quarantined, report.released) == (11, 1, 0)
    states = runs(settings)
    assert [r for r in run_ids if states[r]["state"] == "dead"] == [run_ids[5]]
    assert "Message size too large" in states[run_ids[5]]["error"]
    assert relay.relay_once().taken == 0
    published = [value for _, value, _ in read_topic(settings.kafka_bootstrap, topic)]
    assert sorted(published) == sorted(v for i, v in enumerate(values) if i != 5), "each good row once"


def held_rows(settings: Settings, cause: str) -> float:
    return metrics.REGISTRY.get_sample_value("scheduler_relay_held_total", {"cause": cause}) or 0.0


def test_a_row_for_a_topic_that_does_not_exist_is_held_and_published_once_its_app_exists(
    settings: Settings, relay: Relay, caplog: pytest.LogCaptureFixture
) -> None:
    # An app created while Kafka was down: its row is committed, its topic never made.
    TopicAdmin(settings.kafka).ensure_topics([settings.jobs_topic(APP)], 1, config=TOPIC_CONFIG)
    never = settings.jobs_topic("never")
    good = queue(settings, [b"a", b"b"])
    waiting = queue(settings, [b"c"], topic=never)
    more = queue(settings, [b"d"])
    before = held_rows(settings, "no_app")

    with caplog.at_level(logging.WARNING):
        report = relay.relay_once()

    assert (report.published, report.quarantined, report.released, report.held) == (3, 0, 0, 1)
    states = runs(settings)
    assert {states[r]["state"] for r in good + more} == {"pending"}
    assert states[waiting[0]]["state"] == "pending" and states[waiting[0]]["error"] is None
    assert rows(settings, "select count(*) as n from quarantine") == [{"n": 0}]
    held = rows(settings, "select claimed_by, available_at > now() as waiting from outbox")
    assert held == [{"claimed_by": None, "waiting": True}], "handed back, behind the rows after it"
    assert held_rows(settings, "no_app") == before + 1
    assert metrics.HELD_TOPICS._value.get() == 1
    [warning] = [r.getMessage() for r in caplog.records if "holding" in r.getMessage()]
    assert never in warning and "no app 'never'" in warning

    # Held again: said once a minute, not once a batch.
    caplog.clear()
    make_due(settings)
    with caplog.at_level(logging.WARNING):
        assert relay.relay_once().held == 1
    assert not [r for r in caplog.records if "holding" in r.getMessage()]

    # Once the app exists, the relay creates its topic as `apps create` would, and publishes.
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values ('never', 3)")
        conn.commit()
    make_due(settings)
    report = relay.relay_once()
    assert (report.published, report.held) == (1, 0)
    assert runs(settings)[waiting[0]]["state"] == "pending"
    assert TopicAdmin(settings.kafka).partitions(never) == 3
    assert topic_limit(settings, never) == TOPIC_CONFIG["max.message.bytes"]
    assert [value for _, value, _ in read_topic(settings.kafka_bootstrap, never)] == [b"c"]
    assert metrics.HELD_TOPICS._value.get() == 0


def test_a_retriable_failure_hands_back_only_the_failed_rows_and_a_deleted_topic_is_held_then_made_again(
    settings: Settings, relay: Relay
) -> None:
    ok, gone = settings.jobs_topic(APP), settings.jobs_topic("gone")
    admin = TopicAdmin(settings.kafka)
    admin.ensure_topics([ok, gone], 1, config=TOPIC_CONFIG)
    queue(settings, [b"known"], topic=gone)
    assert relay.relay_once().published == 1  # the relay (and its producer) now know the topic
    admin.delete_topics([gone])
    first = queue(settings, [b"a", b"b"])
    failing = queue(settings, [b"c", b"d"], topic=gone)
    last = queue(settings, [b"e"])

    # Kafka does not acknowledge the messages for the deleted topic within the producer's
    # timeout: handed back, while the rest of the batch is published and completed.
    report = relay.relay_once()  # does not raise: Kafka took the rest of the batch

    assert (report.published, report.quarantined, report.released) == (3, 0, 2)
    states = runs(settings)
    assert {states[r]["state"] for r in first + last} == {"pending"}
    assert {states[r]["state"] for r in failing} == {"pending"}
    held = rows(
        settings,
        "select claimed_by, publish_count, available_at > now() as waiting from outbox order by id",
    )
    # Each waits a little before it is claimed again, so the rows behind it go first.
    assert held == [{"claimed_by": None, "publish_count": 1, "waiting": True}] * 2
    published = [value for _, value, _ in read_topic(settings.kafka_bootstrap, ok)]
    assert sorted(published) == [b"a", b"b", b"e"]

    # Once due again, the relay asks the cluster about the topic: it is gone, and no app of that
    # name exists to make it for. The rows are held, their runs untouched: a topic deleted by
    # mistake kills nothing.
    make_due(settings)
    report = relay.relay_once()
    assert (report.quarantined, report.held) == (0, 2)
    assert {runs(settings)[r]["state"] for r in failing} == {"pending"}
    assert rows(settings, "select count(*) as n from quarantine") == [{"n": 0}]

    # Its app exists after all (here: created now): the relay makes the topic again and publishes.
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values ('gone', 1)")
        conn.commit()
    make_due(settings)
    report = relay.relay_once()
    assert (report.published, report.held, report.quarantined) == (2, 0, 0)
    assert {runs(settings)[r]["state"] for r in failing} == {"pending"}
    assert sorted(value for _, value, _ in read_topic(settings.kafka_bootstrap, gone)) == [b"c", b"d"]


@pytest.mark.parametrize(
    ("code", "quarantined"),
    [
        *((code, True) for code in sorted(MESSAGE_REFUSED)),
        # The relay's connection, rights or producer, the cluster, a topic: never the message's.
        *(
            (code, False)
            for code in (
                "_MSG_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_FATAL", "_UNKNOWN_TOPIC",
                "UNKNOWN_TOPIC_OR_PART", "TOPIC_AUTHORIZATION_FAILED", "NOT_ENOUGH_REPLICAS",
                "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "POLICY_VIOLATION", "INVALID_REPLICATION_FACTOR",
                "KAFKA_STORAGE_ERROR", "_INVALID_ARG", "_BAD_MSG", "UNKNOWN", None,
            )
        ),
    ],
)  # fmt: skip
def test_only_a_refusal_of_the_message_itself_quarantines(code: str | None, quarantined: bool) -> None:
    # librdkafka's delivery reports mark no error retriable: the flag decides nothing.
    assert refused_for_good(DeliveryError("refused", code=code, retriable=False)) is quarantined


def test_the_relay_publishes_every_header_of_a_job_message(settings: Settings, relay: Relay) -> None:
    topic = settings.jobs_topic(APP)
    TopicAdmin(settings.kafka).ensure_topics([topic], 1, config=TOPIC_CONFIG)
    [run_id] = queue(settings, [b"placeholder"])
    job = Wiring(settings).dispatcher.message(
        run_id=run_id,
        schedule_id=uuid.uuid4(),
        job=ExecutionSettings(APP, "builtin:noop", {}, 5000, 3, 1000, 60_000),
        scheduled_for=datetime.now(UTC),
        attempt=1,
        deadline=datetime.now(UTC),
    )
    headers = job.headers | {"x-extra": "kept"}
    with connect(settings.database_url) as conn:
        conn.execute(
            "update outbox set value = %s, headers = %s where run_id = %s",
            (job.value, Jsonb(headers), run_id),
        )
        conn.commit()

    assert relay.relay_once().published == 1

    [(_, value, _, received)] = read_records(settings.kafka_bootstrap, topic)
    assert value == job.value
    assert {name: raw.decode() for name, raw in received.items()} == headers
    assert (received[RUN_ID_HEADER], received[ATTEMPT_HEADER]) == (str(run_id).encode(), b"1")


def relay_to_unreachable_kafka(settings: Settings, *, claim_s: float, message_timeout_ms: int) -> Relay:
    """A relay whose producer's broker does not answer (the topic check still reaches the real
    cluster): each batch waits ``message_timeout_ms`` for acknowledgements that never come."""
    wiring = Wiring(dataclasses.replace(settings, relay_claim_s=claim_s))
    unreachable = KafkaConnection("127.0.0.1:1")
    return Relay(
        wiring.settings,
        wiring.database,
        lambda: Producer(
            producer_config(unreachable, "relay-test", {"message.timeout.ms": message_timeout_ms})
        ),
        TopicAdmin(settings.kafka),
        wiring.kafka_check(),
        name="relay-test",
    )


def test_when_kafka_takes_nothing_the_rows_are_handed_back_at_once_and_the_relay_backs_off(
    settings: Settings,
) -> None:
    TopicAdmin(settings.kafka).ensure_topics([settings.jobs_topic(APP)], 1, config=TOPIC_CONFIG)
    queue(settings, [b"a", b"b", b"c"])
    relay = relay_to_unreachable_kafka(settings, claim_s=4.0, message_timeout_ms=1500)
    metrics.OUTBOX_DEPTH.set(0)
    try:
        with pytest.raises(DeliveryError, match="3 outbox messages not acknowledged"):
            relay.step()
    finally:
        relay.close()
    held = rows(settings, "select claimed_by, available_at, publish_count from outbox")
    assert held == [{"claimed_by": None, "available_at": None, "publish_count": 1}] * 3
    assert {r["state"] for r in runs(settings).values()} == {"pending"}
    # While Kafka takes nothing, the outbox's gauges still say how it grows: what its alert watches.
    assert metrics.OUTBOX_DEPTH._value.get() == 3
    assert oldest_age() > 0


def step_noting_failure(relay: Relay, failed: list[BaseException]) -> None:
    """One step of ``relay``, in a thread of its own as a rule: what it raised goes to ``failed``."""
    try:
        relay.step()
    except BaseException as exc:
        failed.append(exc)


def oldest_age() -> float:
    value = metrics.REGISTRY.get_sample_value("scheduler_outbox_oldest_age_seconds")
    assert value is not None
    return value


def test_while_a_batch_waits_on_a_kafka_that_does_not_answer_the_oldest_age_grows(
    settings: Settings,
) -> None:
    """The outbox is looked at between batches; a batch may wait on Kafka for most of a claim
    (45 s by default), and the age the outbox alert watches must not stand still meanwhile."""
    TopicAdmin(settings.kafka).ensure_topics([settings.jobs_topic(APP)], 1, config=TOPIC_CONFIG)
    queue(settings, [b"a"])
    relay = relay_to_unreachable_kafka(settings, claim_s=20.0, message_timeout_ms=6000)
    failed: list[BaseException] = []
    step = functools.partial(step_noting_failure, relay, failed)

    try:
        relay._observe_outbox()  # the look before the batch (the relay's own after each step)
        seen = oldest_age()
        assert seen > 0
        stepping = threading.Thread(target=step)
        stepping.start()
        wait_for(lambda: oldest_age() >= seen + 2.0, 5.5, "the oldest age to grow while the batch waits")
        stepping.join(30)
        assert [type(exc) for exc in failed] == [DeliveryError]
    finally:
        relay.close()
    # After the batch, a look at the outbox again: the rows are back, the age what the database says.
    assert 0 < oldest_age() < seen + 30


def test_rows_held_back_by_available_at_are_claimed_once_it_passes(settings: Settings, relay: Relay) -> None:
    TopicAdmin(settings.kafka).ensure_topics([settings.jobs_topic(APP)], 1, config=TOPIC_CONFIG)
    [later] = queue(settings, [b"later"])
    [now] = queue(settings, [b"now"])
    with connect(settings.database_url) as conn:
        conn.execute(
            "update outbox set available_at = now() + interval '3 seconds' where run_id = %s", (later,)
        )
        conn.commit()

    assert relay.step() is False
    assert runs(settings)[now]["state"] == "pending"
    assert runs(settings)[later]["state"] == "pending"
    # The idle relay wakes when the held-back row becomes due, not at its next poll: in what is
    # left of its 3 s (the step before took some of it, over a second on a loaded machine).
    with connect(settings.database_url) as conn:
        wait_s = outbox.next_available_in(conn)
    assert wait_s is not None and 0 < wait_s <= 3
    wait_for(lambda: relay.relay_once().published == 1, 15, "the held-back row published once it is due")
    assert runs(settings)[later]["state"] == "pending"


def test_an_idle_relay_logs_a_broker_it_lost_while_idle(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka reports a lost broker through callbacks only a poll serves: an idle relay once
    logged an outage only at its next batch, after Kafka was back."""
    wiring = Wiring(settings)
    unreachable = KafkaConnection("127.0.0.1:1")
    relay = Relay(
        wiring.settings,
        wiring.database,
        lambda: Producer(producer_config(unreachable, "relay-idle", {})),
        TopicAdmin(settings.kafka),
        wiring.kafka_check(),
        name="relay-idle",
    )
    stop = threading.Event()

    def warned() -> bool:
        relay.idle(stop)  # the outbox is empty: nothing to publish, only the wait
        return any("Kafka client relay-idle" in r.getMessage() for r in caplog.records)

    try:
        assert relay.producer is not None  # as after its first batch
        with caplog.at_level(logging.WARNING):
            wait_for(warned, 30, "the idle relay's warning about its broker")
    finally:
        relay.close()


def test_a_relay_that_cannot_reach_kafka_locks_no_row_and_never_reads_as_recovered(
    settings: Settings,
) -> None:
    """Cut off from Kafka (or misconfigured) beside a relay that is not, it must not take the
    oldest rows batch after batch and sit on them while it waits: the other relay would skip them."""
    queue(settings, [b"a", b"b", b"c"])
    wiring = Wiring(dataclasses.replace(settings, relay_claim_s=8.0))
    unreachable = KafkaConnection("127.0.0.1:1")
    relay = Relay(
        wiring.settings,
        wiring.database,
        lambda: Producer(producer_config(unreachable, "relay-cut-off", {"message.timeout.ms": 4000})),
        TopicAdmin(unreachable),
        wiring.kafka_check(),
        name="relay-cut-off",
    )
    failed: list[BaseException] = []
    step = functools.partial(step_noting_failure, relay, failed)

    lockable: list[int] = []
    failures_before = metrics.FAILURES._value.get()
    try:
        stepping = threading.Thread(target=step)
        stepping.start()
        with connect(settings.database_url, autocommit=True) as other:
            while stepping.is_alive():  # as long as the relay's step takes (its topic check: 2 s)
                with other.transaction(force_rollback=True):
                    taken = other.execute("select id from outbox for update skip locked").fetchall()
                lockable.append(len(taken))
        stepping.join()
        assert [type(exc).__name__ for exc in failed] == ["KafkaUnavailable"]
        assert lockable and set(lockable) == {3}, "every row stayed free for another relay to take"
        # Still a batch Kafka took nothing of, each time: what SchedulerRelayPublishFailing watches.
        step()
        assert metrics.FAILURES._value.get() == failures_before + 2
        # Nothing to publish is no recovery: the step still fails while Kafka does not answer.
        with connect(settings.database_url) as conn:
            conn.execute("delete from outbox")
            conn.commit()
        failed.clear()
        step()
        assert [type(exc).__name__ for exc in failed] == ["KafkaUnavailable"]
    finally:
        relay.close()
    held = rows(settings, "select publish_count from outbox")
    assert held == []
