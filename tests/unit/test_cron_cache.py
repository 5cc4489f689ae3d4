"""Fire times stay right when many schedules share an expression and are computed at once: the cron
module reuses parsed expressions and their expansions (bulk creates ask it the same question
thousands of times), and the API computes fire times in several threads."""

from __future__ import annotations

import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from itertools import islice

from scheduler.domain.cron import CronSchedule, fire_times, next_fire_after

START = datetime(2026, 3, 1, tzinfo=UTC)
# Wildcard and fixed-time schedules, an L-n rule, and zones with a DST change in the span walked.
CASES = [
    ("*/7 * * * *", "UTC"),
    ("30 2 * * *", "Europe/Berlin"),
    ("0 9 L-2 * *", "America/New_York"),
    ("15 */3 * * mon-fri", "Australia/Lord_Howe"),
    ("0 0 29 2 *", "Asia/Tokyo"),
]


def walk(expression: str, tz: str, schedule_id: str | None = None, count: int = 40) -> list[datetime]:
    return list(islice(fire_times(expression, tz, START, schedule_id), count))


def test_fire_times_computed_in_many_threads_at_once_are_those_computed_alone() -> None:
    alone = {(cron, tz): walk(cron, tz, count=150) for cron, tz in CASES}
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns every few bytecodes, in mid-computation
    try:
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda c: (c, walk(c[0], c[1], count=150)), CASES * 24))
    finally:
        sys.setswitchinterval(interval)
    for case, fires in together:
        assert fires == alone[case], case


def test_schedules_sharing_an_expression_keep_their_own_h_values() -> None:
    ids = [str(uuid.UUID(int=n)) for n in range(1, 41)]
    firsts = {i: next_fire_after("H H * * *", "UTC", START, i) for i in ids}
    # Asked again, interleaved with other ids, each id gets its own answer back.
    for i in reversed(ids):
        assert next_fire_after("H H * * *", "UTC", START, i) == firsts[i]
    assert len(set(firsts.values())) > 30, "hashed minutes and hours spread the schedules"
    for i, first in firsts.items():
        assert walk("H H * * *", "UTC", i, count=3) == [first + timedelta(days=d) for d in range(3)]


def test_the_same_question_asked_many_times_gets_the_same_answer_as_a_walk() -> None:
    schedule = CronSchedule.of("30 2 * * *", "Europe/Berlin")
    after = datetime(2027, 3, 27, 12, tzinfo=UTC)
    answers = {schedule.next_fire_after(after) for _ in range(1000)}
    # The night of the spring-forward gap: 02:30 does not exist, so it fires right after the gap.
    assert answers == {datetime(2027, 3, 28, 1, 0, tzinfo=UTC)}
    assert walk("30 2 * * *", "Europe/Berlin", count=400)[-1] == next_fire_after(
        "30 2 * * *", "Europe/Berlin", walk("30 2 * * *", "Europe/Berlin", count=399)[-1]
    )
