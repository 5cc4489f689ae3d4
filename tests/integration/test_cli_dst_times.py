"""Times a user types around daylight-saving changes, as the CLI reads them and answers.

Expectations come from zoneinfo directly (the instant a New York clock jumps from 02:00 EST to
03:00 EDT), never from the scheduler's own cron functions.
"""

from __future__ import annotations

import re
import subprocess
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from tests.support import SCHEDULER

pytestmark = pytest.mark.integration

NEW_YORK = ZoneInfo("America/New_York")
# 2027-03-14: New York's clocks go from 01:59:59 EST to 03:00:00 EDT; 02:30 never shows.
SPRING_FORWARD = datetime(2027, 3, 14, 7, 0, tzinfo=UTC)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCHEDULER, *args], capture_output=True, text=True, check=False, timeout=60)


def test_cron_next_after_a_skipped_wall_time_suggests_a_time_the_zone_shows() -> None:
    """`schedules create --start 2027-03-14T02:30:00 --tz America/New_York` is refused with the
    first instant after the gap as its example (03:00 EDT); `cron next --after` with the same time is
    refused too, but its example reads 02:30 at New York's winter offset, a wall time its clocks
    never show that day (the instant is 03:30 EDT, after the 03:00 fire of `30 2 * * *`)."""
    done = cli("cron", "next", "30 2 * * *", "--tz", "America/New_York", "--after", "2027-03-14T02:30:00")
    assert done.returncode == 2 and done.stdout == "", done
    match = re.search(r"e\.g\. (\S+?),", done.stderr)
    assert match is not None, done.stderr
    example = datetime.fromisoformat(match[1])
    shown = example.astimezone(NEW_YORK)
    assert shown.utcoffset() == example.utcoffset(), (
        f"the example {match[1]} is no reading of a New York clock: that instant is {shown.isoformat()}"
    )
    assert example == SPRING_FORWARD.astimezone(NEW_YORK), done.stderr
