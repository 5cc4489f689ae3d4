"""``scheduler cron next``, as a user runs it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from scheduler.cli import main


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["cron", "next", *args])
    return result.exit_code, result.stdout, result.stderr


def test_json_lists_utc_and_local_times_with_offsets() -> None:
    code, out, err = run(
        "30 2 * * *", "--tz", "Europe/Berlin", "--after", "2027-03-27T00:00:00Z", "--count", "3", "--json"
    )
    assert (code, err) == (0, "")
    assert json.loads(out) == [
        {"utc": "2027-03-27T01:30:00+00:00", "local": "2027-03-27T02:30:00+01:00"},
        {"utc": "2027-03-28T01:00:00+00:00", "local": "2027-03-28T03:00:00+02:00"},
        {"utc": "2027-03-29T00:30:00+00:00", "local": "2027-03-29T02:30:00+02:00"},
    ]


def test_fall_back_in_json() -> None:
    _, out, _ = run(
        "30 2 * * *", "--tz", "Europe/Berlin", "--after", "2026-10-24T00:00:00Z", "--count", "3", "--json"
    )
    assert [entry["utc"] for entry in json.loads(out)] == [
        "2026-10-24T00:30:00+00:00",
        "2026-10-25T00:30:00+00:00",
        "2026-10-26T01:30:00+00:00",
    ]


def test_the_table_shows_both_clocks() -> None:
    code, out, _ = run(
        "30 2 * * *", "--tz", "Europe/Berlin", "--after", "2027-03-27T00:00:00Z", "--count", "2"
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["UTC", "LOCAL", "(Europe/Berlin)"]
    assert lines[2].split() == ["2027-03-28T01:00:00+00:00", "2027-03-28T03:00:00+02:00", "Sun", "CEST"]
    assert len(lines) == 3


@pytest.mark.parametrize(
    "after", ["2027-03-27T00:00:00", "2027-03-27T01:00:00+01:00", "2027-03-27 00:00:00Z"]
)
def test_after_accepts_z_an_offset_or_nothing_meaning_utc(after: str) -> None:
    _, out, _ = run("0 * * * *", "--after", after, "--count", "1", "--json")
    assert json.loads(out) == [{"utc": "2027-03-27T01:00:00+00:00", "local": "2027-03-27T01:00:00+00:00"}]


def test_the_preview_ends_where_a_schedule_can_fire() -> None:
    """It listed 9001, 9002, ..., times no schedule holds (--at refuses them)."""
    code, out, _ = run("0 0 1 1 *", "--after", "8997-06-01T00:00:00Z", "--count", "20", "--json")
    assert code == 0
    assert [fire["utc"] for fire in json.loads(out)] == [
        f"{year}-01-01T00:00:00+00:00" for year in (8998, 8999)
    ]


def test_defaults_are_utc_now_and_five() -> None:
    code, out, _ = run("* * * * *", "--json")
    assert code == 0
    assert len(json.loads(out)) == 5


def test_six_fields_and_h_with_a_schedule_id() -> None:
    args = (
        "H H * * *",
        "--schedule-id",
        "2f1d0c3e-8a4b-4c5d-9e6f-7a8b9c0d1e2f",
        "--after",
        "2027-01-01T00:00:00Z",
    )
    _, first, _ = run(*args, "--json", "--count", "1")
    _, again, _ = run(*args, "--json", "--count", "1")
    assert first == again
    assert json.loads(first)[0]["utc"] == "2027-01-01T15:05:00+00:00"
    _, out, _ = run("30 15 10 * * *", "--after", "2027-01-01T00:00:00Z", "--json", "--count", "1")
    assert json.loads(out)[0]["utc"] == "2027-01-01T10:15:30+00:00"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("61 * * * *",), "invalid cron expression '61 * * * *': minute field '61' is not valid"),
        (("* * * * *", "--tz", "Mars/Olympus"), "unknown time zone 'Mars/Olympus'"),
        (("* * * * *", "--after", "next tuesday"), "--after 'next tuesday' is not an ISO 8601 time"),
        (("* * * * *", "--count", "0"), "--count"),
        (("H * * * *",), "'H' needs a schedule id"),
        ((), "Missing argument 'EXPR'"),
        # Where Python's dates end: one line, not a traceback.
        (("0 0 29 2 *", "--after", "9999-01-01T00:00:00Z"), "--after must be between 1970 and 9000"),
        (("0 0 * * *", "--tz", "America/New_York", "--after", "0001-01-01T00:00:00Z"), "between 1970"),
        (("0 0 * * *", "--after", "0001-01-01T00:00:00+01:00"), "between 1970"),
        (("0 0 * * *", "--after", "9999-12-31T23:59:59-01:00"), "between 1970"),
        (("* * * * *", "--tz", "right/America/New_York"), "unknown time zone 'right/America/New_York'"),
        # As `schedules create --at`: a time without an offset is ambiguous beside another zone.
        (
            ("30 2 * * *", "--tz", "Europe/Berlin", "--after", "2027-03-28T00:00:00"),
            "--after '2027-03-28T00:00:00' has no UTC offset; with --tz Europe/Berlin give one",
        ),
        # An unknown zone is said as such, not as a time lacking an offset in it.
        (
            ("* * * * *", "--tz", "Nope/Zone", "--after", "2027-03-14T02:30:00"),
            "unknown time zone 'Nope/Zone'",
        ),
        # A schedule's id is a UUID: any other text would preview the H values of no schedule.
        (("H H * * *", "--schedule-id", "billing/nightly"), "'billing/nightly' is not an id (a UUID)"),
        # The example is the zone's own offset at that time, not one fixed offset for every zone.
        (
            ("0 9 * * *", "--tz", "Europe/London", "--after", "2027-07-01T00:00:00"),
            "(e.g. 2027-07-01T00:00:00+01:00, or Z for UTC)",
        ),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_code_2(args: tuple[str, ...], message: str) -> None:
    code, out, err = run(*args)
    assert code == 2
    assert out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("group", [(), ("schedules",), ("dev",)])
def test_a_bare_group_prints_its_help_not_an_error(group: tuple[str, ...]) -> None:
    result = CliRunner().invoke(main, list(group))
    assert "Commands:" in result.output and "error:" not in result.output, result.output


def test_an_expression_no_schedule_can_hold_is_refused_as_create_refuses_it() -> None:
    longest = "00 0 * * * " + "1," * 94 + "1"  # 200 characters: a valid list of days of week
    assert len(longest) == 200
    code, out, err = run(longest, "--count", "1", "--json")
    assert code == 0, err
    code, out, err = run(longest + ",1", "--count", "1")
    assert code == 2 and out == ""
    assert err.strip() == "error: cron expression must be at most 200 characters, got 202"
