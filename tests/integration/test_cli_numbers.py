"""Every float option of the CLI takes a finite number within its range: NaN, infinity, a negative
or an oversized value is one line naming the option and its range, exit 2, and nothing is stored or
started. Unchecked, NaN and infinity reached the code: a traceback where seconds become
milliseconds, and a worker whose grace period was NaN abandoned its running jobs at once on SIGTERM."""

from __future__ import annotations

import pytest

from tests.integration.test_schedules_cli import Cli

pytestmark = pytest.mark.integration

CREATE = ("schedules", "create", "--app", "billing", "--now", "--handler", "builtin:noop")
UPDATE = ("schedules", "update", "0190c6d2-0000-7000-8000-000000000000")  # refused before it is read


@pytest.fixture
def cli(settings_env: dict[str, str]) -> Cli:
    cli = Cli(settings_env)
    assert cli("apps", "create", "billing", "--partitions", "1").returncode == 0
    return cli


# command, option, value, the range the line names
OUT_OF_RANGE = [
    (CREATE, "--timeout", "nan", "0.001<=x<=86400"),
    (CREATE, "--timeout", "1e308", "0.001<=x<=86400"),
    (CREATE, "--timeout", "0", "0.001<=x<=86400"),
    (CREATE, "--timeout", "86400.5", "0.001<=x<=86400"),
    (CREATE, "--jitter", "inf", "0<=x<=86400"),
    (CREATE, "--jitter", "-inf", "0<=x<=86400"),
    (CREATE, "--backoff-max", "inf", "0<=x<=86400"),
    (CREATE, "--backoff-base", "-1", "0<=x<=86400"),
    (UPDATE, "--backoff-base", "nan", "0<=x<=86400"),
    (UPDATE, "--timeout", "inf", "0.001<=x<=86400"),
    (UPDATE, "--jitter", "1e400", "0<=x<=86400"),
    (("run", "worker", "--app", "billing"), "--grace", "nan", "0<=x<=3600"),
    (("run", "worker", "--app", "billing"), "--grace", "-1", "0<=x<=3600"),
    (("run", "worker", "--app", "billing"), "--grace", "inf", "0<=x<=3600"),
    (("demo",), "--duration", "nan", "0<x<=86400"),
    (("demo",), "--duration", "0", "0<x<=86400"),
    (("demo",), "--duration", "inf", "0<x<=86400"),
]


def test_a_float_out_of_its_range_is_one_line_naming_the_option_and_the_range(cli: Cli) -> None:
    for command, option, value, range_ in OUT_OF_RANGE:
        line = cli.refused(*command, option, value)
        assert line.startswith(f"error: Invalid value for '{option}': ") and range_ in line, line
    assert cli.json("schedules", "list", "--json") == [], "nothing was stored"
    assert [a["name"] for a in cli.json("apps", "list", "--json")] == ["billing"], "the demo did not start"


def test_floats_within_their_ranges_are_taken_to_the_millisecond(cli: Cli) -> None:
    created = cli.json(
        *CREATE, "--timeout", "0.001", "--backoff-base", "0", "--backoff-max", "86400", "--jitter", "0.25"
    )
    fields = ("timeout_ms", "backoff_base_ms", "backoff_max_ms", "jitter_ms")
    assert [created[name] for name in fields] == [1, 0, 86_400_000, 250]
