"""What a benchmark run cost the database and the broker, per job: the figures that decide how far
one PostgreSQL carries the scheduler, since it is the one part that does not scale out.

A :class:`CostProbe` takes a snapshot before a run and one after, and reports the difference:

- ``wal_bytes``: ``pg_current_wal_lsn()`` before and after (the whole server's WAL, so nothing else
  should write meanwhile), from a ``CHECKPOINT`` taken at the start so that every run pays the
  full-page images of the pages it touches first in the same way; ``statements_wal_bytes`` is the
  measured database's share, from ``pg_stat_statements``;
- ``pg_cpu_ms``: user + system CPU of the server's processes from ``/proc``: the postmaster's own
  and its reaped children's (``cutime``/``cstime``, so a backend that exits mid-run still counts),
  plus every live child's. Only when the server runs on this machine (the local stack does).
  ``db_backends_cpu_ms`` is the share of the backends connected to the measured database (those
  alive at the end), which other databases' work does not inflate;
- ``watcher_cpu_ms``: the CPU of the benchmark's own connection that polls for the end of the run
  (its backend, given to :meth:`CostProbe.finish`), taken out of ``pg_cpu_ms`` and
  ``db_backends_cpu_ms``: what the observer costs is not the measured system's work, and it grows
  with the run's length and table (a ``count(*)`` over ``runs`` every 50 ms was a quarter of our
  backends' CPU in a 10,000-job run, and a few per cent of the faster peer's);
- ``statements`` and per-statement figures from ``pg_stat_statements`` of the measured database
  (calls, execution time, rows, WAL bytes), when the server preloads it (``scheduler dev up``
  does when the library is there);
- ``transactions``: commits and rollbacks of the measured database (``pg_stat_database``). A
  backend reports these when it goes idle, up to about 10 s late, so :meth:`CostProbe.finish`
  waits ``settle_s`` for them, and then as long again to see how many the measured processes make
  while idle: that many a second over the wait (``settle_idle_transactions``) are not the run's;
- the benchmark's own work in the measured database is left out of the statements and the
  transactions (``observer_statements``, ``observer_transactions``): the probe's reads and the
  polling for the end of the run (a :class:`Watcher`), each of their statements one transaction
  on an autocommit connection and marked with :data:`OBSERVER`, so ``pg_stat_statements`` tells
  them apart;
- ``kafka_bytes``: bytes appended to the log segments of the run's topics (by topic-name prefix)
  in the local broker's data folder, when it is given.

Divided by the job count, these are what ``bench/README.md`` calls the cost per job.

:class:`ComponentCpu` does the same for the processes around the database: user + system CPU of
each pipeline component (by kind: ``scanner``, ``relay``, ``reconciler``, ``worker``, the workers
summed) and of the local broker, between two snapshots. With PostgreSQL's, that says where a run's
CPU went, which on a machine with few cores is what bounds both throughput and firing precision.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

if TYPE_CHECKING:
    from scheduler.devstack import LocalStack

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Long statements are cut for the tables; the query id tells them apart.
QUERY_TEXT_CHARS = 90
TOP_STATEMENTS = 12
# An idle backend reports its statistics (transactions, table counts) this long after its last work.
IDLE_REPORT_S = 10.0
# A backend reports at most once a second when it goes idle (PGSTAT_MIN_INTERVAL); after this long,
# its next statement that reads a table reports everything before it.
REPORT_INTERVAL_S = 1.05
# The comment on the benchmark's own statements in the measured database (pg_stat_statements keeps
# a trailing comment in a statement's text, and drops a leading one).
OBSERVER = "/* bench observer */"
# The per-job figures, in the order the tables show them.
SUMMARY = (
    "wal_bytes_per_job",
    "statements_wal_bytes_per_job",
    "statements_wal_fpi_per_job",
    "pg_cpu_ms_per_job",
    "db_backends_cpu_ms_per_job",
    "watcher_cpu_ms_per_job",
    "statements_per_job",
    "transactions_per_job",
    "observer_transactions_per_job",
    "kafka_bytes_per_job",
    "exec_ms_per_job",
)


@dataclass
class Snapshot:
    wal_lsn: str
    pg_cpu_s: float | None
    backend_cpu_s: dict[int, float]  # pid -> CPU of each backend connected to the measured database
    statements: dict[int, dict[str, Any]]
    transactions: int | None
    kafka_bytes: int | None
    # table -> (updates, HOT updates) so far; read late, like transactions (idle backends report late)
    updates: dict[str, tuple[int, int]] = field(default_factory=dict)
    # The CPU of the probe's own backend when pg_cpu_s was read
    probe_cpu_s: float | None = None
    # pg_stat_statements' evictions so far (pg_stat_statements_info.dealloc)
    statement_evictions: int | None = None
    at: float = field(default_factory=time.monotonic)


def observed(sql: str) -> str:
    """``sql`` marked as the benchmark's own, which the cost figures leave out."""
    return f"{sql} {OBSERVER}"


class Watcher:
    """The benchmark's polling for the end of a run, on a connection of the measured database of its
    own: autocommit, so that each poll is one statement and one transaction (no ``BEGIN`` and
    ``COMMIT`` around it), marked as the observer's. :meth:`CostProbe.finish` leaves its
    statements, its transactions and its backend's CPU out of the run's figures, as what watching
    costs is not the measured system's work (a ``count(*)`` every 50 ms, with its ``BEGIN`` and
    ``COMMIT``, was 42 % of our statements and 19 % of our transactions in a 3,000-job run)."""

    def __init__(self, url: str) -> None:
        self.conn: psycopg.Connection[dict[str, Any]] = psycopg.connect(
            url, autocommit=True, row_factory=dict_row
        )
        self.statements = 0

    @property
    def pid(self) -> int:
        return self.conn.info.backend_pid

    def fetchone(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """One row of ``sql``, marked as the observer's and counted."""
        self.statements += 1
        return self.conn.execute(observed(sql), params).fetchone()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def process_cpu_seconds(pid: int, *, with_children: bool) -> float:
    # /proc/<pid>/stat: the command may hold spaces and parentheses, so split after the last ")".
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    ticks = utime + stime + (cutime + cstime if with_children else 0)
    return ticks / CLOCK_TICKS


class ComponentCpu:
    """CPU seconds of named groups of processes (all their threads) since :meth:`start`, read from
    ``/proc`` at the start and at each reading only: a process that is gone at either moment is
    left out (a component that crashed mid-run shows as less CPU, and its log says why), and so is
    a pid first seen at the reading (another process that took a finished one's number)."""

    def __init__(self, groups: Mapping[str, Sequence[int]]) -> None:
        self.groups = {name: list(pids) for name, pids in groups.items() if pids}
        self._before: dict[int, float] = {}

    def _read(self) -> dict[int, float]:
        cpu: dict[int, float] = {}
        for pids in self.groups.values():
            for pid in pids:
                with contextlib.suppress(OSError, IndexError, ValueError):
                    cpu[pid] = process_cpu_seconds(pid, with_children=False)
        return cpu

    def start(self) -> None:
        self._before = self._read()

    def spent(self) -> dict[str, float]:
        """CPU seconds by group since :meth:`start`."""
        after, before = self._read(), self._before
        return {
            name: sum(after[p] - before[p] for p in pids if p in after and p in before)
            for name, pids in self.groups.items()
        }

    def finish(self, jobs: int) -> dict[str, float]:
        """Milliseconds of CPU per job by group, and ``all`` of them together."""
        per = max(jobs, 1)
        figures = {name: round(seconds * 1000 / per, 4) for name, seconds in self.spent().items()}
        figures["all"] = round(sum(figures.values()), 4)
        return figures


def local_kafka_pid() -> int | None:
    """The local stack's broker process, when this machine runs it."""
    return _local_stack().kafka.pid()


def component_groups(commands: list[list[str]], pids: list[int]) -> dict[str, list[int]]:
    """``running``'s processes grouped by component kind (the first word of each command), with
    the local broker as ``kafka``."""
    groups: dict[str, list[int]] = {}
    for command, pid in zip(commands, pids, strict=True):
        groups.setdefault(command[0], []).append(pid)
    kafka = local_kafka_pid()
    if kafka is not None:
        groups["kafka"] = [kafka]
    return groups


def show_component_cpu(cpu: dict[str, float], pg_ms_per_job: float | None) -> None:
    """One line: the CPU per job of each component, the broker, PostgreSQL, and their sum."""
    from bench.common import console

    parts = [f"{name} {ms}" for name, ms in cpu.items() if name != "all"]
    total = cpu.get("all", 0.0)
    if pg_ms_per_job is not None:
        parts.append(f"PostgreSQL {pg_ms_per_job}")
        total += pg_ms_per_job
    console().print(f"CPU ms per job: {', '.join(parts)}; all {round(total, 4)}")


def server_cpu_seconds(postmaster: int) -> float | None:
    """The server's CPU so far: the postmaster with its reaped children, plus its live children."""
    try:
        total = process_cpu_seconds(postmaster, with_children=True)
    except (OSError, IndexError, ValueError):
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                total += process_cpu_seconds(int(entry.name), with_children=False)
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile: the postmaster's cutime has it now
    return total


def kafka_log_bytes(data_dir: Path, topic_prefix: str) -> int:
    """Bytes in the ``*.log`` segments of the topics named ``<topic_prefix>...`` (the index files
    are preallocated, so their size says nothing)."""
    total = 0
    for partition in data_dir.glob(f"{topic_prefix}*"):
        for segment in partition.glob("*.log"):
            try:
                total += segment.stat().st_size
            except OSError:
                continue
    return total


class CostProbe:
    """Cost of what happens in the database of ``url`` between :meth:`start` and :meth:`finish`.

    The probe creates the ``pg_stat_statements`` extension there when the server preloads it; its
    own few statements count too, which is noise next to thousands of jobs."""

    def __init__(
        self,
        url: str,
        *,
        kafka_data: Path | None = None,
        topic_prefix: str | None = None,
    ) -> None:
        self.url = url
        self.database = ""
        self.kafka_data = kafka_data
        self.topic_prefix = topic_prefix
        self._before: Snapshot | None = None
        self._statements = True
        self._postmaster: int | None = None
        # The probe's own transactions in the measured database since the first snapshot's count
        # (each statement one, autocommit, and one for each connection's start).
        self._own = 0

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        self._own += 1
        return psycopg.connect(self.url, autocommit=True, row_factory=dict_row)

    def _run(
        self, conn: psycopg.Connection[dict[str, Any]], sql: str, params: Sequence[Any] | None = None
    ) -> psycopg.Cursor[dict[str, Any]]:
        """One of the probe's statements, marked as the observer's and counted."""
        self._own += 1
        return conn.execute(observed(sql), params)

    def _transactions(self, conn: psycopg.Connection[dict[str, Any]]) -> int | None:
        xact = self._run(
            conn,
            "select xact_commit + xact_rollback as n from pg_stat_database where datname = %s",
            (self.database,),
        ).fetchone()
        return None if xact is None else int(xact["n"])

    def _snapshot(self, conn: psycopg.Connection[dict[str, Any]]) -> Snapshot:
        row = self._run(conn, "select pg_current_wal_lsn()::text as lsn").fetchone()
        assert row is not None
        statements: dict[int, dict[str, Any]] = {}
        evictions = None
        if self._statements:
            # When the server's pg_stat_statements is full (pg_stat_statements.max, 5,000 by
            # default, which a server of many test databases reaches), it drops its least used
            # entries: a run's statements among them would go uncounted.
            info = self._run(conn, "select dealloc from pg_stat_statements_info").fetchone()
            evictions = None if info is None else int(info["dealloc"])
            for stat in self._run(
                conn,
                "select queryid, calls, total_exec_time, rows, wal_bytes, wal_fpi, query "
                "  from pg_stat_statements s join pg_database d on d.oid = s.dbid "
                " where d.datname = %s and s.toplevel",
                (self.database,),
            ):
                statements[stat["queryid"]] = stat
        transactions = self._transactions(conn)
        kafka = None
        if self.kafka_data is not None and self.topic_prefix:
            kafka = kafka_log_bytes(self.kafka_data, self.topic_prefix)
        updates, backends = self._updates(conn), self._backend_cpu(conn)
        # The server's CPU last, after the probe's reads, with what this connection's backend has
        # used so far: the probe's, not the run's.
        server = None if self._postmaster is None else server_cpu_seconds(self._postmaster)
        probe = None
        if server is not None:
            with contextlib.suppress(OSError, IndexError, ValueError):
                probe = process_cpu_seconds(conn.info.backend_pid, with_children=False)
        return Snapshot(
            updates=updates,
            wal_lsn=row["lsn"],
            pg_cpu_s=server,
            backend_cpu_s=backends,
            statements=statements,
            transactions=transactions,
            kafka_bytes=kafka,
            probe_cpu_s=probe,
            statement_evictions=evictions,
        )

    def _updates(self, conn: psycopg.Connection[dict[str, Any]]) -> dict[str, tuple[int, int]]:
        return {
            row["relname"]: (int(row["n_tup_upd"]), int(row["n_tup_hot_upd"]))
            for row in self._run(
                conn,
                "select relname, n_tup_upd, n_tup_hot_upd from pg_stat_user_tables "
                " where schemaname = any(current_schemas(false))",
            )
        }

    def _backend_cpu(self, conn: psycopg.Connection[dict[str, Any]]) -> dict[int, float]:
        if self._postmaster is None:
            return {}
        cpu: dict[int, float] = {}
        for row in self._run(
            conn,
            "select pid from pg_stat_activity where datname = %s and pid <> pg_backend_pid()",
            (self.database,),
        ):
            with contextlib.suppress(OSError, IndexError, ValueError):
                cpu[row["pid"]] = process_cpu_seconds(row["pid"], with_children=False)
        return cpu

    def start(self) -> None:
        with self._connect() as conn:
            name = self._run(conn, "select current_database() as name").fetchone()
            self.database = "" if name is None else str(name["name"])
            try:
                self._run(conn, "create extension if not exists pg_stat_statements")
                self._run(conn, "select 1 from pg_stat_statements limit 1")
            except psycopg.Error:
                self._statements = False  # not preloaded: statements are not counted
            self._postmaster = local_postmaster(conn, self._run)
            # Every run starts right after a checkpoint, so each pays the full-page images of the
            # pages it first touches alike, instead of by where the last one happened to fall.
            # Without the right to (not a superuser, no pg_checkpoint) the figures carry that noise.
            with contextlib.suppress(psycopg.Error):
                self._run(conn, "checkpoint")
            # A second on, a statement that reads a table has this backend report all it did
            # above (a backend reports at most once a second, and only once it has read or
            # written a table), so that the probe's own transactions are counted from here.
            # (A catalog no component reads: the figures would take theirs for the probe's.)
            time.sleep(REPORT_INTERVAL_S)
            self._run(conn, "select count(*) from pg_am")
            self._own = 0
            self._before = self._snapshot(conn)

    def finish(
        self, jobs: int, settle_s: float = 11.0, *, watcher: Watcher | int | None = None
    ) -> dict[str, Any]:
        """The figures since :meth:`start`, in all and per job. CPU, WAL and statements are read at
        once; the transaction count after ``settle_s`` more (an idle backend reports it late), and
        after as long again, to take out what the processes did meanwhile at their idle rate.
        ``watcher`` is what polled for the end (a :class:`Watcher`, or the backend pid of a
        connection): its CPU is reported apart and not counted as the run's, nor are a
        :class:`Watcher`'s statements and transactions."""
        before = self._before
        if before is None:
            raise RuntimeError("CostProbe.finish without start")
        watcher_pid = watcher.pid if isinstance(watcher, Watcher) else watcher
        watcher_statements = watcher.statements if isinstance(watcher, Watcher) else 0
        settle_idle: float | None = None
        with self._connect() as conn:
            after = self._snapshot(conn)
            wal = self._run(
                conn,
                "select pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint as n",
                (after.wal_lsn, before.wal_lsn),
            ).fetchone()
            if settle_s > 0:
                time.sleep(settle_s)
                own, settled_at = self._own, time.monotonic()
                after.transactions = self._transactions(conn)
                after.updates = self._updates(conn)
                # The processes' idle rate: what is reported over another wait as long, every report
                # of the run's work being in by now; less the probe's two reads just above.
                time.sleep(settle_s)
                own_since = self._own - own
                idle = self._transactions(conn)
                if after.transactions is not None and idle is not None:
                    rate = max(0, idle - after.transactions - own_since) / (time.monotonic() - settled_at)
                    settle_idle = rate * (settled_at - after.at)
            else:
                own = self._own
        per = max(jobs, 1)
        figures: dict[str, Any] = {"jobs": jobs, "seconds": round(after.at - before.at, 2)}
        wal_bytes = int(wal["n"]) if wal is not None else 0
        figures["wal_bytes"] = wal_bytes
        figures["wal_bytes_per_job"] = round(wal_bytes / per, 1)
        watcher_ms = 0.0
        if watcher_pid is not None and watcher_pid in after.backend_cpu_s:
            watcher_ms = (
                after.backend_cpu_s[watcher_pid] - before.backend_cpu_s.get(watcher_pid, 0.0)
            ) * 1000
            figures["watcher_cpu_ms"] = round(watcher_ms, 1)
            figures["watcher_cpu_ms_per_job"] = round(watcher_ms / per, 4)
        elif watcher_pid is not None:
            # Not readable (a server elsewhere, a backend gone): counted in the totals, and said so.
            figures["watcher_cpu_ms"] = None
        if before.pg_cpu_s is not None and after.pg_cpu_s is not None:
            # The end's reads are made on a connection of the probe's started after the run: all
            # its backend's CPU (its start, a read of every pg_stat_statements entry of the server:
            # 10 to 20 ms on a server of 5,000 of them) is the probe's.
            probe_ms = (after.probe_cpu_s or 0.0) * 1000
            figures["probe_cpu_ms"] = round(probe_ms, 1)
            cpu_ms = (after.pg_cpu_s - before.pg_cpu_s) * 1000 - watcher_ms - probe_ms
            figures["pg_cpu_ms"] = round(cpu_ms, 1)
            figures["pg_cpu_ms_per_job"] = round(cpu_ms / per, 4)
        if after.backend_cpu_s:
            # Only this database's backends, so other databases' work on the server does not
            # count; a backend that ended before the second snapshot is missed (ours keep theirs).
            own_ms = (
                sum(cpu - before.backend_cpu_s.get(pid, 0.0) for pid, cpu in after.backend_cpu_s.items())
                * 1000
                - watcher_ms
            )
            figures["db_backends_cpu_ms_per_job"] = round(own_ms / per, 4)
        if before.transactions is not None and after.transactions is not None:
            # The probe's and the watcher's, one each of their statements and connections.
            observer = own + watcher_statements
            idle_share = round(settle_idle or 0.0)
            figures["transactions"] = max(0, after.transactions - before.transactions - observer - idle_share)
            figures["transactions_per_job"] = round(figures["transactions"] / per, 4)
            figures["observer_transactions"] = observer
            figures["observer_transactions_per_job"] = round(observer / per, 4)
            if settle_idle is not None:
                figures["settle_idle_transactions"] = idle_share
        if before.kafka_bytes is not None and after.kafka_bytes is not None:
            figures["kafka_bytes"] = after.kafka_bytes - before.kafka_bytes
            figures["kafka_bytes_per_job"] = round(figures["kafka_bytes"] / per, 1)
        # An update that changes no indexed column and finds room on its page is HOT: its new
        # version alone, no index entry. The share says how far the tables' layout allows it.
        hot, updated = {}, {}
        # Only after a full settle: an idle backend reports its table counts up to 10 s late.
        counts = after.updates if settle_s >= IDLE_REPORT_S else {}
        for table, (updates, hot_updates) in counts.items():
            old_updates, old_hot = before.updates.get(table, (0, 0))
            if updates > old_updates:
                hot[table] = round((hot_updates - old_hot) / (updates - old_updates), 3)
                updated[table] = round((updates - old_updates) / per, 3)
        if hot:
            figures["hot_update_share"] = hot
            figures["updates_per_job"] = updated
        if self._statements:
            figures |= _statement_figures(before.statements, after.statements, per)
            if before.statement_evictions is not None and after.statement_evictions is not None:
                # Not 0: entries were dropped meanwhile, and the statements may be undercounted.
                figures["statement_evictions"] = after.statement_evictions - before.statement_evictions
        return figures


def _statement_figures(
    before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]], per: int
) -> dict[str, Any]:
    rows = []
    observer_calls = 0
    for queryid, stat in after.items():
        old = before.get(queryid, {})
        calls = stat["calls"] - old.get("calls", 0)
        if calls <= 0:
            continue
        if OBSERVER in str(stat["query"]):
            observer_calls += calls  # the benchmark's own: the probe's reads, the watcher's polls
            continue
        rows.append(
            {
                "query": " ".join(str(stat["query"]).split())[:QUERY_TEXT_CHARS],
                "calls_per_job": round(calls / per, 4),
                "exec_ms_per_job": round(
                    (stat["total_exec_time"] - old.get("total_exec_time", 0.0)) / per, 4
                ),
                "rows_per_job": round((stat["rows"] - old.get("rows", 0)) / per, 3),
                "wal_bytes_per_job": round(float(stat["wal_bytes"] - old.get("wal_bytes", 0)) / per, 1),
                # Full-page images: the first change of a page after a checkpoint writes all of it.
                "wal_fpi_per_job": round((stat["wal_fpi"] - old.get("wal_fpi", 0)) / per, 3),
            }
        )
    rows.sort(key=lambda r: r["exec_ms_per_job"], reverse=True)
    calls_per_job = sum(r["calls_per_job"] for r in rows)
    return {
        "statements_wal_bytes_per_job": round(sum(r["wal_bytes_per_job"] for r in rows), 1),
        "statements_wal_fpi_per_job": round(sum(r["wal_fpi_per_job"] for r in rows), 3),
        "statements_per_job": round(calls_per_job, 3),
        "observer_statements": observer_calls,
        "exec_ms_per_job": round(sum(r["exec_ms_per_job"] for r in rows), 4),
        "top_statements": rows[:TOP_STATEMENTS],
    }


def local_postmaster(
    conn: psycopg.Connection[dict[str, Any]],
    run: Callable[[psycopg.Connection[dict[str, Any]], str], psycopg.Cursor[dict[str, Any]]] | None = None,
) -> int | None:
    """The postmaster's pid when the server runs on this machine: the parent of this connection's
    backend (a server elsewhere has no such process here). ``run`` runs the statement (the probe's
    marks and counts it)."""
    sql = "select pg_backend_pid() as pid"
    row = (run(conn, sql) if run else conn.execute(sql)).fetchone()
    if row is None:
        return None
    try:
        stat = Path(f"/proc/{row['pid']}/stat").read_text()
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        cmdline = Path(f"/proc/{parent}/cmdline").read_bytes()
    except (OSError, IndexError, ValueError):
        return None
    return parent if b"postgres" in cmdline else None


def local_kafka_data() -> Path | None:
    """The local stack's broker data folder, when this machine runs it."""
    data: Path = _local_stack().kafka.data
    return data if data.exists() else None


def _local_stack() -> LocalStack:
    from scheduler.config import load_settings
    from scheduler.devstack import LocalStack

    return LocalStack(load_settings())


def show_cost(title: str, cost: dict[str, Any], unit: str = "job") -> None:
    """The per-job figures (per ``unit``: what the run's count counted) and the top statements as
    two tables."""
    from rich.table import Table

    from bench.common import console

    out = console()
    summary = Table(title=f"{title}: cost per {unit}")
    for key in SUMMARY:
        summary.add_column(key.removesuffix("_per_job"))
    summary.add_row(*(str(cost.get(key, "-")) for key in SUMMARY))
    out.print(summary)
    if cost.get("statement_evictions"):
        out.print(
            f"[bold red]pg_stat_statements dropped entries {cost['statement_evictions']} times in the run[/] "
            "(it was full): the statements may be undercounted; its pg_stat_statements.max is too small "
            "for this server"
        )
    if cost.get("hot_update_share"):
        updated = cost.get("updates_per_job", {})
        shares = ", ".join(
            f"{table} {share:.0%} of {updated.get(table, '?')} per job"
            for table, share in sorted(cost["hot_update_share"].items())
        )
        out.print(f"HOT updates: {shares}")
    if cost.get("top_statements"):
        top = Table(
            "calls", "exec ms", "rows", "WAL B", "FPI", "statement", title=f"per {unit}, by execution time"
        )
        for row in cost["top_statements"]:
            top.add_row(
                str(row["calls_per_job"]),
                str(row["exec_ms_per_job"]),
                str(row["rows_per_job"]),
                str(row["wal_bytes_per_job"]),
                str(row["wal_fpi_per_job"]),
                row["query"],
            )
        out.print(top)
