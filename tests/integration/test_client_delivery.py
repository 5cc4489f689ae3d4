"""The Python client's delivery promises against the real Kafka: what it returned a command id for
reaches the topic, however the ``with`` block is left."""

from __future__ import annotations

import pytest

from scheduler.client import ScheduleClient
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
