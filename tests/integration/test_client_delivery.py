"""The Python client's delivery promises against the real Kafka: what it returned a command id for
reaches the topic, however the ``with`` block is left."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.client import CommandFormatError, ScheduleClient
from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import ScheduleCommand
from scheduler.kafka.transport import TopicAdmin
from tests.support import read_topic

pytestmark = pytest.mark.integration


class _Boom(Exception):
    pass


def test_commands_sent_before_an_exception_in_the_with_block_are_still_delivered(settings: Settings) -> None:
    TopicAdmin(settings.kafka).ensure_topics([settings.schedules_topic], 3)
    sent = []
    with pytest.raises(_Boom), ScheduleClient.from_settings(settings) as client:
        for key in ("a", "b", "c"):
            sent.append(client.pause(key=key, app="billing"))
        raise _Boom("the caller's own error, after sending")
    on_topic = [
        AvroCodec().decode(ScheduleCommand, value).command_id
        for _, value, _ in read_topic(settings.kafka_bootstrap, settings.schedules_topic)
    ]
    assert sorted(on_topic) == sorted(sent)


def test_an_undelivered_command_is_noted_on_the_exception_that_left_the_block(settings: Settings) -> None:
    # No topic, a short timeout: the commands cannot be delivered; the caller's exception still
    # propagates (not replaced by the delivery error), and says that commands were lost.
    client = ScheduleClient(settings.kafka, settings.topic_prefix, config={"message.timeout.ms": 2000})
    with pytest.raises(_Boom) as raised, client:
        client.pause(key="a", app="billing")
        raise _Boom("the caller's own error")
    assert [n for n in raised.value.__notes__ if n.startswith("scheduler client: 1 failures")]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"cron": "99 * * * *"}, "invalid cron expression '99 * * * *'"),
        ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, "Mars/Olympus"),
        ({"timeout_seconds": -5}, "timeout_seconds must be 1 to 86400, got -5"),
        ({"payload": {"blob": "x" * (1024 * 1024 + 1)}}, "the limit is 1048576 (1 MiB)"),
    ],
    ids=["cron", "zone", "timeout", "payload"],
)
def test_a_command_the_ingestor_would_reject_is_refused_before_it_is_sent(
    settings: Settings, fields: dict[str, Any], error: str
) -> None:
    """What the ingestor rejects whatever the database holds fails at the call, with its reason,
    instead of coming back later on the rejected topic; nothing is produced."""
    TopicAdmin(settings.kafka).ensure_topics([settings.schedules_topic], 1)
    with ScheduleClient.from_settings(settings) as client:
        with pytest.raises(CommandFormatError) as refused:
            client.create(key="k", app="billing", handler="builtin:noop", **fields)
        client.pause(key="k", app="billing")  # the client goes on
    assert error in str(refused.value) and "\n" not in str(refused.value)
    operations = [
        AvroCodec().decode(ScheduleCommand, value).operation
        for _, value, _ in read_topic(settings.kafka_bootstrap, settings.schedules_topic)
    ]
    assert operations == ["pause"]
