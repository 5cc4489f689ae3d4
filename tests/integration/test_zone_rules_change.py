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
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from tests.integration.test_schedules_cli import Cli, app, cli  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration

PERMANENT_EDT = timezone(timedelta(hours=-4))


def new_york_keeps_edt(folder: Path) -> dict[str, str]:
    """A zone folder in which America/New_York is UTC-4 all year; the environment that uses it
    (every other zone still comes from the tzdata package, as before)."""
    (folder / "America").mkdir(parents=True)
    fixed = importlib.resources.files("tzdata").joinpath("zoneinfo/Etc/GMT+4").read_bytes()
    (folder / "America" / "New_York").write_bytes(fixed)
    return {"PYTHONTZPATH": str(folder)}


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
