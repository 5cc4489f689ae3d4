"""Replaying dead runs: an operator's way back from the dead-letter queue into the pipeline.

A replayed run is not a new run: it keeps its id and fire time (UNIQUE (schedule_id,
scheduled_for) stays true), gets the next attempt number as its fencing token and a fresh budget
of its schedule's ``max_attempts`` (whose retries back off afresh: the reconciler counts the
backoff from the attempt after the run's last death), and its message goes to the outbox, from
where the relay, a worker and the reconciler treat it like any other attempt. Each replay is written to
``audit_log`` with who did it; a run replayed once is not replayed again unless forced. A run of
a cancelled schedule is replayed only when the operator names its schedule or the run: a job its
owner cancelled does not run again as part of a replay of everything that failed.

Redispatching is the same move for runs whose job messages are gone (Kafka's topics were lost and
rebuilt): runs whose message left the outbox, queued before a cut-off the operator gives, that no
worker started. Their budget grows by one, since the lost attempt never ran.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from scheduler.config import Settings
from scheduler.scan.dispatch import JobDispatcher, attempt_deadline
from scheduler.store import dlq, runs, scan
from scheduler.store.dlq import DeadRunFilter, ResendableRun
from scheduler.store.scan import MAX_BATCH_PAYLOAD_BYTES, NextAttempt

Row = dict[str, Any]

REPLAY_CHUNK = 500
"""Dead runs replayed in one transaction."""


ReplayFilter = DeadRunFilter
"""The dead runs a replay takes (see :class:`scheduler.store.dlq.DeadRunFilter`)."""


UNDECODABLE = "undecodable"
"""The state :func:`first_not_dead` gives an id that names an undecodable dead letter, not a run."""


@dataclass(frozen=True)
class NotReplayable:
    """A run an operator named that a replay cannot take."""

    run_id: UUID
    state: str | None
    """Its state; None when there is no such run (or none the caller may see); ``undecodable``
    when the id is an undecodable dead letter's, which has no run and so nothing to replay."""


def first_not_dead(
    conn: psycopg.Connection[Row], run_ids: Sequence[UUID], sees: Callable[[str], bool] = lambda _app: True
) -> NotReplayable | None:
    """The first of the runs named that is missing, not the caller's to see (``sees`` its app), or
    not dead; None when a replay can take them all. Asked before anything changes: a replay that
    quietly left a named run out would read as done."""
    with conn.transaction():
        found = runs.states_of_runs(conn, run_ids)
    for run_id in run_ids:
        run = found.get(run_id)
        if run is None or not sees(run["app"]):
            return NotReplayable(run_id, None)
        if run["state"] != "dead":
            return NotReplayable(run_id, run["state"])
    return None


class Replayer:
    def __init__(self, settings: Settings, dispatcher: JobDispatcher | None = None) -> None:
        self.dispatcher = dispatcher or JobDispatcher(settings)

    def candidates(
        self, conn: psycopg.Connection[Row], where: ReplayFilter, limit: int
    ) -> list[ResendableRun]:
        """What a replay would take now; changes nothing (the locks end with the rollback)."""
        with conn.transaction(force_rollback=True):
            return self._select(conn, where, limit)

    def replay(
        self,
        conn: psycopg.Connection[Row],
        where: ReplayFilter,
        limit: int,
        actor: str,
        *,
        chunk: int = REPLAY_CHUNK,
        after_chunk: Callable[[int], None] | None = None,
        moved: list[UUID] | None = None,
    ) -> int:
        """Replay up to ``limit`` matching dead runs, one transaction per ``chunk``; returns how many,
        and adds their ids to ``moved`` when given (the CLI's replay of millions keeps none).

        Each run is taken once: one that an earlier chunk replayed and that has died again since is
        not taken again, even under ``force`` (which only takes runs replayed by earlier commands).
        ``after_chunk`` is called with the count so far after each chunk commits.
        """
        replayed = 0
        began: datetime | None = None
        while replayed < limit:
            with conn.transaction():
                dead = self._select(conn, where, min(chunk, limit - replayed), began, MAX_BATCH_PAYLOAD_BYTES)
                done = dlq.replay_runs(conn, [self._next_attempt(run) for run in dead], actor)
                if done:
                    scan.notify_outbox(conn)
            if not done:
                break
            # The first chunk's transaction time: its audit rows, and every later one's, are at or after it.
            began = began or dead[0].now
            replayed += len(done)
            if moved is not None:
                moved += done
            if after_chunk is not None:
                after_chunk(replayed)
        return replayed

    def left_out_as_cancelled(self, conn: psycopg.Connection[Row], where: ReplayFilter) -> int:
        """How many dead runs matching ``where`` a replay leaves out because their schedule is
        cancelled (it takes them only when ``where`` names their schedule or the runs)."""
        with conn.transaction():
            return dlq.count_dead_of_cancelled(conn, where)

    def left_out_as_replayed(self, conn: psycopg.Connection[Row], where: ReplayFilter) -> int:
        """How many dead runs matching ``where`` a replay leaves out because a replay took them
        before and they died again (it takes them only when ``where.force``)."""
        with conn.transaction():
            return dlq.count_dead_replayed_before(conn, where)

    def lost(
        self, conn: psycopg.Connection[Row], before: datetime, app: str | None, limit: int
    ) -> list[ResendableRun]:
        """What a redispatch would take now; changes nothing."""
        with conn.transaction(force_rollback=True):
            return dlq.lost_runs_for_redispatch(conn, before=before, app=app, limit=limit)

    def redispatch(
        self, conn: psycopg.Connection[Row], before: datetime, app: str | None, limit: int, actor: str
    ) -> int:
        """Send up to ``limit`` lost runs again in one transaction; returns how many."""
        with conn.transaction():
            lost = dlq.lost_runs_for_redispatch(conn, before=before, app=app, limit=limit)
            attempts = [self._next_attempt(run, budget=run.run.max_attempts + 1) for run in lost]
            moved = dlq.replay_runs(conn, attempts, actor, action="redispatch")
            if moved:
                scan.notify_outbox(conn)
        return len(moved)

    def _select(
        self,
        conn: psycopg.Connection[Row],
        where: ReplayFilter,
        limit: int,
        began: datetime | None = None,
        max_bytes: int | None = None,
    ) -> list[ResendableRun]:
        return dlq.dead_runs_for_replay(conn, where, limit=limit, replayed_since=began, max_bytes=max_bytes)

    def _next_attempt(self, dead: ResendableRun, budget: int | None = None) -> tuple[NextAttempt, int]:
        run = dead.run
        attempt = run.attempt + 1
        # By default a fresh budget counted on from the attempts spent: attempt numbers only grow
        # (fencing).
        max_attempts = budget if budget is not None else run.attempt + dead.budget
        job = dataclasses.replace(dead.job, max_attempts=max_attempts)
        message = self.dispatcher.message(
            run_id=run.id,
            schedule_id=run.schedule_id,
            job=job,
            scheduled_for=run.scheduled_for,
            attempt=attempt,
            deadline=attempt_deadline(dead.now, job.timeout_ms),
            previous_attempts=dead.history,
            traceparent=dead.creation_traceparent,
        )
        # No lease: like any dispatched attempt, it gets one when a worker starts it.
        return NextAttempt(run.id, attempt, None, message), job.max_attempts
