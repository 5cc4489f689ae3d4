"""What `scheduler produce` shows of its progress: the bar's share of a file never passes 100%, even
of a file that grows while it is read, and the summary's seconds are of the producing alone."""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.progress import Progress

from scheduler.cli import main
from scheduler.cli.produce import CommandIds, _LinesColumn, _produce_lines, _Tally
from scheduler.client import ScheduleClient
from scheduler.kafka.messages import ScheduleCommand

# The module: the package's name `produce` is the command's.
produce_command = importlib.import_module("scheduler.cli.produce")


def command(key: str) -> str:
    return json.dumps(
        {"schedule_key": key, "app": "bulk", "operation": "create", "spec": {"handler": "builtin:noop"}}
    )


class _AcknowledgingClient:
    """Kafka acknowledges each command as it is sent; ``on_send`` runs before the first."""

    topic = "sched.schedules"

    def __init__(self, on_send: Callable[[], None] = lambda: None) -> None:
        self.sent = 0
        self._on_send = on_send

    def send(self, command: ScheduleCommand, on_delivery: Callable[[str | None], None] | None = None) -> str:
        if self.sent == 0:
            self._on_send()
        self.sent += 1
        if on_delivery is not None:
            on_delivery(None)
        return command.command_id

    def flush(self, timeout_s: float = 60.0) -> None:
        return None


def test_the_bar_of_a_file_that_grows_while_it_is_read_is_full_only_once_all_of_it_is_done(
    tmp_path: Path,
) -> None:
    """The total was the file's size when the reading began: of a file written to meanwhile (a log
    still growing), the bar was full at 100% with half of it still to produce, its clock and spinner
    stopped as for a finished task."""
    path = tmp_path / "commands.jsonl"
    path.write_text("".join(command(f"k{i}") + "\n" for i in range(3)))

    def grow() -> None:  # three more lines, as long as the first three
        with path.open("a") as file:
            file.write("".join(command(f"m{i}") + "\n" for i in range(3)))

    progress = Progress(_LinesColumn(), console=Console(quiet=True))
    task = progress.add_task("producing", total=None, lines=0)
    tally = _Tally(progress, task, Console(stderr=True))
    shown: list[tuple[str, bool]] = []
    original = tally._advance

    def advance(size: int) -> None:
        original(size)
        shown.append((_LinesColumn().render(progress.tasks[0]).plain, progress.tasks[0].finished))

    tally._advance = advance  # type: ignore[method-assign]  # what the bar shows after each step
    client = _AcknowledgingClient(on_send=grow)
    with path.open("rb") as stream:
        assert _produce_lines(stream, cast(ScheduleClient, client), CommandIds(), tally) is None
    assert (client.sent, tally.produced, tally.failed) == (6, 6, 0)
    assert shown[-1] == ("6 lines 100%", True), shown
    full = [text for text, finished in shown if finished or text.endswith(" 100%")]
    assert set(full) == {"6 lines 100%"}, shown
    assert ("3 lines  50%", False) in shown, shown


def test_the_summary_counts_the_seconds_of_producing_not_those_of_the_topic_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow answer to whether the commands topic exists (Kafka's metadata, up to 10 s) counted in
    the summary's seconds and lowered its rate. Here the check takes a minute of a clock of the test's
    own."""
    skipped = 0.0

    def clock() -> float:
        return time.monotonic() + skipped

    def slow_check(_wiring: object) -> ScheduleClient:
        nonlocal skipped
        skipped += 60.0
        return cast(ScheduleClient, _AcknowledgingClient())

    monkeypatch.setattr(produce_command, "time", SimpleNamespace(monotonic=clock))
    monkeypatch.setattr(produce_command, "_checked_client", slow_check)
    done = CliRunner().invoke(main, ["produce", "--json"], input=command("k") + "\n")
    assert done.exit_code == 0, done.output
    summary = json.loads(done.stdout)
    assert summary["produced"] == 1
    assert summary["seconds"] < 30, summary
