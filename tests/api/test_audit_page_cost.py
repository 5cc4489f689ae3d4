"""A page of an app's audit entries costs what the app's entries cost, not what the whole log does.

The audit log is never deleted (the history retention leaves it), so it grows with every trigger,
change and replay of every app. A token scoped to a small app asking for its first page made
PostgreSQL walk the whole log, joining each entry to its schedule and run to learn its app: with two
million entries of another app, 2.5 s a page, and past the statement timeout (30 s) every scoped
listing of the audit log answers UNAVAILABLE. What PostgreSQL read of ``audit_log`` for one such
call is counted here from its statistics.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.api.client import VIEWER, HttpCaller, token
from tests.api.conftest import ApiStack
from tests.support import wait_for

pytestmark = pytest.mark.e2e

ROOT = token(subject="root-audit-cost")
ALPHA_VIEWER = token(subject="vera-audit-cost", roles=(VIEWER,), apps=["alpha"])
# Entries of another app written before the call; a page of alpha's must read nowhere near as many.
BETA_ENTRIES = 200_000
READ_BOUND = BETA_ENTRIES // 10


def audit_rows_read(api_stack: ApiStack) -> int:
    """Rows of audit_log read so far by every backend of the module's database, as reported."""
    with api_stack.connect() as conn:
        row = conn.execute(
            "select coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) as n"
            " from pg_stat_user_tables where relname = 'audit_log'"
        ).fetchone()
    assert row is not None
    n: Any = row["n"]
    return int(n)


def test_a_scoped_page_of_audit_entries_does_not_read_other_apps_entries(
    api_stack: ApiStack, http: HttpCaller
) -> None:
    def ok(method: str, request: dict[str, Any]) -> dict[str, Any]:
        outcome = http.call(method, request, ROOT)
        assert outcome.ok, (method, outcome)
        return outcome.body

    cron = {"handler": "builtin:noop", "cron_expression": "0 3 * * *"}
    alpha = ok("CreateSchedule", {"app": "alpha", "name": f"audited-{uuid.uuid4().hex[:8]}"} | cron)
    beta = ok("CreateSchedule", {"app": "beta", "name": f"busy-{uuid.uuid4().hex[:8]}"} | cron)
    with api_stack.connect() as conn:
        # What beta's triggers leave in the log, newer than alpha's entries, written at once.
        conn.execute(
            "insert into audit_log (actor, action, entity, entity_id, new_value, app)"
            " select 'api:busy', 'trigger', 'schedule', %s, jsonb_build_object('run_id', gen_random_uuid()),"
            " 'beta' from generate_series(1, %s)",
            (beta["id"], BETA_ENTRIES),
        )
        # Statistics and visibility settled now, so that autovacuum does not read the table later.
        conn.execute("vacuum analyze audit_log")
    before = audit_rows_read(api_stack)

    outcome = http.call("ListAuditEntries", {"limit": 50}, ALPHA_VIEWER)

    assert outcome.ok, outcome
    entries = outcome.body["entries"]
    assert [e["entity_id"] for e in entries if e["entity"] == "schedule"] == [alpha["id"]], entries
    # A backend reports what it read once idle for a while: wait until the call's reads are in.
    read = wait_for(
        lambda: audit_rows_read(api_stack) - before, 30, "the API's reads of audit_log to be reported"
    )
    assert read < READ_BOUND, f"one page of alpha's audit entries read {read} rows of audit_log"
