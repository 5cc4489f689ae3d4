"""The application service behind both transports: one method per RPC of ``SchedulerService``.

:meth:`SchedulerApi.call` is what a transport calls, with the method's name, the caller's
``Authorization`` value and the request message; it returns the response message or raises
:class:`~scheduler.api.errors.ApiError`. In order, for every call: authenticate, check the role,
check the request's strings, take a rate-limit token, then do the work on one pooled connection,
under the request's idempotency key when it has one, in the caller's trace context when it sent
one (W3C ``traceparent`` and ``tracestate``: a created schedule's ``schedule.create`` span is a child
of the caller's span, and a one-shot's run goes on in that trace). Schedules change only through
:mod:`scheduler.schedule.service`, as for the CLI and Kafka commands, so versions, states and the
audit log follow the same rules whichever way a change came in; the actor is ``api:<subject>``.

Another app's objects are answered as missing (NOT_FOUND), whether they exist or not.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast
from uuid import UUID

import psycopg
import psycopg_pool
from google.protobuf.message import Message
from opentelemetry.context import Context

from scheduler.api import idempotency
from scheduler.api import messages as m
from scheduler.api.auth import Access, Authenticator, Principal, the_authorization
from scheduler.api.errors import ApiError, Code, invalid, not_found
from scheduler.api.limits import RateLimiter
from scheduler.api.metrics import REQUEST_SECONDS, REQUESTS
from scheduler.config import Settings
from scheduler.domain.run_state import RunState
from scheduler.domain.schedule import ScheduleState
from scheduler.reconcile.replay import UNDECODABLE, Replayer, ReplayFilter, first_not_dead
from scheduler.scan.dispatch import JobDispatcher
from scheduler.schedule import service
from scheduler.schedule.service import (
    MAX_BATCH,
    InvalidTransition,
    KeyConflict,
    NewSchedule,
    ScheduleNotFound,
    UnknownApp,
)
from scheduler.schedule.spec import InvalidSchedule, PayloadTooLarge, stored_spec
from scheduler.store import api as store
from scheduler.store import runs as run_store
from scheduler.store import schedules as schedule_store
from scheduler.store.schedules import VersionConflict
from scheduler.telemetry.tracing import continuing
from scheduler.v1 import scheduler_pb2 as pb

log = logging.getLogger("scheduler.api")
Row = dict[str, Any]
Conn = psycopg.Connection[Row]
M = TypeVar("M", bound=Message)
MAX_REPLAY = 10_000
# A request larger than any but a batch create is parsed and applied one at a time: a batch of
# 32 MiB takes about ten times that in memory while it is parsed and stored, and four at once took
# the API past its memory limit. Others wait their turn (see LargeRequests).
LARGE_REQUEST_BYTES = m.MAX_REQUEST_BYTES
LARGE_REQUEST_WAIT_S = 60.0
# How long a large body may take to arrive once its turn is taken: a client that stalls must not
# hold every other batch create back.
LARGE_BODY_READ_S = 20.0


class LargeRequests:
    """The turns of requests over :data:`LARGE_REQUEST_BYTES`, one at a time per process, shared by
    both transports and taken on their event loop: a request waiting for its turn holds no call
    thread. Only an admitted caller (authenticated, and allowed the method) waits for one; a wait
    over :data:`LARGE_REQUEST_WAIT_S` answers ``UNAVAILABLE``, counted as the call's outcome."""

    def __init__(self) -> None:
        self._gate = asyncio.Semaphore(1)

    async def take(self, method_name: str, wait_s: float = LARGE_REQUEST_WAIT_S) -> None:
        """``wait_s``: what is left of the request's LARGE_REQUEST_WAIT_S (a gRPC call may have waited
        for room to be read in, see grpc_server)."""
        await take_within(self._gate, method_name, wait_s)

    def give_back(self) -> None:
        self._gate.release()


async def take_within(gate: asyncio.Semaphore, method_name: str, wait_s: float) -> None:
    """Acquire ``gate`` for a large request, or answer ``UNAVAILABLE`` (counted as the call's outcome)
    once it has waited ``wait_s``."""
    try:
        await asyncio.wait_for(gate.acquire(), max(wait_s, 0.0))
    except TimeoutError:
        REQUESTS.labels(method_name, Code.UNAVAILABLE.value).inc()
        raise ApiError(
            Code.UNAVAILABLE,
            f"busy with other requests over {LARGE_REQUEST_BYTES // (1024 * 1024)} MiB "
            f"for {LARGE_REQUEST_WAIT_S:.0f} s; retry, or send smaller batches",
        ) from None


AUDIT_ENTITIES = ("app", "schedule", "run")


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    access: Access
    bucket: str
    """Its rate-limit class."""
    request: type[Message]
    response: type[Message]
    idempotent: bool = False


METHODS: dict[str, Method] = {
    method.name: method
    for method in (
        Method("CreateSchedule", Access.WRITE, "create", pb.CreateScheduleRequest, pb.Schedule, True),
        Method(
            "CreateSchedules",
            Access.WRITE,
            "create_batch",
            pb.CreateSchedulesRequest,
            pb.CreateSchedulesResponse,
            True,
        ),
        Method("GetSchedule", Access.READ, "get", pb.GetScheduleRequest, pb.Schedule),
        Method("UpdateSchedule", Access.WRITE, "update", pb.UpdateScheduleRequest, pb.Schedule),
        Method("DeleteSchedule", Access.ADMIN, "delete", pb.DeleteScheduleRequest, pb.Schedule),
        Method("ListSchedules", Access.READ, "list", pb.ListSchedulesRequest, pb.ListSchedulesResponse),
        Method(
            "TriggerSchedule",
            Access.TRIGGER,
            "trigger",
            pb.TriggerScheduleRequest,
            pb.TriggerScheduleResponse,
            True,
        ),
        Method("PauseSchedule", Access.WRITE, "update", pb.PauseScheduleRequest, pb.Schedule),
        Method("ResumeSchedule", Access.WRITE, "update", pb.ResumeScheduleRequest, pb.Schedule),
        Method(
            "GetScheduleHistory",
            Access.READ,
            "list",
            pb.GetScheduleHistoryRequest,
            pb.GetScheduleHistoryResponse,
        ),
        Method("GetRun", Access.READ, "get", pb.GetRunRequest, pb.Run),
        Method("ListRuns", Access.READ, "list", pb.ListRunsRequest, pb.ListRunsResponse),
        Method("ListDeadLetters", Access.READ, "list", pb.ListDeadLettersRequest, pb.ListDeadLettersResponse),
        Method(
            "ReplayDeadLetters",
            Access.ADMIN,
            "replay",
            pb.ReplayDeadLettersRequest,
            pb.ReplayDeadLettersResponse,
            True,
        ),
        Method(
            "ListAuditEntries", Access.READ, "list", pb.ListAuditEntriesRequest, pb.ListAuditEntriesResponse
        ),
    )
}


def _position(cursor: str) -> tuple[datetime, UUID] | None:
    """Where a keyset page by (an instant, an id) starts: the cursor this API gave, or None."""
    parts = m.decode_cursor(cursor, 2)
    return None if parts is None else (m.instant_of(parts[0]), m.uuid_of(parts[1], "cursor"))


def _page(
    rows: list[Row], limit: int, instant: str, *, byte_bounded: bool = False
) -> tuple[list[Row], str, bool]:
    """A page of ``limit`` from ``limit + 1`` rows (``byte_bounded``: see :func:`_within_bytes`),
    with the cursor of its last row (by ``instant`` and id) when more follow."""
    rows, has_more = _within_bytes(rows, limit) if byte_bounded else (rows[:limit], len(rows) > limit)
    last = rows[-1] if has_more else None
    return rows, "" if last is None else m.encode_cursor(last[instant].isoformat(), str(last["id"])), has_more


def _within_bytes(rows: list[Row], limit: int) -> tuple[list[Row], bool]:
    """The page of a byte-bounded query's rows (``page_bytes``: theirs up to each row's): at most
    ``limit`` of them, and only the first if it alone passes :data:`MAX_PAGE_BYTES`; and whether
    more follow (a row read and left out)."""
    page = rows[:limit]
    ends = next((i for i, row in enumerate(page) if i > 0 and row["page_bytes"] > m.MAX_PAGE_BYTES), None)
    if ends is not None:
        page = page[:ends]
    return page, len(rows) > len(page)


def _domain_error(exc: Exception) -> ApiError | None:
    """The API's answer to a refusal of the schedule service; None for anything else."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ScheduleNotFound):
        return ApiError(Code.NOT_FOUND, str(exc))
    if isinstance(exc, UnknownApp):  # UnknownBatchApp too, with its index
        # As another app's: a token scoped to apps cannot tell one that does not exist from it.
        index = getattr(exc, "index", None)
        return ApiError(Code.NOT_FOUND, str(exc), item_field("app", index))
    if isinstance(exc, VersionConflict):
        return ApiError(Code.VERSION_CONFLICT, str(exc))
    if isinstance(exc, InvalidTransition):
        return ApiError(Code.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, KeyConflict):
        return ApiError(Code.ALREADY_EXISTS, str(exc), {} if exc.index is None else {"index": exc.index})
    if isinstance(exc, PayloadTooLarge):
        return ApiError(Code.PAYLOAD_TOO_LARGE, str(exc))
    if isinstance(exc, InvalidSchedule):  # UnknownApp and InvalidBatchItem too
        index = getattr(exc, "index", None)
        if exc.field is not None:
            return ApiError(Code.INVALID_SCHEDULE, str(exc), item_field(m.request_field(exc.field), index))
        return ApiError(Code.INVALID_SCHEDULE, str(exc), {} if index is None else {"index": index})
    if isinstance(exc, psycopg.OperationalError | psycopg_pool.PoolTimeout):
        return ApiError(Code.UNAVAILABLE, "the database is unavailable; retry later")
    return None


def item_field(field: str, index: int | None) -> dict[str, str | int]:
    """``details`` naming a field by its whole path as the client sent it: within a batch's item
    (``schedules[1].retry_config.max_attempts``, with the item's ``index``), else as it is."""
    if index is None:
        return {"field": field}
    return {"field": f"schedules[{index}].{field}", "index": index}


class SchedulerApi:
    def __init__(
        self,
        settings: Settings,
        pool: psycopg_pool.ConnectionPool[Conn],
        authenticator: Authenticator,
        dispatcher: JobDispatcher,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.authenticator = authenticator
        self.dispatcher = dispatcher
        self.limiter = RateLimiter(settings.rate_limits)
        self.replayer = Replayer(settings, dispatcher)
        self._handlers: dict[str, Callable[[Conn, Principal, Any], Message]] = {
            name: getattr(self, "_" + "".join("_" + c.lower() if c.isupper() else c for c in name)[1:])
            for name in METHODS
        }

    def call(
        self,
        method_name: str,
        authorization: str | None,
        request: Message | Callable[[], Message],
        size: int = 0,
        admitted: Principal | None = None,
        trace_context: Context | None = None,
    ) -> Message:
        """One call of ``method_name``; see the module docstring for what happens in which order.
        ``request`` may be a function that parses it, called only once the caller is authenticated
        and allowed the method (so that an unauthenticated client's body costs no parsing); ``size``
        is its bytes as received: after a large one the freed memory is given back to the system.
        ``admitted``: what :meth:`admit` answered for this very request, so its token is not
        verified a second time. ``trace_context``: the caller's
        (:func:`~scheduler.telemetry.tracing.caller_context`), current for the call."""
        method = METHODS[method_name]
        started = time.perf_counter()
        code = "OK"
        # Current for the whole call, so that its log lines (an INTERNAL error's too) name the trace.
        with continuing(trace_context):
            try:
                principal = admitted if admitted is not None else self._admitted(method, authorization)
                return self._authorised_call(method, principal, request)
            except Exception as exc:
                error = _domain_error(exc)
                if error is None:
                    log.exception("%s failed", method.name)
                    error = ApiError(Code.INTERNAL, "internal error; the server's log has the details")
                code = error.code.value
                raise error from None
            finally:
                REQUESTS.labels(method.name, code).inc()
                REQUEST_SECONDS.labels(method.name).observe(time.perf_counter() - started)
                if size > LARGE_REQUEST_BYTES:
                    _give_back_memory()

    def authorization_of(self, method_name: str, values: Sequence[str]) -> str | None:
        """The one ``Authorization`` value a request carries; two are refused (UNAUTHENTICATED),
        and counted as the call's outcome, as :meth:`admit` counts its refusals."""
        try:
            return the_authorization(values)
        except ApiError as error:
            REQUESTS.labels(method_name, error.code.value).inc()
            raise

    def admit(self, method_name: str, authorization: str | None) -> Principal:
        """The caller, or raise what :meth:`call` would answer one who may not call
        ``method_name``: for a transport to check before it receives the request (and hand to
        :meth:`call`). A refusal is counted as the call's outcome, as :meth:`call` counts it."""
        try:
            return self._admitted(METHODS[method_name], authorization)
        except ApiError as error:
            REQUESTS.labels(method_name, error.code.value).inc()
            raise

    def _admitted(self, method: Method, authorization: str | None) -> Principal:
        principal = self.authenticator.authenticate(authorization)
        if not principal.may(method.access):
            raise ApiError(
                Code.PERMISSION_DENIED,
                f"{method.name} needs a role that may {method.access.value} "
                f"(the token has {', '.join(sorted(principal.roles)) or 'no scheduler role'})",
            )
        return principal

    def _authorised_call(
        self, method: Method, principal: Principal, request: Message | Callable[[], Message]
    ) -> Message:
        parsed = request if isinstance(request, Message) else request()
        m.check_strings(parsed)
        with self.pool.connection() as conn:
            self.limiter.take(conn, principal.key, method.bucket)
            handler = self._handlers[method.name]
            if method.idempotent:
                return idempotency.once(
                    conn, principal.key, method.name, parsed, method.response,
                    lambda: handler(conn, principal, parsed), scope=principal.scope(),
                )  # fmt: skip
            return handler(conn, principal, parsed)

    # --- scope ------------------------------------------------------------------------------------

    def _schedule(
        self, conn: Conn, principal: Principal, text: str, lock: bool = False, field: str = "id"
    ) -> Row:
        schedule_id = m.uuid_of(text, field)
        row = (schedule_store.lock_schedule_with_key if lock else schedule_store.schedule_with_key)(
            conn, schedule_id
        )
        if row is None or not principal.sees(row["app"]):
            raise not_found(f"schedule {schedule_id}")
        return row

    def _app_filter(self, conn: Conn, principal: Principal, app: str) -> list[str] | None:
        """The apps a listing covers: the one asked for (if the caller sees it and it exists: an
        empty page would read as an app with nothing in it, and a typo would go unseen), else
        the caller's scope."""
        if not app:
            return principal.scope()
        if not principal.sees(app) or schedule_store.get_app(conn, app) is None:
            raise not_found(f"app {app[:80]!r}")
        return [app]

    # --- schedules --------------------------------------------------------------------------------

    def _create_schedule(
        self, conn: Conn, principal: Principal, request: pb.CreateScheduleRequest
    ) -> pb.Schedule:
        spec = m.spec_of_create(request)
        if not principal.sees(spec.app):
            raise ApiError(Code.NOT_FOUND, f"no app {spec.app!r}", {"field": "app"})
        enabled = request.enabled if request.HasField("enabled") else True
        row = service.create_schedule(
            conn, spec, principal.actor, schedule_key=m.schedule_key_of(request), enabled=enabled
        )
        return m.schedule_message(row)

    def _create_schedules(
        self, conn: Conn, principal: Principal, request: pb.CreateSchedulesRequest
    ) -> pb.CreateSchedulesResponse:
        if not 1 <= len(request.schedules) <= MAX_BATCH:
            raise invalid(f"a batch holds 1 to {MAX_BATCH} schedules, got {len(request.schedules)}")
        batch: list[NewSchedule] = []
        for index, item in enumerate(request.schedules):
            if item.idempotency_key:
                raise invalid(f"schedules[{index}]: give the batch's idempotency_key, not its items'")
            try:
                spec = m.spec_of_create(item)
                schedule_key = m.schedule_key_of(item)
            except ApiError as exc:
                field = exc.details.get("field")
                named = item_field(field, index) if isinstance(field, str) else {"index": index}
                details = exc.details | named
                raise ApiError(exc.code, f"schedules[{index}]: {exc.message}", details) from None
            if not principal.sees(spec.app):
                raise ApiError(
                    Code.NOT_FOUND, f"schedules[{index}]: no app {spec.app!r}", item_field("app", index)
                )
            enabled = item.enabled if item.HasField("enabled") else True
            batch.append(NewSchedule(spec, schedule_key, enabled))
        rows = service.create_schedules(conn, batch, principal.actor)
        return pb.CreateSchedulesResponse(schedules=[m.schedule_message(row) for row in rows])

    def _get_schedule(self, conn: Conn, principal: Principal, request: pb.GetScheduleRequest) -> pb.Schedule:
        return m.schedule_message(self._schedule(conn, principal, request.id))

    def _update_schedule(
        self, conn: Conn, principal: Principal, request: pb.UpdateScheduleRequest
    ) -> pb.Schedule:
        with conn.transaction():
            row = self._schedule(conn, principal, request.id, lock=True)
            version = request.version if request.HasField("version") else None
            if version is not None and row["version"] != version:
                raise VersionConflict(
                    f"schedule {row['id']} is at version {row['version']}, not {version}; read it again"
                )
            new = row
            if m.changes_spec(request):
                spec = m.spec_of_update(stored_spec(row), request)
                new = service.update_schedule(conn, row["id"], spec, principal.actor, row["version"])
            if request.HasField("enabled") and request.enabled != (new["state"] == ScheduleState.ACTIVE):
                change = service.resume if request.enabled else service.pause
                new = change(conn, row["id"], principal.actor, new["version"])
        return m.schedule_message(new | {"schedule_key": row["schedule_key"]})

    def _transition(
        self,
        conn: Conn,
        principal: Principal,
        request: pb.DeleteScheduleRequest | pb.PauseScheduleRequest | pb.ResumeScheduleRequest,
        change: Callable[[Conn, UUID, str, int | None], Row],
    ) -> pb.Schedule:
        with conn.transaction():
            # Locked: a change without a version applies to the latest one, never fails on a
            # concurrent change it did not ask to guard against.
            row = self._schedule(conn, principal, request.id, lock=True)
            version = request.version if request.HasField("version") else None
            new = change(conn, row["id"], principal.actor, version)
        return m.schedule_message(new | {"schedule_key": row["schedule_key"]})

    def _delete_schedule(
        self, conn: Conn, principal: Principal, request: pb.DeleteScheduleRequest
    ) -> pb.Schedule:
        return self._transition(conn, principal, request, service.cancel)

    def _pause_schedule(
        self, conn: Conn, principal: Principal, request: pb.PauseScheduleRequest
    ) -> pb.Schedule:
        return self._transition(conn, principal, request, service.pause)

    def _resume_schedule(
        self, conn: Conn, principal: Principal, request: pb.ResumeScheduleRequest
    ) -> pb.Schedule:
        return self._transition(conn, principal, request, service.resume)

    def _list_schedules(
        self, conn: Conn, principal: Principal, request: pb.ListSchedulesRequest
    ) -> pb.ListSchedulesResponse:
        limit = m.page_limit(request.limit)
        apps = self._app_filter(conn, principal, request.app)
        if request.state and request.state not in set(ScheduleState):
            raise invalid(f"state must be one of {', '.join(ScheduleState)}", field="state")
        rows = store.schedules_page(
            conn,
            apps=apps,
            state=request.state or None,
            enabled=request.enabled if request.HasField("enabled") else None,
            after=_position(request.cursor),
            limit=limit + 1,
            max_bytes=m.MAX_PAGE_BYTES,
        )
        rows, next_cursor, has_more = _page(rows, limit, "created_at", byte_bounded=True)
        return pb.ListSchedulesResponse(
            schedules=[m.schedule_message(row) for row in rows], next_cursor=next_cursor, has_more=has_more
        )

    def _trigger_schedule(
        self, conn: Conn, principal: Principal, request: pb.TriggerScheduleRequest
    ) -> pb.TriggerScheduleResponse:
        row = self._schedule(conn, principal, request.id)
        version = request.version if request.HasField("version") else None
        run_id = service.trigger(
            conn, self.settings, row["id"], principal.actor, self.dispatcher, expected_version=version
        )
        return pb.TriggerScheduleResponse(schedule_id=str(row["id"]), run_id=str(run_id))

    # --- runs -------------------------------------------------------------------------------------

    def _get_schedule_history(
        self, conn: Conn, principal: Principal, request: pb.GetScheduleHistoryRequest
    ) -> pb.GetScheduleHistoryResponse:
        limit = m.page_limit(request.limit)
        row = self._schedule(conn, principal, request.id)
        cursor = m.decode_cursor(request.cursor, 1)
        before = None if cursor is None else m.instant_of(cursor[0])
        runs = store.runs_page(conn, row["id"], before, limit + 1)
        has_more = len(runs) > limit
        runs = runs[:limit]
        return pb.GetScheduleHistoryResponse(
            runs=[m.run_message(run) for run in runs],
            next_cursor=m.encode_cursor(runs[-1]["scheduled_for"].isoformat()) if has_more else "",
            has_more=has_more,
        )

    def _get_run(self, conn: Conn, principal: Principal, request: pb.GetRunRequest) -> pb.Run:
        run_id = m.uuid_of(request.id, "id")
        run = run_store.get_run(conn, run_id)
        if run is None or not principal.sees(run["app"]):
            raise not_found(f"run {run_id}")
        return m.run_message(run)

    def _list_runs(
        self, conn: Conn, principal: Principal, request: pb.ListRunsRequest
    ) -> pb.ListRunsResponse:
        limit = m.page_limit(request.limit)
        apps = self._app_filter(conn, principal, request.app)
        if request.state and request.state not in set(RunState):
            raise invalid(f"state must be one of {', '.join(RunState)}", field="state")
        runs = store.app_runs_page(
            conn, apps=apps, state=request.state or None, after=_position(request.cursor), limit=limit + 1
        )
        runs, next_cursor, has_more = _page(runs, limit, "scheduled_for")
        return pb.ListRunsResponse(
            runs=[m.run_message(run) for run in runs], next_cursor=next_cursor, has_more=has_more
        )

    def _list_dead_letters(
        self, conn: Conn, principal: Principal, request: pb.ListDeadLettersRequest
    ) -> pb.ListDeadLettersResponse:
        limit = m.page_limit(request.limit)
        apps = self._app_filter(conn, principal, request.app)
        schedule_id = None
        if request.schedule_id:
            schedule_id = self._schedule(conn, principal, request.schedule_id, field="schedule_id")["id"]
        rows = run_store.list_dead(
            conn,
            app=request.app or None,
            schedule_id=schedule_id,
            error_class=request.error_class or None,
            since=m.moment_of(request, "since"),
            until=m.moment_of(request, "until"),
            limit=limit,
            apps=apps,
        )
        return pb.ListDeadLettersResponse(dead_letters=[m.dead_letter_message(row) for row in rows])

    def _replay_dead_letters(
        self, conn: Conn, principal: Principal, request: pb.ReplayDeadLettersRequest
    ) -> pb.ReplayDeadLettersResponse:
        run_ids = self._dead_runs(conn, principal, request.run_ids)
        limit = m.page_limit(request.limit, default=len(run_ids) if run_ids else 100, maximum=MAX_REPLAY)
        app = request.app or None
        apps = self._app_filter(conn, principal, request.app)
        schedule_id = None
        if request.schedule_id:
            schedule_id = self._schedule(conn, principal, request.schedule_id, field="schedule_id")["id"]
        # Runs or a schedule named are in the caller's scope already; otherwise one app bounds the
        # replay, the token's only one or the one named: a token that sees every app names it too.
        if app is None and not run_ids and schedule_id is None:
            if apps is None or len(apps) != 1:
                raise invalid("name the app whose dead letters to replay", field="app")
            app = apps[0]
        where = ReplayFilter(
            app=app,
            schedule_id=schedule_id,
            error_class=request.error_class or None,
            since=m.moment_of(request, "since"),
            until=m.moment_of(request, "until"),
            force=request.force,
            run_ids=run_ids,
        )
        if request.dry_run:
            candidates = self.replayer.candidates(conn, where, limit)
            return pb.ReplayDeadLettersResponse(
                replayed=len(candidates), run_ids=[str(dead.run.id) for dead in candidates], dry_run=True
            )
        moved: list[UUID] = []
        replayed = self.replayer.replay(conn, where, limit, principal.actor, moved=moved)
        return pb.ReplayDeadLettersResponse(replayed=replayed, run_ids=[str(run_id) for run_id in moved])

    def _dead_runs(self, conn: Conn, principal: Principal, texts: Sequence[str]) -> tuple[UUID, ...] | None:
        """The runs a replay names, each one the caller sees and dead (NOT_FOUND or
        FAILED_PRECONDITION for the first that is not, before anything changes); None: no names."""
        if not texts:
            return None
        if len(texts) > MAX_REPLAY:
            raise invalid(f"name at most {MAX_REPLAY} runs", field="run_ids")
        run_ids = tuple(dict.fromkeys(m.uuid_of(text, "run_ids") for text in texts))
        refused = first_not_dead(conn, run_ids, principal.sees)
        if refused is not None and refused.state is None:
            raise not_found(f"run {refused.run_id}")
        if refused is not None and refused.state == UNDECODABLE:
            raise ApiError(
                Code.FAILED_PRECONDITION,
                f"{refused.run_id} is an undecodable dead letter, not a run: there is nothing to replay",
                {"field": "run_ids"},
            )
        if refused is not None:
            raise ApiError(
                Code.FAILED_PRECONDITION,
                f"run {refused.run_id} is {refused.state}, not dead: only dead runs are replayed",
                {"field": "run_ids"},
            )
        return run_ids

    # --- audit ------------------------------------------------------------------------------------

    def _list_audit_entries(
        self, conn: Conn, principal: Principal, request: pb.ListAuditEntriesRequest
    ) -> pb.ListAuditEntriesResponse:
        limit = m.page_limit(request.limit)
        apps = self._app_filter(conn, principal, request.app)
        if request.entity and request.entity not in AUDIT_ENTITIES:
            raise invalid(f"entity must be one of {', '.join(AUDIT_ENTITIES)}", field="entity")
        cursor = m.decode_cursor(request.cursor, 1)
        before_id = None
        if cursor is not None:
            if not (cursor[0].isascii() and cursor[0].isdigit()) or len(cursor[0]) > 18:
                raise invalid("cursor is not one this API gave", field="cursor")
            before_id = int(cursor[0])
        rows = store.audit_page(
            conn,
            apps=apps,
            entity=request.entity or None,
            entity_id=request.entity_id or None,
            actor=request.actor or None,
            since=m.moment_of(request, "since"),
            before_id=before_id,
            limit=limit + 1,
            max_bytes=m.MAX_PAGE_BYTES,
        )
        rows, has_more = _within_bytes(rows, limit)
        return pb.ListAuditEntriesResponse(
            entries=[m.audit_message(row) for row in rows],
            next_cursor=m.encode_cursor(str(rows[-1]["id"])) if has_more else "",
            has_more=has_more,
        )


__all__ = ["METHODS", "ApiError", "SchedulerApi", "UnknownApp"]


def _give_back_memory() -> None:
    """Return the freed heap to the system after a large request: glibc keeps what each executor
    thread's arena freed, so large requests served by different threads added up (four batches of
    27 MiB, one at a time: 804 MB resident, against 324 MB for one)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        return cast(Callable[[int], int], ctypes.CDLL(None).malloc_trim)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_malloc_trim = _load_malloc_trim()
