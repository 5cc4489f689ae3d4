"""`scheduler schedules create/update`: --start and --end bound cron schedules only."""

from __future__ import annotations

import pytest

from scheduler.config import Settings
from scheduler.store import connect
from tests.integration.test_schedules_cli import Cli, app, cli  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration


def test_a_one_shot_with_start_or_end_is_refused(cli: Cli, app: str) -> None:  # noqa: F811
    for bounds in (["--end", "2027-01-01T00:00:00Z"], ["--start", "2027-01-01T00:00:00Z"]):
        line = cli.refused(
            "schedules", "create", "--app", app, "--at", "2027-06-01T00:00:00Z", "--handler", "builtin:noop",
            *bounds,
        )  # fmt: skip
        assert "start_at and end_at bound a cron schedule" in line, line
        line = cli.refused("schedules", "create", "--app", app, "--now", "--handler", "builtin:noop", *bounds)
        assert "start_at and end_at bound a cron schedule" in line, line


def test_update_at_of_a_bounded_cron_schedule_drops_its_bounds(cli: Cli, app: str) -> None:  # noqa: F811
    bounded = cli.json(
        "schedules", "create", "--app", app, "--cron", "0 9 * * *", "--handler", "builtin:noop",
        "--start", "2027-01-01T00:00:00Z", "--end", "2027-03-01T00:00:00Z",
    )  # fmt: skip
    one_shot = cli.json("schedules", "update", bounded["id"], "--at", "2027-06-01T00:00:00Z")
    assert (one_shot["kind"], one_shot["start_at"], one_shot["end_at"]) == ("delayed", None, None)


def test_a_one_shot_stored_with_bounds_stays_updatable(cli: Cli, app: str, settings: Settings) -> None:  # noqa: F811
    """One created with bounds before they were refused: an update drops them."""
    one_shot = cli.json(
        "schedules", "create", "--app", app, "--at", "2027-06-01T00:00:00Z", "--handler", "builtin:noop"
    )
    with connect(settings.database_url) as conn:
        conn.execute(
            "update schedules set start_at = '2027-01-01Z', end_at = '2027-03-01Z' where id = %s",
            (one_shot["id"],),
        )
        conn.commit()
    renamed = cli.json("schedules", "update", one_shot["id"], "--name", "renamed")
    assert (renamed["name"], renamed["start_at"], renamed["end_at"]) == ("renamed", None, None)
