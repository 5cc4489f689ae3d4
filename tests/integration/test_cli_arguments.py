"""An argument holding bytes that are not UTF-8 is one line naming the argument or option, exit 2,
in every command: Python reads such bytes as lone surrogates, which PostgreSQL's and Kafka's
clients cannot encode (a traceback, before). A file name is the file system's bytes, and stays
usable whatever they are."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration.test_schedules_cli import Cli

pytestmark = pytest.mark.integration

BAD = b"a\xffb"


@pytest.fixture
def cli(settings_env: dict[str, str]) -> Cli:
    cli = Cli(settings_env)
    assert cli("apps", "create", "billing", "--partitions", "1").returncode == 0
    return cli


# The command, and the option or argument the line names with its value (the byte escaped).
COMMANDS: list[tuple[tuple[str | bytes, ...], str]] = [
    (("schedules", "get", b"billing/" + BAD), "'ID|APP/KEY': 'billing/a\\xffb'"),
    (("schedules", "list", "--app", BAD), "'--app'"),
    (("schedules", "rejected", "--app", BAD), "'--app'"),
    (("schedules", "create", "--app", BAD, "--now", "--handler", "builtin:noop"), "'--app'"),
    (("schedules", "create", "--app", "billing", "--now", "--handler", BAD), "'--handler'"),
    (("runs", "list", "--app", BAD), "'--app'"),
    (("runs", "redispatch", "--app", BAD, "--dispatched-before", "2020-01-01T00:00:00Z"), "'--app'"),
    (("dlq", "list", "--app", BAD), "'--app'"),
    (("dlq", "list", "--error-class", BAD), "'--error-class'"),
    (("dlq", "replay", "--error-class", BAD, "--dry-run"), "'--error-class'"),
    (("dlq", "replay", "--app", BAD), "'--app'"),
    (("quarantine", "list", "--app", BAD), "'--app'"),
    (("audit", "list", "--id", BAD), "'--id'"),
    (("audit", "list", "--actor", BAD), "'--actor'"),
    (("audit", "list", "--app", BAD), "'--app'"),
    (("apps", "create", BAD), "'NAME'"),
    (("apps", "handlers", "billing", BAD), "'[HANDLERS]...'"),
    (("cron", "next", BAD), "'EXPR'"),
    (("run", "worker", "--app", BAD), "'--app'"),
    (("run", "all", "--app", BAD), "'--app'"),
]


def test_an_argument_that_is_not_utf8_is_one_line_naming_it(cli: Cli) -> None:
    for command, named in COMMANDS:
        line = cli.refused(*command)
        assert line.startswith(f"error: Invalid value for {named}"), line
        assert "a\\xffb' is not valid UTF-8" in line, line
    assert cli.json("schedules", "list", "--json") == [], "nothing was stored"
    assert [a["name"] for a in cli.json("apps", "list", "--json")] == ["billing"]


def test_a_payload_file_may_have_any_name(cli: Cli, tmp_path: Path) -> None:
    named = tmp_path / os.fsdecode(b"payload-" + BAD + b".json")
    named.write_text(json.dumps({"ledger": "eu"}))
    created = cli.json(
        "schedules", "create", "--app", "billing", "--now", "--handler", "builtin:noop",
        "--payload", b"@" + os.fsencode(named),
    )  # fmt: skip
    assert created["payload"] == {"ledger": "eu"}
