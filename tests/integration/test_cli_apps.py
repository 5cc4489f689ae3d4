"""`scheduler apps create` while Kafka is down: the app's row is made first, and stays, so the one
line says so, and what makes its topic later (before, it said only that Kafka could not be reached,
and the app then listed read as a surprise)."""

from __future__ import annotations

import pytest

from scheduler.config import Settings
from scheduler.kafka.transport import TopicAdmin
from tests.integration.test_schedules_cli import Cli

pytestmark = pytest.mark.integration


def test_an_app_created_while_kafka_is_down_is_said_to_exist_without_its_topic(
    settings: Settings, settings_env: dict[str, str]
) -> None:
    topic = settings.jobs_topic("kdown")
    down = Cli(settings_env | {"SCHEDULER_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    line = down.refused("apps", "create", "kdown", "--partitions", "2", code=1)
    assert line.startswith(
        f"error: app 'kdown' is created, but its topic {topic} is not (cannot reach Kafka"
    ), line
    assert "`scheduler init` or `scheduler apps create kdown` makes it later" in line, line

    cli = Cli(settings_env)
    assert [(a["name"], a["partitions"]) for a in cli.json("apps", "list", "--json")] == [("kdown", 2)]
    assert topic not in TopicAdmin(settings.kafka).topics()
    assert topic in cli.json("init", "--json")["topics_created"], "init makes it, as the line says"
    assert TopicAdmin(settings.kafka).partitions(topic) == 2
