"""What a Kafka command carries (its id, key, name, actor, and the reason quoting them) is shown by
the CLI's tables as the text it is: a producer's `[/]` or `[link=…]` is no markup for the operator's
terminal, and never a traceback instead of the listing; its terminal controls (an escape sequence
that clears the screen or moves the cursor, a bidirectional override) are shown, not sent."""

from __future__ import annotations

import json

import pytest

from scheduler.config import Settings
from scheduler.ingest.apply import apply_batch
from scheduler.ingest.commands import decode_command
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, schedules
from tests.integration.test_ingest_apply import CODEC, Topic, command, spec
from tests.integration.test_schedules_cli import Cli
from tests.support import make_dead_runs

pytestmark = pytest.mark.integration

MARKUP = "[/]x[link=http://evil.example]y[bold]"
# Clears the screen, retitles the window, erases the line above, reverses what follows, 8-bit CSI.
CONTROLS = "a\x1b[2J\x1b]0;t\x07\x1b[1A\x1b[2K\u202eb\x9b2Jc"
SHOWN = "a\\x1b[2J\\x1b]0;t\\x07\\x1b[1A\\x1b[2K\\u202eb\\x9b2Jc"


@pytest.fixture
def cli(settings: Settings, settings_env: dict[str, str]) -> Cli:
    with connect(settings.database_url) as conn:
        schedules.create_app(conn, "billing", 1)
        conn.commit()
    topic = Topic(settings)
    batch = [
        topic.message(command(MARKUP, MARKUP, "pause")),  # not found: a rejection naming both
        topic.message(command("c", "k", spec=spec(name=MARKUP), actor=MARKUP)),
        # An actor with controls is refused at ingestion (a command's actor is visible text); one
        # from a token's subject reaches the audit log through the API.
        topic.message(command("c2", "k2", spec=spec(name=CONTROLS))),
    ]
    with connect(settings.database_url) as conn:
        result = apply_batch(conn, settings, [decode_command(CODEC, m) for m in batch])
    assert result.applied == 2 and len(result.rejected) == 1
    with connect(settings.database_url) as conn:
        # An API caller's token subject is its actor, and the API takes it as the token says.
        spec_of_api = ScheduleSpec(app="billing", handler="builtin:noop", kind="cron", cron="0 3 * * *")
        service.create_schedule(conn, spec_of_api, f"api:{CONTROLS}")
        conn.commit()
    return Cli(settings_env | {"COLUMNS": "400"})  # wide enough for every cell whole


@pytest.mark.parametrize(
    "args", [("schedules", "rejected"), ("schedules", "list"), ("audit", "list")], ids=" ".join
)
def test_a_listing_shows_markup_from_a_command_as_text(cli: Cli, args: tuple[str, ...]) -> None:
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert MARKUP in done.stdout, done.stdout


@pytest.mark.parametrize("args", [("schedules", "list"), ("audit", "list")], ids=" ".join)
def test_a_listing_shows_terminal_controls_from_a_command_as_escapes(cli: Cli, args: tuple[str, ...]) -> None:
    """A name or an actor (a token's subject) cannot clear, rewrite or reorder the operator's screen."""
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert SHOWN in done.stdout, done.stdout
    assert not {"\x1b", "\x07", "\x9b", "\u202e"} & set(done.stdout), done.stdout


def test_json_output_keeps_a_name_with_controls_exactly(cli: Cli) -> None:
    """--json is for programs: the name reads back as stored, written with JSON's escapes only."""
    done = cli("schedules", "list", "--json")
    assert done.returncode == 0, done.stderr
    assert not {"\x1b", "\x9b", "\u202e"} & set(done.stdout), done.stdout
    assert CONTROLS in {s["name"] for s in json.loads(done.stdout)}


@pytest.mark.parametrize(
    "args",
    [("runs", "list", "--app", "billing"), ("dlq", "list"), ("dlq", "replay", "--dry-run")],
    ids=" ".join,
)
def test_a_listing_shows_markup_from_a_handlers_error_as_text(
    cli: Cli, settings: Settings, args: tuple[str, ...]
) -> None:
    """A handler's error text is the handler's, whatever brackets it holds."""
    error = f"HandlerError: {MARKUP} {CONTROLS}"
    with connect(settings.database_url) as conn:
        make_dead_runs(conn, "billing", 1, error)
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # `runs list` shows an error's beginning: as far as it goes, as the escapes show it.
    assert f"HandlerError: {MARKUP} {SHOWN[:8]}" in done.stdout, done.stdout
    assert not {"\x1b", "\x07", "\x9b", "\u202e"} & set(done.stdout), done.stdout


def test_a_listing_shows_ids_whole_for_the_next_command(cli: Cli, settings: Settings) -> None:
    """Piped, or on an 80-column terminal, the ids a user copies into `schedules get` or `dlq replay
    --run` are whole, not cut to `01a2492…`."""
    with connect(settings.database_url) as conn:
        make_dead_runs(conn, "billing", 1, "HandlerError: no")
        row = conn.execute("select id::text as id, schedule_id::text as schedule_id from runs").fetchone()
    assert row is not None
    run_id, schedule_id = str(row["id"]), str(row["schedule_id"])
    narrow = Cli(cli.env | {"COLUMNS": "80"})
    for args, wanted in (
        (("schedules", "list", "--app", "billing"), schedule_id),
        (("runs", "list", "--app", "billing"), run_id),
        (("dlq", "list"), run_id),
    ):
        done = narrow(*args)
        assert done.returncode == 0, done.stderr
        assert wanted in done.stdout, (args, done.stdout)
