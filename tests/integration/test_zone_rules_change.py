"""A zone's daylight-saving rules change (a tzdata update): the next fire follows the new rules.

Governments change their zones' rules often, with a few months' notice at best (Egypt 2023,
Greenland 2023, Paraguay 2024; the US Sunshine Protection Act would make EDT permanent). The
operator installs the new tzdata and restarts; from then on a cron schedule's wall time means the
new offsets. Here New York keeps EDT (UTC-4) all year: the zone's file is replaced, as a tzdata
update replaces it, through PYTHONTZPATH for the CLI's processes. Expectations are computed from
the new offset by hand, never by the scheduler's functions.
"""

from __future__ import annotations

import importlib.resources
import logging
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from scheduler.config import Settings
from scheduler.domain.zone_rules import LoadedZoneRules, ZoneRulesVersion
from scheduler.scan.zone_rules import ZoneRulesRecompute
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, schedules
from scheduler.store import zone_rules as zone_rules_store
from scheduler.store.database import Database
from tests.integration.test_schedules_cli import Cli, app, cli  # noqa: F401 (fixtures)
from tests.support import Component, stop_all, wait_for

pytestmark = pytest.mark.integration

PERMANENT_EDT = timezone(timedelta(hours=-4))


def new_york_keeps_edt(folder: Path) -> dict[str, str]:
    """A zone folder in which America/New_York is UTC-4 all year; the environment that uses it
    (every other zone still comes from the tzdata package, as before)."""
    (folder / "America").mkdir(parents=True)
    fixed = importlib.resources.files("tzdata").joinpath("zoneinfo/Etc/GMT+4").read_bytes()
    (folder / "America" / "New_York").write_bytes(fixed)
    return {"PYTHONTZPATH": str(folder)}


def zone_database(folder: Path, release: str | None) -> dict[str, str]:
    """As :func:`new_york_keeps_edt`, the folder a zone database of IANA release ``release``
    (its ``tzdata.zi`` says so, as every copy's does), or of no release that can be told."""
    env = new_york_keeps_edt(folder)
    if release is not None:
        (folder / "tzdata.zi").write_text(f"# version {release}\n# the zones' files are beside it\n")
    return env


def test_a_stored_next_fire_follows_the_zones_new_rules(cli: Cli, app: str, tmp_path: Path) -> None:  # noqa: F811
    """`0 9 1 12 *` in New York, created under today's rules, is due 1 December at 09:00 EST
    (14:00Z). Once New York keeps EDT, 09:00 there is 13:00Z: `cron next` says so, but the schedule
    keeps 14:00Z, and the scanner fires it then, at 10:00 on New York's clocks (and only the fire
    after it is computed under the new rules). Pausing and resuming does not mend it either."""
    created = cli.json(
        "schedules", "create", "--app", app, "--cron", "0 9 1 12 *", "--tz", "America/New_York",
        "--handler", "builtin:noop",
    )  # fmt: skip
    before = datetime.fromisoformat(created["next_fire_at"])
    assert before.astimezone(ZoneInfo("America/New_York")).hour == 9  # EST, today's rules
    new_rules = Cli(cli.env | new_york_keeps_edt(tmp_path / "zoneinfo"))
    nine_edt = datetime(before.year, 12, 1, 9, tzinfo=PERMANENT_EDT)

    [previewed] = new_rules.json(
        "cron", "next", "0 9 1 12 *", "--tz", "America/New_York", "--after", created["created_at"],
        "--count", "1", "--json",
    )  # fmt: skip
    assert datetime.fromisoformat(previewed["utc"]) == nine_edt, "the new rules are in force"

    new_rules.json("schedules", "pause", created["id"])
    resumed = new_rules.json("schedules", "resume", created["id"])
    shown = new_rules.json("schedules", "get", created["id"])
    for row in (resumed, shown):
        next_fire = datetime.fromisoformat(row["next_fire_at"])
        assert next_fire == nine_edt, (
            f"next fire {next_fire.astimezone(PERMANENT_EDT).isoformat()} on New York's new clocks, "
            f"where `cron next` previews {nine_edt.isoformat()}"
        )


def schedule_row(settings: Settings, schedule_id: str) -> dict[str, Any]:
    with connect(settings.database_url, autocommit=True) as conn:
        row = conn.execute(
            "select next_fire_at, version, state from schedules where id = %s", (schedule_id,)
        ).fetchone()
    assert row is not None
    return dict(row)


def recorded_zone_rules(settings: Settings) -> dict[str, Any]:
    with connect(settings.database_url, autocommit=True) as conn:
        row = conn.execute("select version, done_at from zone_rules").fetchone()
    assert row is not None
    return dict(row)


def test_a_scanner_under_newer_zone_rules_moves_the_stored_fires_beyond_its_look_ahead(
    cli: Cli,  # noqa: F811
    app: str,  # noqa: F811
    settings: Settings,
    tmp_path: Path,
) -> None:
    """A scanner started under a newer zone database (release 2999a, where New York keeps EDT)
    computes the stored next fires again: `0 9 1 12 *` moves from 14:00Z to 13:00Z, 09:00 on the new
    clocks, without a new version (no user changed it). A fire within the look-ahead (60 s here) is
    left as it is, however the new rules would have it: it may be leased or made already. The
    release is recorded once the pass is done."""
    far = cli.json(
        "schedules", "create", "--app", app, "--cron", "0 9 1 12 *", "--tz", "America/New_York",
        "--handler", "builtin:noop",
    )  # fmt: skip
    near = cli.json(
        "schedules", "create", "--app", app, "--cron", "* * * * *", "--tz", "America/New_York",
        "--handler", "builtin:noop", "--overlap", "skip",
    )  # fmt: skip
    # Due 50 s from now, at an instant no rules give (not a whole minute): computed again, it would
    # move. Overlap skip: the scanner leases it only at its instant, well after the pass.
    with connect(settings.database_url, autocommit=True) as conn:
        conn.execute(
            "update schedules set next_fire_at = now() + interval '50.5 seconds' where id = %s", (near["id"],)
        )
    near_before = schedule_row(settings, near["id"])
    before = datetime.fromisoformat(far["next_fire_at"])
    nine_edt = datetime(before.year, 12, 1, 9, tzinfo=PERMANENT_EDT)
    assert before == nine_edt + timedelta(hours=1), "stored under today's rules: 09:00 EST"
    assert recorded_zone_rules(settings)["version"] is None, "no release recorded before"

    env = cli.env | zone_database(tmp_path / "zoneinfo", "2999a") | {"SCHEDULER_LOOKAHEAD_S": "60"}
    scanner = Component("scanner", env, tmp_path)
    try:
        recorded = wait_for(
            lambda: (r := recorded_zone_rules(settings))["done_at"] is not None and r,
            60,
            "the scanner to record the zone rules it computed the fires under",
        )
    finally:
        assert scanner.stop() == 0, scanner.output()[-3000:]
    assert recorded["version"] == "2999a"
    moved = schedule_row(settings, far["id"])
    assert moved["next_fire_at"] == nine_edt, (
        f"next fire {moved['next_fire_at'].astimezone(PERMANENT_EDT).isoformat()} on New York's new "
        f"clocks, where the new rules give {nine_edt.isoformat()}"
    )
    assert (moved["version"], moved["state"]) == (far["version"], "active")
    assert schedule_row(settings, near["id"]) == near_before, "a fire within the look-ahead is left"
    assert "1 fires moved" in scanner.output(), scanner.output()[-3000:]


@pytest.mark.parametrize(
    ("release", "said"),
    [("1999a", "newer than those loaded"), (None, "no release that can be told")],
    ids=["older-release", "no-release"],
)
def test_a_process_under_older_or_unknown_zone_rules_leaves_the_stored_fires(
    cli: Cli,  # noqa: F811
    app: str,  # noqa: F811
    settings: Settings,
    tmp_path: Path,
    release: str | None,
    said: str,
) -> None:
    """The fires follow release 2025a, recorded. A scanner of an older image still running during a
    rolling update (release 1999a), or one whose zone folder says no release, must not move them
    back to the rules it has: New York keeping EDT there, `0 9 1 12 *` stays at 14:00Z, and the
    record stays 2025a. It says why, once."""
    far = cli.json(
        "schedules", "create", "--app", app, "--cron", "0 9 1 12 *", "--tz", "America/New_York",
        "--handler", "builtin:noop",
    )  # fmt: skip
    with connect(settings.database_url, autocommit=True) as conn:
        conn.execute("update zone_rules set version = '2025a', claimed_at = now(), done_at = now()")
    before = schedule_row(settings, far["id"])
    recorded = recorded_zone_rules(settings)

    scanner = Component("scanner", cli.env | zone_database(tmp_path / "zoneinfo", release), tmp_path)
    try:
        wait_for(lambda: said in scanner.output(), 60, f"the scanner to say {said!r}")
    finally:
        assert scanner.stop() == 0, scanner.output()[-3000:]
    assert schedule_row(settings, far["id"]) == before
    assert recorded_zone_rules(settings) == recorded
    assert scanner.output().count(said) == 1, scanner.output()[-3000:]


def test_scanners_started_together_under_new_zone_rules_make_one_pass(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    """Scanners run as several replicas ("any number"), and a rollout of a new image starts them
    within seconds of each other. The docs: "The first scanner of a release ... makes one such
    pass", and `done_at` is "null while a pass is under way (a pass cut short is made again by the
    next scanner under the same rules)". A second scanner that starts while the first one's pass is
    under way (not cut short: its process is alive, its batches commit) must leave it to it. It
    claims the release again (the claim compares the release only) and makes a whole pass of its
    own beside it: every active cron schedule read, locked and computed twice, and each further
    replica, or one idle for 30 s (JUDGE_EVERY_S) during a long pass, adds another."""
    with connect(settings.database_url, autocommit=True) as conn:
        schedules.create_app(conn, "billing", 1)
        spec = ScheduleSpec(
            app="billing", handler="builtin:noop", kind="cron", cron="0 9 1 12 *", tz="America/New_York"
        )
        first = service.create_schedule(conn, spec, "test")
        # 50,000 schedules as the first, each under a name of its own: a pass of several seconds.
        conn.execute(
            "insert into schedules (id, name, app, kind, cron, tz, handler, payload, max_attempts,"
            " backoff_base_ms, backoff_max_ms, timeout_ms, misfire_policy, overlap_policy, jitter_ms, state,"
            " next_fire_at, version, created_at, updated_at)"
            " select gen_random_uuid(), 'nightly-' || n, app, kind, cron, tz, handler, payload, max_attempts,"
            "        backoff_base_ms, backoff_max_ms, timeout_ms, misfire_policy, overlap_policy, jitter_ms,"
            "        state, next_fire_at, version, now(), now()"
            "   from schedules, generate_series(1, 50000) n where id = %s",
            (first["id"],),
        )
    env = settings_env | zone_database(tmp_path / "zoneinfo", "2999a")
    passing = "computing stored next fires again"
    one = Component("scanner", env, tmp_path)
    two: Component | None = None
    try:
        wait_for(lambda: passing in one.output(), 60, "the first scanner to start its pass")
        assert recorded_zone_rules(settings)["done_at"] is None, "the first pass is under way"
        two = Component("scanner", env, tmp_path)
        wait_for(lambda: recorded_zone_rules(settings)["done_at"] is not None, 120, "the pass to be done")
        wait_for(lambda: "stored next fires follow" in two.output(), 120, "the second scanner to judge")
    finally:
        stop_all([one] if two is None else [one, two])
    assert passing not in two.output(), "the second scanner made a pass of its own beside the first's"


def test_a_pass_whose_scanner_stopped_is_taken_over_from_where_it_stopped(
    cli: Cli,  # noqa: F811
    app: str,  # noqa: F811
    settings: Settings,
    tmp_path: Path,
) -> None:
    """A scanner under release 2999a moved the fires of the schedules up to the first one's id,
    renewed its pass's lease with its last batch, and stopped (its pod evicted): the lease has run
    out, the pass is not done. The next scanner under the same rules takes the pass over from where
    it stopped: the fire after that position moves to 09:00 on New York's new clocks, the one before
    it is not computed again (left as the record says it was moved), and the pass is done."""
    create = ("schedules", "create", "--app", app, "--cron", "0 9 1 12 *", "--tz", "America/New_York")
    made = [cli.json(*create, "--handler", "builtin:noop", "--name", f"nightly-{n}") for n in range(2)]
    before, after = sorted(made, key=lambda s: uuid.UUID(s["id"]))
    with connect(settings.database_url, autocommit=True) as conn:
        conn.execute(
            "update zone_rules set version = '2999a', pass_id = gen_random_uuid(),"
            " claimed_at = now() - interval '10 minutes', lease_until = now() - interval '1 minute',"
            " resume_after = %s, done_at = null",
            (before["id"],),
        )
    stored = datetime.fromisoformat(before["next_fire_at"])
    nine_edt = datetime(stored.year, 12, 1, 9, tzinfo=PERMANENT_EDT)

    scanner = Component("scanner", cli.env | zone_database(tmp_path / "zoneinfo", "2999a"), tmp_path)
    try:
        wait_for(lambda: recorded_zone_rules(settings)["done_at"] is not None, 60, "the pass to be done")
    finally:
        assert scanner.stop() == 0, scanner.output()[-3000:]
    assert schedule_row(settings, after["id"])["next_fire_at"] == nine_edt
    assert schedule_row(settings, before["id"])["next_fire_at"] == stored
    assert "taking over the pass a scanner left unfinished" in scanner.output(), scanner.output()[-3000:]
    assert "1 active cron schedules checked" in scanner.output(), scanner.output()[-3000:]


def finished_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The zone-rules pass's last line, once it has said it."""
    said = [record.getMessage() for record in caplog.records]
    return [line for line in said if "computed again under zone rules 2999a in" in line]


def test_a_batch_rolled_back_is_made_again_not_skipped(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch of the pass whose transaction fails (a transient error: the connection dropped while
    it wrote its fires) is rolled back and retried, as every service's step is. The retry makes
    that batch again: the pass checks every one of the 1,200 schedules. (The pass's position once
    moved before its batch committed, so the retry went on after the failed batch's 500 schedules,
    which kept their old-rules fires, and recorded that position for a takeover.)"""
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values ('zone-batches', 1)")
        for _ in range(2):
            batch = [
                service.NewSchedule(
                    ScheduleSpec(
                        app="zone-batches",
                        handler="builtin:noop",
                        kind="cron",
                        cron="0 9 1 12 *",
                        tz="America/New_York",
                    )
                )
                for _ in range(600)
            ]
            service.create_schedules(conn, batch, "test")
        conn.commit()
    writes = {"n": 0}
    move_next_fires = zone_rules_store.move_next_fires

    def fails_once(conn: Any, moves: Any) -> Any:
        writes["n"] += 1
        if writes["n"] == 2:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return move_next_fires(conn, moves)

    monkeypatch.setattr(zone_rules_store, "move_next_fires", fails_once)
    newer = LoadedZoneRules(ZoneRulesVersion.parse("2999a"), "a test's zone database")
    recompute = ZoneRulesRecompute(Database(settings.database_url, "test"), 60.0, newer)
    caplog.set_level(logging.INFO, logger="scheduler.zone-rules")
    try:
        # Steps as the service's loop takes them, until the pass says it is done (or 20 steps:
        # three batches, one made again, the end).
        for _ in range(20):
            try:
                recompute.step()
            except psycopg.OperationalError:
                recompute.reset()  # as the service's loop does on a transient error
            if finished_lines(caplog):
                break
    finally:
        recompute.close()
    [finished] = finished_lines(caplog)
    assert ": 1200 active cron schedules checked" in finished, finished
    assert writes["n"] == 4, "three batches and the one made again"
