"""Moving the stored next fires to newer zone rules, in the scanner's process.

A cron schedule stores its next fire as an instant, computed under the zone rules of the process
that computed it. A tzdata update changes a zone's offsets (a government ends daylight saving), and
every fire computed from then on follows the new rules; the one already stored would come at the
old instant, the wall time asked for off by the change. This service computes those fires again
when its process's rules are newer than the release recorded in ``zone_rules``, then records its
release. Releases are ordered (2025b before 2026a, :mod:`scheduler.domain.zone_rules`): during a
rolling update, a process under older rules never moves a fire back, and rules whose release cannot
be told (a ``PYTHONTZPATH`` folder without a ``tzdata.zi``) move nothing.

Why the scanner's process, at its start: its rules are the ones that advance every fire from then on,
so the stored fires should follow the same rules; ``scheduler init`` may run from another host or
image (an operator's laptop), or not at all when only the image changed. Why a loop of its own
beside the scan, not before it: a million schedules cost a minute of CPU or more, and the fires due
meanwhile must not wait for it.

One pass, by batches of :data:`BATCH` schedules, each one transaction:

1. The scanner records its release first (a compare-and-set on what it read) and a pass of its
   own; each batch's first statement renews the pass's lease (:data:`PASS_LEASE_S`) and stores
   where the pass has got to, holding the record until the batch commits: once a process under
   newer rules claims, no batch under older rules writes again. One pass per release: a scanner
   under the same rules that finds the pass leased leaves it to its owner (every replica starts
   within seconds during a rollout), and takes it over, from where it stopped, only once the lease
   has run out.
2. The next active cron schedules by id (keyset); of those, the ones whose next fire is after the
   horizon (now plus the look-ahead) are locked, SKIP LOCKED: a fire within the horizon may be
   leased or made already and stays as it is; one a scanner's batch or a user's change holds is
   tried again once at the end of the pass.
3. Each fire is computed again from the horizon, within the schedule's start and end bounds: no fire
   already made can come back, so nothing fires twice. (A fire the new rules put before the horizon,
   where the old ones put it after, is not made: at most one per schedule, within the look-ahead.)
4. The fires that changed are written in one UPDATE, where the row still has the version and next
   fire read; a schedule left with no fire within its end bound is completed.

Then the record says the pass is done, and one log line gives the counts. A pass cut short (the
process stopped) is taken over by a scanner under the same rules once its lease has run out, within
:data:`JUDGE_EVERY_S` after.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg

from scheduler.domain.cron import CronSchedule
from scheduler.domain.policies import cron_fire_after
from scheduler.domain.zone_rules import LoadedZoneRules, ZoneRulesVersion, loaded_zone_rules
from scheduler.runtime.service import Check, Service
from scheduler.store import zone_rules as store
from scheduler.store.database import Database, Session
from scheduler.store.zone_rules import NO_ID, MovedFire, RecordedZoneRules, StoredFire

Row = dict[str, Any]
# Schedules per transaction: computing 500 next fires takes about 33 ms of a core, the time their
# rows stay locked (none of them due within the look-ahead, so no scan waits for them).
BATCH = 500
# How often the record is read again once nothing is to be done: a pass another scanner under the
# same rules left unfinished (it stopped) is taken over within this after its lease ran out. Well
# under /live's 90 s, which the loop's turns are held to.
JUDGE_EVERY_S = 30.0
# How long a pass is its owner's after its last batch began: a batch takes tens of milliseconds, so
# a pass without one for this long was cut short (its scanner stopped, or lost PostgreSQL for as
# long; a batch of its after that finds the pass taken over ends its own).
PASS_LEASE_S = 120.0


@dataclass
class _Pass:
    version: ZoneRulesVersion
    pass_id: UUID
    started: float = field(default_factory=time.monotonic)
    after: UUID = NO_ID
    held: list[UUID] = field(default_factory=list)
    retrying: bool = False
    checked: int = 0
    moved: int = 0
    completed: int = 0
    failed: int = 0
    held_at_end: int = 0

    def resume_after(self) -> UUID:
        """The schedule id up to which every fire was moved (or left) by the batches so far: the
        keyset's position, less the ids held by other transactions, which come again after a
        takeover. Those are kept in id order, so the first is the least."""
        if not self.held:
            return self.after
        return UUID(int=max(0, self.held[0].int - 1))


class ZoneRulesRecompute(Service):
    transient = (psycopg.OperationalError,)

    def __init__(self, database: Database, lookahead_s: float, rules: LoadedZoneRules | None = None) -> None:
        super().__init__("zone-rules")
        self.session = Session(database)
        self.lookahead_s = lookahead_s
        self.rules = loaded_zone_rules() if rules is None else rules
        self._pass: _Pass | None = None
        self._said: str | None = None  # the last judgement logged, so that each is said once

    def checks(self) -> Sequence[Check]:
        return (self.session.database.check(),)

    def step(self) -> bool:
        conn = self.session.conn
        if self._pass is None:
            self._pass = self._judge(conn)
            return self._pass is not None
        return self._batch(conn, self._pass)

    def idle(self, stop: threading.Event) -> None:
        stop.wait(JUDGE_EVERY_S)

    def reset(self) -> None:
        self.session.close()

    def close(self) -> None:
        self.session.close()

    def _say(self, judgement: str) -> None:
        if judgement != self._said:
            self._said = judgement
            self.log.info("%s", judgement)

    def _judge(self, conn: psycopg.Connection[Row]) -> _Pass | None:
        """A pass to make, its release recorded; None when this process leaves the fires as they are."""
        mine, source = self.rules.version, self.rules.source
        if mine is None:
            self._say(
                f"the zone rules loaded ({source}) have no release that can be told (no "
                f"'# version' line in a tzdata.zi): stored next fires are left as they are"
            )
            return None
        pass_id = uuid.uuid4()
        while True:  # until judged on a record no other process changed meanwhile
            with conn.transaction():
                recorded = store.recorded_zone_rules(conn)
                try:
                    seen = None if recorded.version is None else ZoneRulesVersion.parse(recorded.version)
                except ValueError:
                    seen = None  # not a release this code can order: as if none were recorded
                if seen is not None and seen > mine:
                    self._say(
                        f"stored next fires follow zone rules {seen}, newer than those loaded ({mine}, "
                        f"{source}): left as they are"
                    )
                    return None
                if seen == mine and recorded.done:
                    self._say(f"stored next fires follow the zone rules loaded ({mine}, {source})")
                    return None
                if seen == mine and recorded.leased:
                    self._say(
                        f"another scanner is moving the stored next fires to the zone rules loaded "
                        f"({mine}, {source}): left to it while it renews its lease"
                    )
                    return None
                claimed = store.claim_zone_rules(conn, str(mine), pass_id, recorded, PASS_LEASE_S)
                if claimed is not None:
                    break
        self._said = None
        self.log.info(
            "computing stored next fires again under zone rules %s (%s), %s",
            mine,
            source,
            self._whence(recorded, str(mine), claimed.resume_after),
        )
        return _Pass(mine, pass_id, after=claimed.resume_after or NO_ID)

    @staticmethod
    def _whence(recorded: RecordedZoneRules, mine: str, resume_after: UUID | None) -> str:
        """Where the pass starts from, for its first log line."""
        if recorded.version is None:
            return "in place of rules nobody recorded"
        if recorded.version != mine:
            return f"in place of zone rules {recorded.version}"
        ran_out = "" if recorded.lease_until is None else f" at {recorded.lease_until.isoformat()}"
        start = "the first schedule" if resume_after is None else f"after schedule {resume_after}"
        return f"taking over the pass a scanner left unfinished (its lease ran out{ran_out}), from {start}"

    def _batch(self, conn: psycopg.Connection[Row], job: _Pass) -> bool:
        """One batch of the pass; False once the pass has ended (done, taken by newer rules, or
        taken over after its lease ran out). The pass's position moves only once the batch has
        committed: a batch rolled back (a transient error, retried) is made again, never skipped,
        and the position the next batch records for a takeover is that of committed batches."""
        with conn.transaction():
            if not store.renew_zone_rules_pass(conn, job.pass_id, job.resume_after(), PASS_LEASE_S):
                recorded = store.recorded_zone_rules(conn)
                self.log.info(
                    "the pass under zone rules %s is no longer the record's (another scanner claimed it, "
                    "under zone rules %s): this pass stops",
                    job.version,
                    recorded.version,
                )
                self._pass = None
                return False
            if job.retrying:
                ids = job.held[:BATCH]
            else:
                ids = store.cron_schedules_after(conn, job.after, BATCH, self.lookahead_s)
            if not ids and job.retrying:
                store.finish_zone_rules(conn, job.pass_id)
            elif ids:
                fires = store.lock_fires_to_recompute(conn, ids, self.lookahead_s)
                locked = {fire.schedule_id for fire in fires}
                held = [schedule_id for schedule_id in ids if schedule_id not in locked]
                moves, failed = self._computed(fires)
                written = store.move_next_fires(conn, moves)
                # The log counts what was written: the rows are this transaction's, locked, so today
                # that is every move computed, but the count must not rest on that.
                moves = [move for move in moves if move.read.schedule_id in written]
        if not ids:
            if not job.retrying:
                job.retrying = True  # then the ids other transactions held, once more
                return True
            self._finished(job)
            return False
        if job.retrying:
            job.held = job.held[BATCH:]
            job.held_at_end += len(held)
        else:
            job.after = ids[-1]
            job.held.extend(held)
        job.checked += len(fires)
        job.failed += failed
        job.moved += sum(1 for move in moves if move.next_fire_at is not None)
        job.completed += sum(1 for move in moves if move.next_fire_at is None)
        return True

    @staticmethod
    def _computed(fires: Sequence[StoredFire]) -> tuple[list[MovedFire], int]:
        """The fires that move, and how many could not be computed."""
        moves = []
        failed = 0
        for fire in fires:
            try:
                cron = CronSchedule.of(fire.cron, fire.tz, schedule_id=fire.schedule_id)
                following = cron_fire_after(cron, fire.horizon, fire.start_at, fire.end_at)
            except Exception:
                # Whatever the reason (a zone the new database lacks), the fire stays as it is: the
                # scanner sets the schedule aside with the reason when that fire comes.
                failed += 1
                continue
            if following != fire.next_fire_at:
                moves.append(MovedFire(fire, following))
        return moves, failed

    def _finished(self, job: _Pass) -> None:
        self._pass = None
        self._say(f"stored next fires follow the zone rules loaded ({job.version}, {self.rules.source})")
        self.log.info(
            "stored next fires computed again under zone rules %s in %.1f s: %d active cron schedules "
            "checked, %d fires moved, %d schedules completed (no fire left within their end), %d "
            "could not be computed (left for the scanner), %d held by other transactions kept theirs",
            job.version,
            time.monotonic() - job.started,
            job.checked,
            job.moved,
            job.completed,
            job.failed,
            job.held_at_end,
        )
