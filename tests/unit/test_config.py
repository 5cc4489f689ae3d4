"""Settings: defaults that reach the local stack, and one clear line for a bad value."""

from __future__ import annotations

import socket
import time

import psycopg
import pytest

from scheduler.config import ConfigError, load_settings
from scheduler.store import TCP_OPTIONS, connect, connection_options


def test_defaults_point_at_the_local_stack() -> None:
    settings = load_settings({})
    assert settings.database_url == "postgresql://scheduler@127.0.0.1:54329/scheduler"
    assert settings.kafka_bootstrap == "127.0.0.1:19092"
    assert settings.topic_prefix == "sched"
    assert settings.schema_registry_url is None
    assert settings.core_topics == (
        "sched.schedules",
        "sched.schedules.rejected",
        "sched.results",
        "sched.retry",
        "sched.dlq",
    )
    assert settings.jobs_topic("billing") == "sched.jobs.billing"
    assert settings.lookahead_s == 1.0
    assert settings.history_retention_days == 30.0


def test_lookahead_zero_turns_it_off() -> None:
    assert load_settings({"SCHEDULER_LOOKAHEAD_S": "0"}).lookahead_s == 0.0
    assert load_settings({"SCHEDULER_HISTORY_RETENTION_DAYS": "0"}).history_retention_days == 0.0


def test_ports_move_the_default_urls() -> None:
    settings = load_settings({"SCHEDULER_PG_PORT": "6000", "SCHEDULER_KAFKA_PORT": "6001"})
    assert settings.database_url.endswith("127.0.0.1:6000/scheduler")
    assert settings.kafka_bootstrap == "127.0.0.1:6001"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SCHEDULER_PG_PORT": "abc"}, "SCHEDULER_PG_PORT='abc' is not an integer"),
        ({"SCHEDULER_KAFKA_PORT": "70000"}, "SCHEDULER_KAFKA_PORT=70000 is out of range"),
        ({"SCHEDULER_KAFKA_PORT": "54329"}, "must differ"),
        ({"SCHEDULER_DATABASE_URL": "mysql://x"}, "must be a postgresql:// URL"),
        ({"SCHEDULER_KAFKA_BOOTSTRAP": "localhost"}, "must be host:port"),
        ({"SCHEDULER_TOPIC_PREFIX": "bad prefix"}, "SCHEDULER_TOPIC_PREFIX='bad prefix'"),
        ({"SCHEDULER_SCHEMA_REGISTRY_URL": "registry:8081"}, "must be an http(s) URL"),
        ({"SCHEDULER_CATCHUP_WINDOW": "-1"}, "out of range"),
        ({"SCHEDULER_LOOKAHEAD_S": "61"}, "SCHEDULER_LOOKAHEAD_S=61.0 is out of range"),
        ({"SCHEDULER_LOOKAHEAD_S": "soon"}, "SCHEDULER_LOOKAHEAD_S='soon' is not a number"),
        ({"SCHEDULER_HISTORY_RETENTION_DAYS": "-1"}, "SCHEDULER_HISTORY_RETENTION_DAYS=-1.0 is out of range"),
        ({"SCHEDULER_HISTORY_RETENTION_DAYS": "30d"}, "RETENTION_DAYS='30d' is not a number"),
        ({"SCHEDULER_HISTORY_RETENTION_DAYS": "0.5"}, "must be 0 (keep everything) or at least 1 day"),
        (
            {"SCHEDULER_DATABASE_URL": "postgresql://u:pw@h/db?connect_timeout=abc"},
            "SCHEDULER_DATABASE_URL has connect_timeout='abc'; it must be a whole number",
        ),
        ({"SCHEDULER_DATABASE_URL": "host=h port=5432,x password=pw"}, "has port='5432,x'"),
        ({"SCHEDULER_API_LOCK_TIMEOUT_S": "-1"}, "SCHEDULER_API_LOCK_TIMEOUT_S=-1.0 is out of range"),
        ({"SCHEDULER_API_STATEMENT_TIMEOUT_S": "1m"}, "STATEMENT_TIMEOUT_S='1m' is not a number"),
    ],
)
def test_a_bad_value_names_its_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_connections_notice_a_vanished_host_unless_the_url_says_otherwise() -> None:
    assert connection_options("postgresql://u@db.example/scheduler").items() >= TCP_OPTIONS.items()
    own = connection_options("postgresql://u@db.example/scheduler?keepalives_idle=5&tcp_user_timeout=0")
    assert "keepalives_idle" not in own and "tcp_user_timeout" not in own, "the URL's own values win"
    assert own["keepalives_count"] == TCP_OPTIONS["keepalives_count"]


def test_a_server_that_takes_a_connection_and_never_answers_fails_the_connect_in_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stopped (or swamped) PostgreSQL: the kernel accepts the connection, nobody answers it.
    libpq alone would wait for good, and so would the component's loop."""
    assert connection_options("postgresql://u@h/db")["connect_timeout"] == 10
    monkeypatch.setitem(TCP_OPTIONS, "connect_timeout", 1)  # the default's path, in a second, not ten
    assert connection_options("postgresql://u@h/db?connect_timeout=3").get("connect_timeout") is None
    assert connection_options("host=h dbname=db connect_timeout=3").get("connect_timeout") is None
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"postgresql://u@127.0.0.1:{silent.getsockname()[1]}/db"
        began = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="timeout expired"):
            connect(url)
        assert time.monotonic() - began < 9
        with pytest.raises(psycopg.OperationalError, match="timeout expired"):
            connect(url, connect_timeout=1)  # the caller's own bound, over the default


def test_the_operators_pgconnect_timeout_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    """libpq ranks a keyword over the environment: a default passed as one would hide it."""
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "3")
    assert "connect_timeout" not in connection_options("postgresql://u@h/db")
    assert connection_options("postgresql://u@h/db")["keepalives_idle"] == TCP_OPTIONS["keepalives_idle"]
