"""start_at and end_at bound a cron schedule's fires; a one-shot takes neither (it used to accept
them and fire regardless, even after its end_at)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from scheduler.api.messages import spec_of_update
from scheduler.schedule.spec import InvalidSchedule, ScheduleSpec, validate
from scheduler.v1 import scheduler_pb2 as pb

RUN_AT = datetime(2027, 6, 1, 12, tzinfo=UTC)
BEFORE = datetime(2027, 1, 1, tzinfo=UTC)
AFTER = datetime(2028, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("kind", "run_at"), [("delayed", RUN_AT), ("immediate", None)])
@pytest.mark.parametrize(("start_at", "end_at"), [(BEFORE, None), (None, BEFORE), (BEFORE, AFTER)])
def test_a_one_shot_with_bounds_is_refused(
    kind: str, run_at: datetime | None, start_at: datetime | None, end_at: datetime | None
) -> None:
    spec = ScheduleSpec(
        app="billing", handler="builtin:noop", kind=kind, run_at=run_at, start_at=start_at, end_at=end_at
    )
    with pytest.raises(InvalidSchedule, match="start_at and end_at bound a cron schedule"):
        validate(spec)


def test_a_cron_schedule_keeps_its_bounds() -> None:
    spec = ScheduleSpec(
        app="billing", handler="builtin:noop", kind="cron", cron="0 9 * * *", start_at=BEFORE, end_at=AFTER
    )
    assert validate(spec) is spec


def _timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def test_an_api_update_to_a_one_shot_drops_the_cron_bounds_it_does_not_give() -> None:
    bounded = ScheduleSpec(
        app="billing", handler="builtin:noop", kind="cron", cron="0 9 * * *", start_at=BEFORE, end_at=AFTER
    )
    request = pb.UpdateScheduleRequest(run_at=_timestamp(RUN_AT))
    one_shot = spec_of_update(bounded, request)
    assert (one_shot.kind, one_shot.cron, one_shot.start_at, one_shot.end_at) == ("delayed", None, None, None)
    assert validate(one_shot) is one_shot
    # Bounds given with it are kept, and refused.
    request = pb.UpdateScheduleRequest(run_at=_timestamp(RUN_AT), end_at=_timestamp(AFTER))
    with pytest.raises(InvalidSchedule, match="start_at and end_at"):
        validate(spec_of_update(bounded, request))


def test_an_api_update_of_a_one_shot_stored_with_bounds_drops_them() -> None:
    """A one-shot created with bounds before they were refused stays updatable: an update that
    does not give them drops them."""
    stored = ScheduleSpec(
        app="billing", handler="builtin:noop", kind="delayed", run_at=RUN_AT, start_at=BEFORE, end_at=AFTER
    )
    renamed = spec_of_update(stored, pb.UpdateScheduleRequest(name="renamed"))
    assert (renamed.name, renamed.run_at, renamed.start_at, renamed.end_at) == ("renamed", RUN_AT, None, None)
    assert validate(renamed) is renamed
