"""`dlq replay --run ID` when another command replays the run while this one replays it: between
the check that the runs named are dead and the listing, or between the listing and the replay.
The run is left out, and no other reason explains it: the command said "replayed 0 runs" and exited
0 (or, the first time, blamed the other filters). A run named and not replayed fails the command,
exit 1, with why in one line, as the other reasons do; among others replayed it is a note.

The other command is injected in-process (the CLI run by click's runner, on the test's database),
at the one moment each race needs, as no test could time it from outside."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
import pytest
from click.testing import CliRunner, Result

from scheduler.cli import main
from scheduler.config import Settings
from scheduler.reconcile.replay import Replayer, ReplayFilter
from scheduler.store import connect
from tests.support import make_dead_runs

pytestmark = pytest.mark.integration

Row = dict[str, Any]
APP = "raced"

dlq_command = importlib.import_module("scheduler.cli.dlq")  # the package's `dlq` is the click group


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection[Row]]:
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values (%s, 1)", (APP,))
        make_dead_runs(conn, APP, 3, "HandlerFailed: no")
        yield conn


@pytest.fixture
def dead(conn: psycopg.Connection[Row]) -> list[UUID]:
    return [row["id"] for row in conn.execute("select id from runs order by id").fetchall()]


def another_replay(settings: Settings, run_id: UUID) -> None:
    """Another command's replay of the run, committed."""
    with connect(settings.database_url) as other:
        assert Replayer(settings).replay(other, ReplayFilter(run_ids=(run_id,)), 1, "cli:other") == 1


def changed(run_id: UUID) -> str:
    """What the command says of a run named that changed under it."""
    return (
        f"run {run_id} changed while replaying (it is pending now: another command replayed or "
        "changed it since it was listed)"
    )


def states(conn: psycopg.Connection[Row]) -> dict[UUID, str]:
    conn.commit()
    return {row["id"]: row["state"] for row in conn.execute("select id, state from runs").fetchall()}


def replayed_by(conn: psycopg.Connection[Row], actor_prefix: str) -> list[str]:
    rows = conn.execute(
        "select entity_id from audit_log where action = 'replay' and actor like %s order by entity_id",
        (actor_prefix + "%",),
    ).fetchall()
    return [str(row["entity_id"]) for row in rows]


@dataclass
class Race:
    """The test's dead runs, and the other command, injected where each race needs it."""

    monkeypatch: pytest.MonkeyPatch
    settings: Settings
    env: dict[str, str]
    conn: psycopg.Connection[Row]
    dead: list[UUID]

    def after_listing(self, run_id: UUID) -> None:
        """The other command replays ``run_id`` once this one has listed it, before it replays."""
        listed: Callable[..., Any] = Replayer.candidates

        def candidates(replayer: Replayer, *args: Any, **kwargs: Any) -> Any:
            found = listed(replayer, *args, **kwargs)
            another_replay(self.settings, run_id)
            return found

        self.monkeypatch.setattr(Replayer, "candidates", candidates)

    def before_listing(self, run_id: UUID) -> None:
        """The other command replays ``run_id`` once this one has found it dead, before it lists."""
        checked = dlq_command.first_not_dead

        def first_not_dead(*args: Any, **kwargs: Any) -> Any:
            refused = checked(*args, **kwargs)
            another_replay(self.settings, run_id)
            return refused

        self.monkeypatch.setattr(dlq_command, "first_not_dead", first_not_dead)

    def replay(self, *args: str) -> Result:
        return CliRunner().invoke(main, ["dlq", "replay", *args], env=self.env, catch_exceptions=False)


@pytest.fixture
def race(
    monkeypatch: pytest.MonkeyPatch,
    settings: Settings,
    settings_env: dict[str, str],
    conn: psycopg.Connection[Row],
    dead: list[UUID],
) -> Race:
    return Race(monkeypatch, settings, settings_env, conn, dead)


def test_a_run_named_that_another_command_replays_after_the_listing_fails_the_replay(race: Race) -> None:
    run_id = race.dead[0]
    race.after_listing(run_id)
    result = race.replay("--run", str(run_id))
    assert (result.exit_code, result.stdout) == (1, ""), (result.stdout, result.stderr)
    assert result.stderr == f"error: nothing replayed: {changed(run_id)}\n"
    assert replayed_by(race.conn, "cli:other") == [str(run_id)] and len(replayed_by(race.conn, "")) == 1


def test_among_runs_replayed_a_run_named_that_another_command_replays_is_a_note(race: Race) -> None:
    raced, other = race.dead[0], race.dead[1]
    race.after_listing(raced)
    result = race.replay("--run", str(raced), "--run", str(other))
    assert result.exit_code == 0 and result.stdout.startswith("replayed 1 run in "), result.stdout
    assert result.stderr == f"note: {changed(raced)}\n"
    assert states(race.conn) == {raced: "pending", other: "pending", race.dead[2]: "dead"}


def test_a_run_named_that_another_command_replays_before_the_listing_is_said_to_have_changed(
    race: Race,
) -> None:
    """Found dead by the check, then replayed by the other command: the listing left it out, and
    the command blamed the other filters (there were none)."""
    run_id = race.dead[0]
    race.before_listing(run_id)
    result = race.replay("--run", str(run_id))
    assert (result.exit_code, result.stdout) == (1, ""), (result.stdout, result.stderr)
    assert result.stderr == f"error: nothing replayed: {changed(run_id)}\n"
    assert replayed_by(race.conn, "") == [str(run_id)]


def test_a_run_named_that_another_command_is_replaying_right_now_is_not_blamed_on_the_filters(
    race: Race,
) -> None:
    """The other command's transaction holds the run (its chunk not yet committed): the listing
    skips it (SKIP LOCKED), and the command said it was outside the other filters; there were none."""
    held, other = race.dead[0], race.dead[1]
    with connect(race.settings.database_url) as replaying:
        replaying.execute("select 1 from runs where id = %s for update", (held,))
        alone = race.replay("--run", str(held))
        among = race.replay("--run", str(held), "--run", str(other))
    why = f"run {held} is left out: another command is replaying or changing it right now"
    assert (alone.exit_code, alone.stdout, alone.stderr) == (1, "", f"error: nothing replayed: {why}\n")
    assert among.exit_code == 0 and among.stdout.startswith("replayed 1 run in "), among.stdout
    assert among.stderr == f"note: {why}\n"
    assert states(race.conn) == {held: "dead", other: "pending", race.dead[2]: "dead"}
