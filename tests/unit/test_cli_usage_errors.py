"""A usage error anywhere in the CLI is one line naming the help of the command it is about."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from scheduler.cli import main


@pytest.mark.parametrize(
    ("args", "help_of"),
    [
        (["cron", "next", "--tz"], "scheduler cron next"),
        (["runs", "list", "--app"], "scheduler runs list"),
        (["runs", "--bogus"], "scheduler runs"),
        (["--bogus"], "scheduler"),
    ],
)
def test_a_usage_error_points_at_the_help_of_the_command_given(args: list[str], help_of: str) -> None:
    """An option given without its value (an error click raises without the command it is about)
    points at that command's help, as every other usage error does."""
    result = CliRunner().invoke(main, args, prog_name="scheduler")
    assert result.exit_code == 2
    assert result.output.strip().endswith(f"(see `{help_of} --help`)"), result.output
