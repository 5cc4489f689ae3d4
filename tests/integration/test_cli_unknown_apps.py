"""A command naming an app that does not exist says so (one line, exit 2) rather than answer as if
the app had nothing in it, or run for ever: `run worker` and `run all` consumed a topic that never
comes, warning only "Subscribed topic not available"."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from scheduler.config import Settings
from tests.integration.test_schedules_cli import Cli
from tests.support import Component, json_log_lines, wait_for

pytestmark = pytest.mark.integration

UNKNOWN = "error: unknown app 'nosuch' (`scheduler apps list` shows the apps)"
STARTED = '"message": "started"'  # the worker's log line (JSON: not a terminal)


@pytest.fixture
def cli(settings_env: dict[str, str]) -> Cli:
    cli = Cli(settings_env)
    assert cli("apps", "create", "billing", "--partitions", "1").returncode == 0
    return cli


@pytest.mark.parametrize(
    "command",
    [
        ("run", "worker", "--app", "nosuch"),
        ("run", "all", "--app", "nosuch"),
        ("run", "all", "--app", "billing", "--app", "nosuch"),
    ],
)
def test_running_the_workers_of_an_unknown_app_is_refused_before_anything_starts(
    cli: Cli, command: tuple[str, ...]
) -> None:
    assert cli.refused(*command) == UNKNOWN


def test_a_worker_whose_app_exists_without_its_topic_starts_and_waits_for_it(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    """The topic of an app is made after its row (`apps create` with Kafka down makes only the row;
    `init` or the relay make the topic later): its worker waits, as before."""
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("insert into apps (name, partitions) values ('later', 1)")
    worker = Component("worker", settings_env, tmp_path, "--app", "later")
    try:
        wait_for(lambda: STARTED in worker.output(), 30, "the worker's start")
        assert worker.proc.poll() is None, worker.output()
    finally:
        assert worker.stop() == 0, worker.output()[-3000:]
    # Said as the rest of its log is: a JSON line (it was plain text before the first of them).
    [note] = [r for r in json_log_lines(worker.output()) if "has no topic" in r["message"]]
    assert note["level"] == "INFO" and note["component"] == "worker", note
    assert note["message"].startswith(f"app 'later' has no topic {settings.jobs_topic('later')} yet"), note


def test_a_worker_without_its_topic_or_a_database_to_ask_starts_and_waits(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    """As a Kubernetes worker pod, which has no database, started beside the Job that makes its
    app and topic."""
    env = settings_env | {"SCHEDULER_DATABASE_URL": "postgresql://scheduler@127.0.0.1:1/none"}
    worker = Component("worker", env, tmp_path, "--app", "coming")
    try:
        wait_for(lambda: STARTED in worker.output(), 30, "the worker's start")
        assert worker.proc.poll() is None, worker.output()
    finally:
        assert worker.stop() == 0, worker.output()[-3000:]
    [warning] = [r for r in json_log_lines(worker.output()) if "has no topic" in r["message"]]
    assert warning["level"] == "WARNING" and warning["component"] == "worker", warning
    topic = settings.jobs_topic("coming")
    assert warning["message"] == f"Kafka has no topic {topic}: the worker waits for it (is 'coming' an app?)"


@pytest.mark.parametrize(
    ("command", "rows"),
    [
        (("audit", "list"), ""),
        (("quarantine", "list"), ", and no quarantined item names it"),
        (("schedules", "rejected"), ", and no rejected command names it"),
    ],
)
def test_a_listing_filtered_on_an_unknown_app_is_refused(
    cli: Cli, command: tuple[str, ...], rows: str
) -> None:
    line = cli.refused(*command, "--app", "nosuch")
    assert line == f"error: unknown app 'nosuch'{rows} (`scheduler apps list` shows the apps)"
    assert cli(*command, "--app", "billing").returncode == 0


def test_an_app_never_created_that_quarantined_items_or_rejections_name_is_listed(
    cli: Cli, settings: Settings
) -> None:
    """A command for an app that does not exist is rejected under its name; an outcome message
    the reconciler set aside names whatever app it named. Their listings find them by it."""
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(
            "insert into quarantine (component, reason, app, original_bytes, source_topic, source_partition,"
            " source_offset) values ('reconciler', 'refused by PostgreSQL', 'ghost', 'x', 'p.results', 0, 7)"
        )
        conn.execute(
            "insert into ingest_rejections (code, reason, command_id, schedule_key, app, operation,"
            " original_bytes, source_topic, source_partition, source_offset)"
            " values ('invalid', 'unknown app ''ghost''', 'c-1', 'nightly', 'ghost', 'create', 'x',"
            " 'p.schedules', 0, 3)"
        )
    [quarantined] = cli.json("quarantine", "list", "--app", "ghost", "--json")
    assert quarantined["reason"] == "refused by PostgreSQL"
    assert cli.json("quarantine", "list", "--app", "ghost", "--component", "relay", "--json") == []
    [rejected] = cli.json("schedules", "rejected", "--app", "ghost", "--json")
    assert (rejected["code"], rejected["schedule_key"]) == ("invalid", "nightly")
    assert cli.json("schedules", "rejected", "--app", "ghost", "--code", "conflict", "--json") == []
    cli.refused("audit", "list", "--app", "ghost")
