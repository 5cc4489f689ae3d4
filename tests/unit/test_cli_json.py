"""Every command that prints data takes --json, so a script never has to know which print tables."""

from __future__ import annotations

from collections.abc import Iterator

import click

from scheduler.cli import main

# Commands that print no data: processes that run until stopped, the stack's shutdown, the demo's
# live view.
NO_DATA = {("run",), ("dev", "down"), ("demo",)}


def commands(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from commands(sub, (*path, name))
    else:
        yield path, command


def test_every_command_that_prints_data_takes_json() -> None:
    missing = [
        " ".join(path)
        for path, command in commands(main)
        if not any(path[: len(skip)] == skip for skip in NO_DATA)
        and not any(isinstance(p, click.Option) and "--json" in p.opts for p in command.params)
    ]
    assert missing == []
