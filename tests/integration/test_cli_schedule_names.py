"""Every command that acts on a schedule, or filters by one, takes its id or APP/KEY (as Kafka commands
name it); every schedule the CLI prints carries its key; and `trigger` is versioned as the other
changes."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.support import SCHEDULER

pytestmark = pytest.mark.integration


class Cli:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SCHEDULER, *args], env=self.env, capture_output=True, text=True, check=False, timeout=60
        )

    def json(self, *args: str) -> Any:
        done = self(*args)
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", done.stderr
        return json.loads(done.stdout)

    def refused(self, *args: str, code: int) -> str:
        """The one line a refused command prints (stderr, exit ``code``, nothing on stdout)."""
        done = self(*args)
        assert done.returncode == code, done
        assert done.stdout == "" and "Traceback" not in done.stderr, done
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
        return done.stderr.rstrip("\n")


@pytest.fixture
def cli(settings_env: dict[str, str]) -> Cli:
    cli = Cli(settings_env)
    assert cli("apps", "create", "billing", "--partitions", "1").returncode == 0
    return cli


def nightly(cli: Cli) -> dict[str, Any]:
    created: dict[str, Any] = cli.json(
        "schedules", "create", "--app", "billing", "--cron", "30 2 * * *", "--handler", "builtin:noop",
        "--key", "nightly",
    )  # fmt: skip
    return created


def test_a_schedule_is_changed_and_found_by_app_and_key(cli: Cli) -> None:
    """pause, resume, update, trigger, cancel and the filters by schedule took only the UUID."""
    created = nightly(cli)
    sid = created["id"]
    assert cli.json("schedules", "pause", "billing/nightly")["state"] == "paused"
    assert cli.json("schedules", "resume", "billing/nightly", "--expect-version", "2")["state"] == "active"
    assert cli.json("schedules", "update", "billing/nightly", "--name", "renamed")["name"] == "renamed"
    run_id = cli.json("schedules", "trigger", "billing/nightly")["run_id"]
    assert [r["id"] for r in cli.json("runs", "list", "--schedule", "billing/nightly", "--json")] == [run_id]
    assert cli.json("dlq", "list", "--schedule", "billing/nightly", "--json") == []
    assert cli.json("dlq", "replay", "--schedule", "billing/nightly", "--dry-run", "--json") == []
    audited = cli.json("audit", "list", "--id", "billing/nightly", "--json")
    assert [(e["action"], e["entity_id"]) for e in audited] == [
        ("trigger", sid), ("update", sid), ("resume", sid), ("pause", sid), ("create", sid),
    ]  # fmt: skip
    # An id in any of its forms finds what its usual form finds, as every other command reads it.
    assert cli.json("audit", "list", "--id", "{" + sid.upper() + "}", "--json") == audited
    assert cli.refused("audit", "list", "--id", "billing/", code=2).endswith(
        "'billing/' is neither an id (a UUID) nor APP/KEY (see `scheduler audit list --help`)"
    )
    cancelled = cli.json("schedules", "cancel", "billing/nightly")
    assert (cancelled["id"], cancelled["state"]) == (sid, "cancelled")


SCHEDULE_COMMANDS = [
    ("schedules", "get", "{}"),
    ("schedules", "pause", "{}"),
    ("schedules", "resume", "{}"),
    ("schedules", "cancel", "{}"),
    ("schedules", "trigger", "{}"),
    ("schedules", "update", "{}", "--name", "x"),
    ("runs", "list", "--schedule", "{}"),
    ("dlq", "list", "--schedule", "{}"),
    ("dlq", "replay", "--schedule", "{}", "--dry-run"),
    ("audit", "list", "--id", "{}"),
]


@pytest.mark.parametrize("command", SCHEDULE_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_key_that_names_no_schedule_is_one_line_and_exit_2(cli: Cli, command: tuple[str, ...]) -> None:
    nightly(cli)

    def run(name: str) -> tuple[str, ...]:
        return tuple(arg.format(name) for arg in command)

    assert cli.refused(*run("billing/nope"), code=2) == (
        "error: unknown schedule 'billing/nope': app 'billing' has no schedule with that key "
        "(`scheduler schedules list --app billing` shows its schedules)"
    )
    assert cli.refused(*run("payroll/nightly"), code=2) == (
        "error: unknown app 'payroll' (`scheduler apps list` shows the apps)"
    )
    if command[:2] != ("audit", "list"):  # its --id also takes an app name
        assert "is neither an id (a UUID) nor APP/KEY" in cli.refused(*run("nightly"), code=2)


@pytest.mark.parametrize(
    "command",
    # audit list --id also lists the entries of a schedule since deleted (by the history retention).
    [c for c in SCHEDULE_COMMANDS if c[:2] != ("audit", "list")],
    ids=lambda c: " ".join(c[:2]),
)
def test_an_id_that_names_no_schedule_is_one_line_and_exit_2(cli: Cli, command: tuple[str, ...]) -> None:
    """The commands that act on a schedule said `error: no schedule ID`, exit 1, where a filter by it
    and an unknown APP/KEY everywhere exit 2 with what to run to see the schedules."""
    missing = "0190c6d2-0000-7000-8000-000000000000"
    assert cli.refused(*(arg.format(missing) for arg in command), code=2) == (
        f"error: unknown schedule {missing} (`scheduler schedules list` shows the schedules)"
    )


def test_every_schedule_the_cli_prints_carries_its_key(cli: Cli) -> None:
    """pause, resume, cancel and update printed a schedule without `schedule_key`, which create,
    get and list include."""
    created = nightly(cli)
    sid = created["id"]
    printed = {
        "create": created,
        "get": cli.json("schedules", "get", sid),
        "list": cli.json("schedules", "list", "--json")[0],
        "pause": cli.json("schedules", "pause", sid),
        "resume": cli.json("schedules", "resume", sid),
        "update": cli.json("schedules", "update", sid, "--name", "renamed"),
        "cancel": cli.json("schedules", "cancel", sid),
    }
    assert {name: shown.get("schedule_key") for name, shown in printed.items()} == dict.fromkeys(
        printed, "nightly"
    )
    assert {name: list(shown) for name, shown in printed.items()} == {name: list(created) for name in printed}


def test_trigger_is_versioned_and_leaves_the_version_as_it_is(cli: Cli) -> None:
    """`trigger --expect-version` was `No such option`, though a trigger is a versioned change."""
    sid = nightly(cli)["id"]
    assert cli.json("schedules", "trigger", sid, "--expect-version", "1")["schedule_id"] == sid
    assert cli.json("schedules", "get", sid)["version"] == 1
    assert cli.refused("schedules", "trigger", "billing/nightly", "--expect-version", "2", code=1) == (
        f"error: schedule {sid} is at version 1, not 2; read it again"
    )
    assert len(cli.json("runs", "list", "--schedule", sid, "--json")) == 1, "the refused one made no run"


def test_a_key_with_a_line_break_is_refused_in_one_line(cli: Cli) -> None:
    line = cli.refused("schedules", "pause", "billing/new\nline", code=2)
    assert line.startswith("error: unknown schedule 'billing/new\\nline'"), line
