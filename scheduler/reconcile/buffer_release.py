"""The buffer release: dispatches the fire that ``buffer_one`` kept waiting once its schedule has
no unfinished run any more.

The reconciler and the lease sweeper notify ``scheduler_run_finished`` in the transaction that
ends a run, which wakes this service at once. It also looks every second whatever happens: a
notification can come before the fire it should release is visible (the scanner buffers a fire
while the reconciler, in a transaction of its own, ends the run before it; the wake-up finds
nothing, and the scanner commits after), or be missed across a restart. The look is one indexed
query over the buffered runs only, so a lost wake-up delays a release by a second at most. The
waiting run keeps its row and identity; releasing it writes its dispatch message to the outbox in
the same transaction, without a lease (the worker's start gives it one).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import psycopg

from scheduler.domain.run_state import RunState
from scheduler.reconcile import metrics
from scheduler.runtime.service import Check, Service
from scheduler.scan.dispatch import JobDispatcher, attempt_deadline
from scheduler.store import reconcile as store
from scheduler.store.database import Database, Session
from scheduler.store.entities import execution_from_row
from scheduler.store.scan import NewRun, notify_outbox

RUN_FINISHED_CHANNEL = "scheduler_run_finished"
# Also the bound on a release whose wake-up came too early or was lost (see the module docstring).
POLL_S = 1.0
Row = dict[str, Any]


class BufferRelease(Service):
    transient = (psycopg.OperationalError,)

    def __init__(self, database: Database, dispatcher: JobDispatcher) -> None:
        super().__init__("buffer-release")
        self.database = database
        self.dispatcher = dispatcher
        self.session = Session(database, RUN_FINISHED_CHANNEL)

    def checks(self) -> Sequence[Check]:
        return (self.database.check(),)

    def step(self) -> bool:
        released = self.release(self.session.conn)
        if released:
            metrics.BUFFERED_RELEASED.inc(released)
        return False

    def idle(self, stop: threading.Event) -> None:
        self.session.wait(POLL_S, stop)

    def reset(self) -> None:
        self.session.close()

    def close(self) -> None:
        self.session.close()

    def release(self, conn: psycopg.Connection[Row]) -> int:
        """Dispatch every waiting fire whose schedule is free now, in one transaction."""
        with conn.transaction():
            released = []
            for row in store.releasable_buffered_runs(conn):
                message = self.dispatcher.message(
                    run_id=row["id"],
                    schedule_id=row["schedule_id"],
                    job=execution_from_row(row),
                    scheduled_for=row["scheduled_for"],
                    attempt=1,
                    deadline=attempt_deadline(row["now"], row["timeout_ms"]),
                    traceparent=row["creation_traceparent"],
                )
                released.append(
                    NewRun(
                        id=row["id"],
                        schedule_id=row["schedule_id"],
                        app=row["app"],
                        scheduled_for=row["scheduled_for"],
                        state=RunState.PENDING,
                        max_attempts=row["max_attempts"],
                        message=message,
                    )
                )
            if released:
                store.dispatch_buffered_runs(conn, released)
                notify_outbox(conn)
        return len(released)
