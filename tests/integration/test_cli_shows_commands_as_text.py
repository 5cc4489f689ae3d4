"""What a Kafka command carries (its id, key, name, actor, and the reason quoting them) is shown by
the CLI's tables as the text it is: a producer's `[/]` or `[link=…]` is no markup for the operator's
terminal, and never a traceback instead of the listing."""

from __future__ import annotations

import pytest

from scheduler.config import Settings
from scheduler.ingest.apply import apply_batch
from scheduler.ingest.commands import decode_command
from scheduler.store import connect, schedules
from tests.integration.test_ingest_apply import CODEC, Topic, command, spec
from tests.integration.test_schedules_cli import Cli
from tests.support import make_dead_runs

pytestmark = pytest.mark.integration

MARKUP = "[/]x[link=http://evil.example]y[bold]"


@pytest.fixture
def cli(settings: Settings, settings_env: dict[str, str]) -> Cli:
    with connect(settings.database_url) as conn:
        schedules.create_app(conn, "billing", 1)
        conn.commit()
    topic = Topic(settings)
    batch = [
        topic.message(command(MARKUP, MARKUP, "pause")),  # not found: a rejection naming both
        topic.message(command("c", "k", spec=spec(name=MARKUP), actor=MARKUP)),
    ]
    with connect(settings.database_url) as conn:
        result = apply_batch(conn, settings, [decode_command(CODEC, m) for m in batch])
    assert result.applied == 1 and len(result.rejected) == 1
    return Cli(settings_env | {"COLUMNS": "400"})  # wide enough for every cell whole


@pytest.mark.parametrize(
    "args", [("schedules", "rejected"), ("schedules", "list"), ("audit", "list")], ids=" ".join
)
def test_a_listing_shows_markup_from_a_command_as_text(cli: Cli, args: tuple[str, ...]) -> None:
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert MARKUP in done.stdout, done.stdout


@pytest.mark.parametrize(
    "args",
    [("runs", "list", "--app", "billing"), ("dlq", "list"), ("dlq", "replay", "--dry-run")],
    ids=" ".join,
)
def test_a_listing_shows_markup_from_a_handlers_error_as_text(
    cli: Cli, settings: Settings, args: tuple[str, ...]
) -> None:
    """A handler's error text is the handler's, whatever brackets it holds."""
    error = f"HandlerError: {MARKUP}"
    with connect(settings.database_url) as conn:
        make_dead_runs(conn, "billing", 1, error)
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert error in done.stdout, done.stdout


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
