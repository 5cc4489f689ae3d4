"""An H in the day of month picks a day per schedule: one it picks that the months never have is
refused as bad input (it used to escape as a traceback, for some new ids and not others)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from scheduler.schedule.service import first_fire
from scheduler.schedule.spec import InvalidSchedule, ScheduleSpec, validate

NOW = datetime(2027, 1, 1, tzinfo=UTC)
# "H(28-31)" picks the 29th for the id validation checks the form with, and these ids' picks.
FEBRUARY_29 = uuid.UUID(int=1)
FEBRUARY_30 = uuid.UUID(int=2)
FEBRUARY_31 = uuid.UUID(int=5)


def spec(cron: str) -> ScheduleSpec:
    return validate(ScheduleSpec(app="billing", handler="builtin:noop", kind="cron", cron=cron))


def test_a_day_the_months_have_fires() -> None:
    assert first_fire(spec("0 0 H(28-31) 2 *"), FEBRUARY_29, NOW) == datetime(2028, 2, 29, tzinfo=UTC)


@pytest.mark.parametrize("schedule_id", [FEBRUARY_30, FEBRUARY_31])
def test_a_day_the_months_never_have_is_an_invalid_schedule(schedule_id: uuid.UUID) -> None:
    with pytest.raises(InvalidSchedule, match="H fields take for this schedule"):
        first_fire(spec("0 0 H(28-31) 2 *"), schedule_id, NOW)
