"""`scheduler dlq replay` as a user runs it: with --json, JSON only on stdout, dry run or not; a
letter that cannot be replayed named, with why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Producer as RawProducer

from scheduler.config import Settings
from scheduler.store import connect
from tests.integration.test_schedules_cli import Cli
from tests.support import Component, components, make_dead_runs, wait_for

pytestmark = pytest.mark.integration

APP = "billing"


@pytest.fixture
def cli(settings: Settings, settings_env: dict[str, str]) -> Cli:
    """The app, with three dead runs (error class PlannedFailure)."""
    cli = Cli(settings_env)
    assert cli("apps", "create", APP, "--partitions", "1").returncode == 0
    with connect(settings.database_url) as conn:
        make_dead_runs(conn, APP, 3, "PlannedFailure: no")
    return cli


def test_a_replay_with_json_prints_its_summary_as_json_only(cli: Cli) -> None:
    nothing = cli("dlq", "replay", "--app", APP, "--error-class", "Nope", "--json")
    assert nothing.returncode == 0, nothing.stderr
    assert json.loads(nothing.stdout) | {"seconds": 0} == {"replayed": 0, "seconds": 0, "per_second": 0}

    done = cli("dlq", "replay", "--app", APP, "--error-class", "PlannedFailure", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["replayed"] == 3 and summary["seconds"] >= 0 and summary["per_second"] >= 0, summary
    assert [r["state"] for r in cli.json("runs", "list", "--app", APP, "--json")] == ["pending"] * 3

    text = cli("dlq", "replay", "--app", APP, "--force")
    assert text.returncode == 0 and text.stdout.startswith("replayed 0 runs in "), text
    assert text.stderr == "", text.stderr  # no progress bar off a terminal, nor a line where it was


def test_a_dry_run_names_each_runs_time_of_death_as_dlq_list_does(cli: Cli) -> None:
    """`dlq list --json` calls the instant a run died `dead_at`; the dry run's JSON, listing the
    same runs, called it `finished_at`: a script reading both found no `dead_at` in the second."""
    listed = {row["id"]: row["dead_at"] for row in cli.json("dlq", "list", "--app", APP, "--json")}
    dry = cli.json("dlq", "replay", "--app", APP, "--dry-run", "--json")
    assert {row["id"]: row.get("dead_at") for row in dry} == listed
    assert all("finished_at" not in row for row in dry), dry


def test_a_replay_says_how_many_runs_it_left_out_as_replayed_before(cli: Cli, settings: Settings) -> None:
    """Runs replayed once that died again are left out of a replay unless --force, and a note on
    stderr says how many; the replay exits 0 (only runs named and all left out fail it)."""
    first = cli("dlq", "replay", "--app", APP)
    assert first.returncode == 0 and first.stdout.startswith("replayed 3 runs in "), first
    assert first.stderr == "", first.stderr
    with connect(settings.database_url) as conn:  # as the reconciler leaves a run that failed again
        conn.execute("update runs set state = 'dead', finished_at = now(), error = 'PlannedFailure: no'")
        row = conn.execute("select schedule_id from runs limit 1").fetchone()
    assert row is not None
    schedule = row["schedule_id"]
    why = (
        "3 dead runs that match were replayed before (and died again) and are left out; "
        "--force takes them too, within --limit\n"
    )
    # A filter whose runs were all replayed before replays none and says why, and succeeds: a nightly
    # `dlq replay --app` must not fail until another run dies.
    again = cli("dlq", "replay", "--app", APP)
    assert again.returncode == 0 and again.stdout.startswith("replayed 0 runs in "), again
    assert again.stderr == f"note: {why}", again
    as_json = cli("dlq", "replay", "--app", APP, "--json")
    summary = json.loads(as_json.stdout)
    assert (as_json.returncode, summary["replayed"], as_json.stderr) == (0, 0, f"note: {why}"), as_json
    dry = cli("dlq", "replay", "--app", APP, "--dry-run", "--json")  # lists none, and says why
    assert (dry.returncode, json.loads(dry.stdout), dry.stderr) == (0, [], f"note: {why}"), dry
    one = cli("dlq", "replay", "--schedule", str(schedule))
    assert one.returncode == 0 and one.stdout.startswith("replayed 0 runs in "), one
    assert one.stderr == (
        "note: 1 dead run that matches was replayed before (and died again) and is left out; --force "
        "takes it too, within --limit\n"
    )
    nothing = cli("dlq", "replay", "--app", APP, "--error-class", "Other")  # none match: not an error
    assert (nothing.returncode, nothing.stderr) == (0, ""), nothing
    assert nothing.stdout.startswith("replayed 0 runs in "), nothing

    with connect(settings.database_url) as conn:
        make_dead_runs(conn, APP, 1, "PlannedFailure: no")  # and one never replayed
    dry_one = cli("dlq", "replay", "--app", APP, "--dry-run")  # one run counted in the singular
    assert dry_one.returncode == 0 and "would replay 1 run" in dry_one.stdout, dry_one
    assert "1 runs" not in dry_one.stdout, dry_one.stdout
    some = cli("dlq", "replay", "--app", APP)
    assert some.returncode == 0 and some.stdout.startswith("replayed 1 run in "), some
    assert some.stderr == f"note: {why}", some.stderr
    forced = cli("dlq", "replay", "--app", APP, "--force")
    assert forced.stdout.startswith("replayed 3 runs in ") and forced.stderr == "", forced


def test_a_replay_naming_an_undecodable_letter_says_it_cannot_be_replayed(
    cli: Cli, settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    """A job no worker could decode is a dead letter without a run: `dlq list` shows it (kind
    undecodable) with the worker that read it and wrote the letter, and a replay naming its id is
    told why it cannot take it."""
    assert cli("init").returncode == 0
    producer = RawProducer({"bootstrap.servers": settings.kafka_bootstrap})
    producer.produce(settings.jobs_topic(APP), b"\xff not a job \xfe", partition=0)
    assert producer.flush(30) == 0
    with components(settings_env, tmp_path, "reconciler"):
        worker = Component("worker", settings_env, tmp_path, "--app", APP)
        try:
            letter = wait_for(
                lambda: next(
                    (d for d in cli.json("dlq", "list", "--json") if d["kind"] == "undecodable"), None
                ),
                60,
                "the undecodable letter listed",
            )
        finally:
            assert worker.stop() == 0, worker.output()[-3000:]
    # The worker's instance name (as in runs.worker), which the letter carries: it was listed null.
    assert (letter["worker"] or "").startswith("worker-"), letter
    line = cli.refused("dlq", "replay", "--run", letter["id"])
    assert line.startswith(f"error: {letter['id']} is an undecodable dead letter, not a run"), line
    assert "nothing to replay" in line, line
    unknown = "0190a1b2-0000-7000-8000-000000000000"
    line = cli.refused("dlq", "replay", "--run", unknown)
    assert line.startswith(f"error: unknown run {unknown}: no run has that id"), line
    assert [r["state"] for r in cli.json("runs", "list", "--app", APP, "--json")] == ["dead"] * 3


def test_runs_named_past_the_limit_are_said_to_be_left_out(cli: Cli) -> None:
    """A run named and left out is never left out silently: past --limit, it was."""
    runs = [r["id"] for r in cli.json("runs", "list", "--app", APP, "--json")]
    done = cli("dlq", "replay", "--run", runs[0], "--run", runs[1], "--run", runs[2], "--limit", "2")
    assert done.returncode == 0 and done.stdout.startswith("replayed 2 runs in "), done
    assert (
        done.stderr == "note: 1 of the runs named is left out: past --limit 2, or outside the other filters\n"
    )
    assert sorted(r["state"] for r in cli.json("runs", "list", "--app", APP, "--json")) == [
        "dead",
        "pending",
        "pending",
    ]
