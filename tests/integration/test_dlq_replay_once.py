"""A replay takes each dead run once: runs that die again while later chunks of the same replay are
taken are not replayed again, even when forced (a forced replay takes runs replayed by earlier ones)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from scheduler.config import Settings
from scheduler.reconcile.replay import Replayer, ReplayFilter
from scheduler.schedule import service
from scheduler.store import connect
from tests.support import SCHEDULER, make_dead_runs

pytestmark = pytest.mark.integration

Row = dict[str, Any]
APP = "doomed"
DEAD = 30


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection[Row]]:
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values (%s, 1)", (APP,))
        make_dead_runs(conn, APP, DEAD, "HandlerFailed: no")
        yield conn


def die_again(conn: psycopg.Connection[Row]) -> None:
    """What the reconciler does to a replayed run whose handler fails again."""
    with conn.transaction():
        conn.execute("update runs set state = 'dead', finished_at = now() where state = 'pending'")


def replays(conn: psycopg.Connection[Row]) -> Counter[str]:
    rows = conn.execute("select entity_id from audit_log where action = 'replay'").fetchall()
    return Counter(row["entity_id"] for row in rows)


@pytest.mark.parametrize("force", [False, True])
def test_each_dead_run_is_replayed_once_however_soon_it_dies_again(
    conn: psycopg.Connection[Row], settings: Settings, force: bool
) -> None:
    if force:  # every run was replayed once before, by another command
        assert Replayer(settings).replay(conn, ReplayFilter(app=APP), DEAD, "earlier") == DEAD
        die_again(conn)
    replayer = Replayer(settings)
    done = replayer.replay(
        conn,
        ReplayFilter(app=APP, force=force),
        200,
        "operator",
        chunk=7,
        after_chunk=lambda _: die_again(conn),
    )
    assert done == DEAD
    counted = replays(conn)
    assert len(counted) == DEAD and set(counted.values()) == ({2} if force else {1})
    # Forced again, by a new command: each once more.
    assert replayer.replay(conn, ReplayFilter(app=APP, force=True), 200, "again", chunk=7) == DEAD


def test_the_dead_letters_are_listed_by_error_class_as_they_are_replayed(
    conn: psycopg.Connection[Row], settings_env: dict[str, str]
) -> None:
    conn.execute("update runs set error = 'HTTP503: upstream down' where id in (select id from runs limit 4)")
    conn.commit()
    listed = subprocess.run(
        [SCHEDULER, "dlq", "list", "--app", APP, "--error-class", "HTTP503", "--json"],
        env=settings_env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    rows = json.loads(listed.stdout)
    assert len(rows) == 4 and {row["error"] for row in rows} == {"HTTP503: upstream down"}
    dry = subprocess.run(
        [SCHEDULER, "dlq", "replay", "--app", APP, "--error-class", "HTTP503", "--dry-run", "--json"],
        env=settings_env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert {row["id"] for row in json.loads(dry.stdout)} == {row["id"] for row in rows}
    assert len(json.loads(subprocess.run(
        [SCHEDULER, "dlq", "list", "--app", APP, "--error-class", "HandlerFailed", "--json"],
        env=settings_env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout)) == DEAD - 4  # fmt: skip


def test_a_replay_may_name_the_dead_runs_it_takes(
    conn: psycopg.Connection[Row], settings_env: dict[str, str]
) -> None:
    """`dlq replay --run ID` takes only the runs named; one that is unknown or not dead is refused
    with one line before anything changes."""
    first, second, third, other = (r["id"] for r in conn.execute("select id from runs limit 4").fetchall())
    conn.execute("update runs set state = 'succeeded' where id = %s", (other,))
    conn.commit()

    def replay(*args: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SCHEDULER, "dlq", "replay", *map(str, args)],
            env=settings_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    unknown = uuid.uuid4()
    for args, refusal in (
        (("--run", first, "--run", unknown), f"error: unknown run {unknown}"),
        (("--run", other, "--run", first), f"error: run {other} is succeeded, not dead"),
        (("--run", "nonsense"), "'nonsense' is not an id"),
    ):
        refused = replay(*args)
        assert refused.returncode == 2, refused
        assert refusal in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert replays(conn) == Counter(), "a refused replay changes nothing"

    dry = replay("--run", first, "--run", second, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert {row["id"] for row in json.loads(dry.stdout)} == {str(first), str(second)}
    done = replay("--run", first, "--run", second, "--run", first)
    assert done.returncode == 0 and done.stdout.startswith("replayed 2 runs"), (done.stdout, done.stderr)
    assert replays(conn) == Counter({str(first): 1, str(second): 1})
    states = conn.execute("select state, count(*) as n from runs group by state order by state").fetchall()
    assert states == [
        {"state": "dead", "n": DEAD - 3},
        {"state": "pending", "n": 2},
        {"state": "succeeded", "n": 1},
    ]
    conn.commit()
    # Replayed already: named again without --force, it is left out and the command says why. The
    # one run named and nothing replayed exited 0 ("replayed 0 runs"): now 1, with why in one line.
    die_again(conn)
    why = f"run {first} was replayed before (and died again) and is left out; --force takes it too\n"
    dry_again = replay("--run", first, "--dry-run")
    assert dry_again.returncode == 0 and dry_again.stderr == f"note: {why}", dry_again
    again = replay("--run", first)
    assert (again.returncode, again.stdout, again.stderr) == (1, "", f"error: nothing replayed: {why}")
    # One outside the other filters (another schedule's) is told apart from one replayed before.
    row = conn.execute("select schedule_id from runs where id = %s", (first,)).fetchone()
    assert row is not None
    outside = replay("--run", first, "--run", third, "--schedule", row["schedule_id"])
    assert (outside.returncode, outside.stdout) == (1, ""), outside
    assert outside.stderr == (
        "note: 1 of the runs named is left out: outside the other filters\n"
        "error: nothing replayed: 1 of the runs named was replayed before (and died again) and is left "
        "out; --force takes it too, within --limit\n"
    )
    alone_outside = replay("--run", third, "--schedule", row["schedule_id"])
    assert (alone_outside.returncode, alone_outside.stderr) == (
        1,
        "error: nothing replayed: 1 of the runs named is left out: outside the other filters\n",
    ), alone_outside
    # Some replayed: exit 0, and the note says which were left out.
    some = replay("--run", first, "--run", third)
    assert some.returncode == 0 and some.stdout.startswith("replayed 1 run "), some
    assert some.stderr == (
        "note: 1 of the runs named was replayed before (and died again) and is left out; --force takes "
        "it too, within --limit\n"
    )
    assert replays(conn) == Counter({str(first): 1, str(second): 1, str(third): 1})
    forced = replay("--run", first, "--force")
    assert forced.stdout.startswith("replayed 1 run ") and forced.stderr == "", forced


def test_a_replay_leaves_out_the_runs_of_cancelled_schedules_unless_it_names_them(
    conn: psycopg.Connection[Row], settings_env: dict[str, str]
) -> None:
    """A job its owner cancelled is not run again by a replay of everything that failed; naming its
    schedule or the run replays it."""
    row = conn.execute("select id, schedule_id from runs order by id limit 1").fetchone()
    assert row is not None
    run_id, schedule_id = str(row["id"]), row["schedule_id"]
    service.cancel(conn, schedule_id, "owner")
    conn.commit()

    def dry(*args: str) -> tuple[set[str], str]:
        done = subprocess.run(
            [SCHEDULER, "dlq", "replay", "--dry-run", "--json", "--limit", "1000", *args],
            env=settings_env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return {r["id"] for r in json.loads(done.stdout)}, done.stderr

    everything, said = dry("--app", APP)
    assert len(everything) == DEAD - 1 and run_id not in everything
    assert "note: 1 dead run of a cancelled schedule matches and is left out" in said, said
    assert dry("--schedule", str(schedule_id)) == ({run_id}, "")
    assert dry("--run", run_id) == ({run_id}, "")
    replayed = subprocess.run(
        [SCHEDULER, "dlq", "replay", "--app", APP, "--limit", "1000"],
        env=settings_env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert replayed.stdout.startswith(f"replayed {DEAD - 1} runs"), replayed.stdout
    assert conn.execute("select state from runs where id = %s", (run_id,)).fetchone() == {"state": "dead"}
