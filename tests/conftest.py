"""The test harness: the real local stack, one database and one topic prefix per test.

When ``SCHEDULER_DATABASE_URL`` and ``SCHEDULER_KAFKA_BOOTSTRAP`` are set the suite uses them;
otherwise it brings the project's own stack up (``scheduler dev up``) and stops it at the end if it
started it. Each test gets a fresh database cloned from a migrated template, and its own topic
prefix, so tests never see each other's rows or messages.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from scheduler.config import Settings, load_settings
from scheduler.devstack import LocalStack
from scheduler.kafka.transport import TopicAdmin
from scheduler.store import connect
from scheduler.store.migrate import migrate


@dataclass(frozen=True)
class StackInfo:
    database_url: str
    kafka_bootstrap: str
    template_db: str

    def url_for(self, database: str) -> str:
        return self.database_url.rsplit("/", 1)[0] + f"/{database}"


_STACK_STARTED = pytest.StashKey[LocalStack]()


def pytest_configure(config: pytest.Config) -> None:
    """Run by several processes (``-n N``, as ``make test`` does), the suite brings the stack up here,
    in the process that hands the tests out, before any worker starts: each worker's ``stack``
    fixture would otherwise race the others to start the same PostgreSQL and Kafka. The workers
    find them in the environment they inherit. A suite run in one process starts the stack only
    when a test needs it (the fixture), so a run of unit tests alone never does; nor does a
    distributed run given only paths under tests/unit."""
    distributed = not hasattr(config, "workerinput") and (config.getoption("numprocesses", None) or 0) > 0
    if (
        not distributed
        or unit_only(config.args)
        or (os.environ.get("SCHEDULER_DATABASE_URL") and os.environ.get("SCHEDULER_KAFKA_BOOTSTRAP"))
    ):
        return
    local, env, to_stop = _local_stack_up()
    os.environ.update(env)
    if to_stop:
        config.stash[_STACK_STARTED] = local


UNIT_TESTS = Path(__file__).resolve().parent / "unit"


def unit_only(args: list[str]) -> bool:
    """Whether the paths the suite was given are all unit tests (``pytest -n 2 tests/unit``), which
    need no stack: a distributed run of them alone does not bring it up either."""
    paths = [Path(arg.split("::", 1)[0]).resolve() for arg in args]
    return bool(paths) and all(path.is_relative_to(UNIT_TESTS) for path in paths)


def _local_stack_up() -> tuple[LocalStack, dict[str, str], bool]:
    """The project's own stack, brought up; its address, and whether the suite stops it at the end
    (it started it, and SCHEDULER_KEEP_STACK does not keep it)."""
    local = LocalStack(load_settings())
    started_here = not all(part.running for part in local.status())
    local.up()
    return local, local.env(), started_here and not os.environ.get("SCHEDULER_KEEP_STACK")


def pytest_unconfigure(config: pytest.Config) -> None:
    local = config.stash.get(_STACK_STARTED, None)
    if local is not None:
        local.down()


@pytest.fixture(scope="session")
def stack() -> Iterator[StackInfo]:
    database_url = os.environ.get("SCHEDULER_DATABASE_URL")
    bootstrap = os.environ.get("SCHEDULER_KAFKA_BOOTSTRAP")
    to_stop: LocalStack | None = None
    if not (database_url and bootstrap):
        local, env, stop_at_end = _local_stack_up()
        to_stop = local if stop_at_end else None
        database_url, bootstrap = env["SCHEDULER_DATABASE_URL"], env["SCHEDULER_KAFKA_BOOTSTRAP"]
    info = StackInfo(database_url, bootstrap, f"sched_template_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'create database "{info.template_db}"')
    with connect(info.url_for(info.template_db)) as conn:
        migrate(conn)
    try:
        yield info
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{info.template_db}" with (force)')
        if to_stop is not None:
            to_stop.down()


@contextmanager
def fresh_database(stack: StackInfo) -> Iterator[str]:
    """A migrated database cloned from the template, dropped at the end."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        admin.execute(f'create database "{name}" template "{stack.template_db}"')
    try:
        yield stack.url_for(name)
    finally:
        with psycopg.connect(stack.database_url, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture
def database_url(stack: StackInfo) -> Iterator[str]:
    """A fresh, migrated database of this test's own."""
    with fresh_database(stack) as url:
        yield url


# Workers run only registered Python handlers: the tests' own, importable from the project root.
TEST_HANDLERS = "tests.unit.handler_fixtures"
PROJECT_ROOT = str(Path(__file__).resolve().parents[1])


def stack_env(stack: StackInfo, database_url: str, prefix: str) -> dict[str, str]:
    """The environment of a process that uses ``database_url`` and topic ``prefix`` on the stack."""
    return (
        dict(os.environ)
        | _test_handlers_env()
        | {
            "SCHEDULER_DATABASE_URL": database_url,
            "SCHEDULER_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
            "SCHEDULER_TOPIC_PREFIX": prefix,
        }
    )


def _test_handlers_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {
        "SCHEDULER_HANDLERS": os.environ.get("SCHEDULER_HANDLERS") or TEST_HANDLERS,
        "PYTHONPATH": PROJECT_ROOT if not path else f"{PROJECT_ROOT}{os.pathsep}{path}",
    }


@pytest.fixture
def settings(stack: StackInfo, database_url: str) -> Iterator[Settings]:
    """Settings for this test: its own database and its own topic prefix (topics deleted after)."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield load_settings(stack_env(stack, database_url, prefix))
    admin = TopicAdmin(stack.kafka_bootstrap)
    admin.delete_topics([t for t in admin.topics() if t.startswith(f"{prefix}.")])


@pytest.fixture
def settings_env(settings: Settings) -> dict[str, str]:
    """The environment a subprocess (the CLI, a component) needs to use this test's settings."""
    return (
        dict(os.environ)
        | _test_handlers_env()
        | {
            "SCHEDULER_DATABASE_URL": settings.database_url,
            "SCHEDULER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "SCHEDULER_TOPIC_PREFIX": settings.topic_prefix,
        }
    )


@pytest.fixture
def empty_database_url(stack: StackInfo) -> Iterator[str]:
    """A database with no schema at all, for migration tests."""
    name = f"e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
    try:
        yield stack.url_for(name)
    finally:
        with psycopg.connect(stack.database_url, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')
