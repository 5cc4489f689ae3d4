"""The chaos run's report: what PostgreSQL, the handlers' own records, Kafka and the logs say
happened, set against what the schedules asked for.

The figures (``bench/README.md`` explains each):

- ``expected_runs``: one per one-shot schedule and per Avro command, and for each cron schedule
  the fires between its first fire and its end bound, counted by the scheduler's own cron code.
- ``lost``: expected fires that have no run, plus runs not terminal at the end bound whose
  current attempt no worker ever started; ``stuck``: every run not terminal at the end bound.
- ``poison``/``transient``: dead after exactly one attempt and on ``.dlq`` / succeeded on
  attempt 2.
- ``duplicates``: executions of a (run, attempt) after its first, each with its cause: the
  earlier execution was in flight on a worker killed or stopped at that moment, had finished on a
  worker killed before it could commit, fell in the broker's outage, or nothing explains it.
- ``unrecorded_double_effects``: executions whose (run, attempt, worker) has no row at all in
  ``attempts`` and is not the run's own (its row holds its current attempt's applied start and
  success): effects the database does not know happened.
- ``stack_traces``: every one in the components' logs, injected (a connection failure during a
  fault) or not.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench.chaos_faults import Fault, Supervised
from bench.chaos_kafka import dead_letter_runs, job_messages

UNFINISHED = ("pending", "dispatched", "running", "retry_wait")
# Duplicates the design allows: the earlier execution was in flight where a worker died or stopped.
EXPLAINED = (
    "in flight on a killed worker",
    "outcome not yet committed on a killed worker",
    "in flight on a stopped worker",
    "published twice by the relay",
)
RELAY_CAUSE = EXPLAINED[-1]
# What each kind of job should end as: its state and the attempt it ends on.
EXPECTED = {
    "ok": ("succeeded", 1),
    "big_payload": ("succeeded", 1),
    "big_result": ("succeeded", 1),
    "nul_result": ("succeeded", 1),
    "transient": ("succeeded", 2),
    "poison": ("dead", 1),
    "nul_error": ("dead", 1),
}
# A job that finished this shortly before its worker died may not have had its outcome
# acknowledged and its offset committed (the worker commits every 0.2 s once Kafka acknowledged).
ACK_SLACK_S = 2.0
# How long after the broker is back its outage may still explain a re-delivery (rejoins, retried
# commits).
COMMIT_SLACK_S = 30.0
# A fault's trace may be logged a while after the fault: the reconnect backoff is up to 5 s, and
# a consumer notices a lost coordinator or member only at its next heartbeat or commit.
TRACE_GRACE_S = 60.0
_CONNECTIVITY = re.compile(
    r"OperationalError|ConnectionFailure|AdminShutdown|CannotConnectNow|ConnectionRefused|"
    r"ConnectionReset|BrokenPipe|server closed the connection|terminating connection|"
    r"connection (?:refused|failed|is lost|reset)|could not connect|the database system is|"
    r"KafkaUnavailable|TransportError|ConsumerError|DeliveryError|_TRANSPORT|_ALL_BROKERS_DOWN|"
    r"BrokerTransportFailure|_MSG_TIMED_OUT|_TIMED_OUT|timed out|UNKNOWN_MEMBER_ID|"
    r"ILLEGAL_GENERATION|REBALANCE_IN_PROGRESS|FENCED|COORDINATOR",
    re.IGNORECASE,
)


@dataclass
class Execution:
    run: str
    attempt: int
    pid: int
    worker: str
    kind: str
    start: float
    end: float | None = None
    outcome: str | None = None


def load_executions(folder: Path) -> list[Execution]:
    """Every execution the handlers recorded, each start paired with its end (if it had one)."""
    starts: dict[tuple[str, int, int], list[Execution]] = defaultdict(list)
    ends: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("executions-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by kill -9 (one write each, so this should not happen)
            key = (str(record["run"]), int(record["attempt"]), int(record["pid"]))
            if record["e"] == "start":
                starts[key].append(
                    Execution(key[0], key[1], key[2], str(record["worker"]), str(record["kind"]), record["t"])
                )
            else:
                ends[key].append(record)
    executions: list[Execution] = []
    for key, started in starts.items():
        pending = sorted(ends.get(key, []), key=lambda r: float(r["t"]))
        for execution in sorted(started, key=lambda e: e.start):
            while pending and float(pending[0]["t"]) < execution.start:
                pending.pop(0)
            if pending:
                end = pending.pop(0)
                execution.end, execution.outcome = float(end["t"]), str(end["outcome"])
            executions.append(execution)
    return sorted(executions, key=lambda e: e.start)


@dataclass
class Inputs:
    options: dict[str, Any]
    url: str
    bootstrap: str
    prefix: str
    app: str
    start_db: datetime
    t0: float
    timings: dict[str, Any]
    faults: list[Fault]
    killed: dict[int, float]  # pid -> when kill -9 hit it
    graceful: set[int]  # worker pids stopped with SIGTERM after the drain
    cron_expected: dict[str, int]  # cron schedule name -> runs it should produce
    cron_kinds: dict[str, str]  # cron schedule name -> kind of job
    one_shots: dict[uuid.UUID, str]  # schedule id -> kind of job
    commands: dict[str, str]  # schedule key -> kind of job
    command_sends: int
    supervisor: Supervised
    executions_dir: Path
    lag_after_drain: dict[int, int]
    outcome_lag: dict[str, int]  # the reconciler's group, per outcome topic
    restart: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


def _examples(items: Iterable[Any], limit: int = 10) -> list[Any]:
    return list(items)[:limit]


def build(inputs: Inputs) -> dict[str, Any]:
    with psycopg.connect(inputs.url, row_factory=dict_row, autocommit=True) as conn:
        runs = conn.execute(
            "select r.id::text as id, r.schedule_id::text as schedule_id, r.state, r.attempt, r.worker, "
            "       left(r.error, 300) as error, s.kind as schedule_kind, s.name, "
            "       s.payload->>'kind' as job_kind "
            "  from runs r join schedules s on s.id = r.schedule_id where r.app = %s",
            (inputs.app,),
        ).fetchall()
        attempts = conn.execute(
            "select run_id::text as run_id, attempt, kind, outcome, worker, error_class from attempts"
        ).fetchall()
        keys = {
            row["schedule_key"]: str(row["schedule_id"])
            for row in conn.execute("select schedule_key, schedule_id from schedule_keys").fetchall()
        }
        schedules = {
            str(row["id"]): row
            for row in conn.execute("select id, name, kind, state, error from schedules").fetchall()
        }
        quarantine = conn.execute(
            "select component, left(reason, 160) as reason, count(*) as n from quarantine group by 1, 2 "
            "order by 3 desc"
        ).fetchall()
    executions = load_executions(inputs.executions_dir)
    try:
        dlq = dead_letter_runs(inputs.bootstrap, f"{inputs.prefix}.dlq")
        dlq_error = None
    except Exception as exc:  # reported, not fatal: the rest of the report still holds
        dlq, dlq_error = {"worker": set(), "sweeper": set(), "undecodable": set()}, str(exc)
    dlq_runs = {str(r) for r in dlq["worker"] | dlq["sweeper"]}
    try:
        published = job_messages(inputs.bootstrap, f"{inputs.prefix}.jobs.{inputs.app}")
    except Exception as exc:
        published, dlq_error = Counter(), f"{dlq_error or ''} reading the job topic: {exc}".strip()

    runs_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        runs_of[run["schedule_id"]].append(run)
    by_name = {row["name"]: sid for sid, row in schedules.items()}

    # --- expected fires, and the ones with no run ---------------------------------------------
    missing: list[dict[str, Any]] = []
    expected_by_kind: Counter[str] = Counter()
    for one_shot, kind in inputs.one_shots.items():
        expected_by_kind[kind] += 1
        if not runs_of.get(str(one_shot)):
            missing.append({"schedule": str(one_shot), "expected": 1, "created": 0})
    for key, kind in inputs.commands.items():
        expected_by_kind[kind] += 1
        command_schedule = keys.get(key)
        if command_schedule is None or not runs_of.get(command_schedule):
            missing.append({"command": key, "expected": 1, "created": 0, "schedule": command_schedule})
    extra_fires = []
    for name, want in inputs.cron_expected.items():
        sid = by_name.get(name, "")
        created = len(runs_of.get(sid, []))
        expected_by_kind[inputs.cron_kinds[name]] += want
        if created < want:
            missing.append({"schedule": sid, "name": name, "expected": want, "created": created})
        elif created > want:
            extra_fires.append({"schedule": sid, "name": name, "expected": want, "created": created})
    expected_runs = sum(expected_by_kind.values())

    # --- executions by run and attempt ----------------------------------------------------------
    by_attempt: dict[tuple[str, int], list[Execution]] = defaultdict(list)
    by_run: dict[str, list[Execution]] = defaultdict(list)
    for execution in executions:
        by_attempt[(execution.run, execution.attempt)].append(execution)
        by_run[execution.run].append(execution)

    # --- outcomes per kind of job ----------------------------------------------------------------
    outcomes: dict[str, dict[str, Any]] = {}
    stuck = [r for r in runs if r["state"] in UNFINISHED]
    never_started = [r for r in stuck if not by_attempt.get((r["id"], r["attempt"]))]
    for kind, (state, attempt) in EXPECTED.items():
        of_kind = [r for r in runs if r["job_kind"] == kind]
        if not of_kind and not expected_by_kind.get(kind):
            continue
        wrong = [r for r in of_kind if not (r["state"] == state and r["attempt"] == attempt)]
        entry: dict[str, Any] = {
            "expected": expected_by_kind.get(kind, 0),
            "runs": len(of_kind),
            "states": dict(Counter(r["state"] for r in of_kind)),
            "attempts": dict(sorted(Counter(r["attempt"] for r in of_kind).items())),
            "as_expected": len(of_kind) - len(wrong),
            "expect": f"{state} on attempt {attempt}",
            "violations": _examples({k: r[k] for k in ("id", "state", "attempt", "error")} for r in wrong),
        }
        if state == "dead":
            entry["on_dlq"] = sum(1 for r in of_kind if r["id"] in dlq_runs)
            entry["dead_not_on_dlq"] = _examples(
                r["id"] for r in of_kind if r["state"] == "dead" and r["id"] not in dlq_runs
            )
        outcomes[kind] = entry
    poison = [r for r in runs if r["job_kind"] == "poison"]
    poison_ok = [r for r in poison if r["state"] == "dead" and r["attempt"] == 1 and r["id"] in dlq_runs]
    transient = [r for r in runs if r["job_kind"] == "transient"]
    transient_ok = [r for r in transient if r["state"] == "succeeded" and r["attempt"] == 2]

    # --- duplicates and their causes -------------------------------------------------------------
    stops = [
        (f.pid, f.fired_at, f.restored_at or f.fired_at + f.hold_s)
        for f in inputs.faults
        if f.kind == "stop_worker" and f.pid is not None and f.fired_at is not None
    ]
    broker = [
        (f.fired_at, f.restored_at or f.fired_at + f.hold_s)
        for f in inputs.faults
        if f.kind == "kill_kafka" and f.fired_at is not None
    ]

    def outcome_pending(execution: Execution, at: float) -> bool:
        """At ``at``, ``execution`` was running, or had finished so recently (or while the broker was
        down) that its outcome may not have been acknowledged and its offset committed."""
        if execution.start > at:
            return False
        if execution.end is None or execution.end >= at - ACK_SLACK_S:
            return True
        return any(began <= execution.end and at <= ended for began, ended in broker)

    def cause(previous: Execution) -> str:
        # A stopped worker first: one that was stopped and later killed lost its jobs to the stop.
        if any(
            pid == previous.pid and previous.start <= ended and (previous.end or ended) >= began - ACK_SLACK_S
            for pid, began, ended in stops
        ):
            return "in flight on a stopped worker"
        killed_at = inputs.killed.get(previous.pid)
        if killed_at is not None and killed_at >= previous.start:
            if previous.end is None or previous.end >= killed_at:
                return "in flight on a killed worker"
            if outcome_pending(previous, killed_at):
                return "outcome not yet committed on a killed worker"
            if published[(previous.run, previous.attempt)] < 2:
                return "finished long before its worker was killed (commit lag)"
        if published[(previous.run, previous.attempt)] > 1:
            return "published twice by the relay"
        for began, ended in broker:
            finished = previous.end if previous.end is not None else previous.start
            if began - 5 <= finished <= ended + COMMIT_SLACK_S:
                return "around the broker outage, on a worker not killed"
        if previous.end is None:
            return "unfinished on a worker that was not killed"
        return "no fault explains it (rebalance, commit lag, sweep)"

    duplicates: list[dict[str, Any]] = []
    for (run_id, attempt), group in by_attempt.items():
        group.sort(key=lambda e: e.start)
        for previous, again in itertools.pairwise(group):
            duplicates.append(
                {
                    "run": run_id,
                    "attempt": attempt,
                    "cause": cause(previous),
                    "first_worker": previous.worker,
                    "again_worker": again.worker,
                    "first_start_s": round(previous.start - inputs.t0, 2),
                    "again_start_s": round(again.start - inputs.t0, 2),
                }
            )
    causes = Counter(d["cause"] for d in duplicates)
    in_flight_on_faulted = sum(
        1
        for e in executions
        if (e.pid in inputs.killed and outcome_pending(e, inputs.killed[e.pid]))
        or any(
            e.pid == pid and e.start <= ended and (e.end is None or e.end >= began - ACK_SLACK_S)
            for pid, began, ended in stops
        )
    )
    planned_attempts = {kind: attempt for kind, (_, attempt) in EXPECTED.items()}
    extra_attempts = [
        r
        for r in runs
        if r["job_kind"] in planned_attempts and r["attempt"] > planned_attempts[r["job_kind"]]
    ]

    # --- executions attempts never heard of ---------------------------------------------------
    recorded: dict[tuple[str, int], set[str]] = defaultdict(set)
    succeeded_by: dict[tuple[str, int], set[str]] = defaultdict(set)
    for row in attempts:
        if row["worker"]:
            recorded[(row["run_id"], row["attempt"])].add(row["worker"])
            if row["kind"] == "succeeded":
                succeeded_by[(row["run_id"], row["attempt"])].add(row["worker"])
    # A run's row holds its current attempt's applied start and success instead of `attempts` rows
    # (a run waiting for its next attempt still names the worker of the one before).
    for run in runs:
        if run["worker"] and run["state"] not in ("pending", "dispatched"):
            recorded[(run["id"], run["attempt"])].add(run["worker"])
            if run["state"] == "succeeded":
                succeeded_by[(run["id"], run["attempt"])].add(run["worker"])

    def known(execution: Execution, workers: set[str]) -> bool:
        return execution.worker in workers or any(w.endswith(f"-{execution.pid}") for w in workers)

    unrecorded = [e for e in executions if not known(e, recorded.get((e.run, e.attempt), set()))]
    unrecorded_successes = [
        e
        for e in executions
        if e.outcome == "succeeded" and not known(e, succeeded_by.get((e.run, e.attempt), set()))
    ]

    def described(execution: Execution) -> dict[str, Any]:
        killed_at = inputs.killed.get(execution.pid)
        return {
            "run": execution.run,
            "attempt": execution.attempt,
            "worker": execution.worker,
            "start_s": round(execution.start - inputs.t0, 2),
            "end_s": None if execution.end is None else round(execution.end - inputs.t0, 2),
            "outcome": execution.outcome,
            "worker_killed_s": None if killed_at is None else round(killed_at - inputs.t0, 2),
        }

    # --- the sweeper ---------------------------------------------------------------------------
    sweeps = [r for r in attempts if r["worker"] == "sweeper" or r["error_class"] == "LeaseExpired"]
    swept_succeeded = [
        r
        for r in sweeps
        if any(e.outcome == "succeeded" for e in by_attempt.get((r["run_id"], r["attempt"]), []))
    ]
    swept_unstarted = [r for r in sweeps if not by_attempt.get((r["run_id"], r["attempt"]))]
    dead_unexecuted = [r for r in runs if r["state"] == "dead" and not by_run.get(r["id"])]

    # --- components: restarts, deaths nobody caused, stack traces ------------------------------
    sup = inputs.supervisor
    restarts: dict[str, dict[str, int]] = defaultdict(lambda: {"died": 0, "injected": 0, "unexpected": 0})
    unexpected_deaths = []
    for death in sup.deaths:
        component = "worker" if death.name.startswith("worker") else death.name
        restarts[component]["died"] += 1
        if death.pid in inputs.killed or death.pid in inputs.graceful:
            restarts[component]["injected"] += 1
        else:
            restarts[component]["unexpected"] += 1
            unexpected_deaths.append(
                {
                    "name": death.name,
                    "pid": death.pid,
                    "how": death.how,
                    "at_s": round(death.at - inputs.t0, 1),
                }
            )
    traces = scan_traces([sup.err_path, sup.out_path], inputs.faults, inputs.t0)
    errors = error_lines(sup.err_path)

    # --- the drain, the group, the restart ------------------------------------------------------
    timings = inputs.timings
    drained_at = timings.get("drained_at")
    last_fault_end = float(timings["last_fault_end"])
    lag = inputs.lag_after_drain
    lag_stop = inputs.restart.get("lag_after_graceful_stop", {})
    errored = [row for row in schedules.values() if row["state"] == "error"]
    lost = len(missing) + len(never_started)

    figures: dict[str, Any] = {
        "expected_runs": expected_runs,
        "expected_by_kind": dict(expected_by_kind),
        "created_runs": len(runs),
        "missing_fires": sum(m["expected"] - m["created"] for m in missing),
        "extra_fires": extra_fires,
        "lost": lost,
        "stuck": len(stuck),
        "stuck_by_state": dict(Counter(r["state"] for r in stuck)),
        "poison": {
            "runs": len(poison),
            "dead_after_one_attempt_on_dlq": len(poison_ok),
            "on_dlq": sum(1 for r in poison if r["id"] in dlq_runs),
        },
        "transient": {"runs": len(transient), "succeeded_on_attempt_2": len(transient_ok)},
        "outcomes": outcomes,
        "executions": {
            "total": len(executions),
            "runs_executed": len(by_run),
            "unfinished": sum(1 for e in executions if e.end is None),
        },
        "duplicates": len(duplicates),
        "duplicate_causes": dict(causes.most_common()),
        "duplicates_unexplained": sum(n for c, n in causes.items() if c not in EXPLAINED),
        "in_flight_on_killed_or_stopped_workers": in_flight_on_faulted,
        "jobs_published_more_than_once": sum(1 for n in published.values() if n > 1),
        "runs_with_extra_attempts": len(extra_attempts),
        "unrecorded_double_effects": len(unrecorded),
        "unrecorded_successes": len(unrecorded_successes),
        "attempt_events": {
            f"{kind}/{outcome}": n
            for (kind, outcome), n in sorted(Counter((r["kind"], r["outcome"]) for r in attempts).items())
        },
        "sweeps": {
            "expired": len(sweeps),
            "of_attempts_that_had_succeeded": len(swept_succeeded),
            "of_attempts_never_started": len(swept_unstarted),
        },
        "dead_without_execution": len(dead_unexecuted),
        "drained": drained_at is not None,
        "drain_s": None if drained_at is None else round(max(0.0, drained_at - last_fault_end), 1),
        "restarts": dict(sorted(restarts.items())),
        "unexpected_deaths": unexpected_deaths,
        "stack_traces": traces,
        "error_lines": errors,
        "consumer_lag_after_drain": _lag(lag),
        "consumer_lag_after_graceful_stop": _lag(lag_stop),
        "reconciler_lag_after_drain": inputs.outcome_lag,
        "executions_after_restart": inputs.restart.get("executions"),
        "attempt_events_after_restart": inputs.restart.get("attempt_events"),
        "quarantine": [dict(r) for r in quarantine],
        "schedules_in_error": len(errored),
        "dlq": {k: len(v) for k, v in dlq.items()} | ({"error": dlq_error} if dlq_error else {}),
        "commands": {"planned": len(inputs.commands), "sends": inputs.command_sends, "applied": len(keys)},
    }
    lagging = figures["consumer_lag_after_drain"]
    checks = {
        "nothing lost": lost == 0,
        "nothing stuck after the bound": not stuck,
        "poison dead after one attempt, on the DLQ": len(poison_ok) == len(poison) > 0,
        "transient succeeded on attempt 2": len(transient_ok) == len(transient),
        "no unrecorded double effects": not unrecorded,
        "no stack trace but the injected faults'": traces["not_injected"] == 0,
        "drained by the bound": drained_at is not None,
        "no consumer lag after the drain": lagging["known"] and lagging["total"] == 0,
        "nothing executed after restarting every worker": inputs.restart.get("executions") == 0,
        "duplicates within the jobs in flight on killed or stopped workers (and the relay's republished)": (
            len(duplicates) - causes[RELAY_CAUSE] <= in_flight_on_faulted
        ),
    }
    return {
        "config": inputs.options
        | {
            "commit": _commit(),
            "started": datetime.fromtimestamp(inputs.t0, UTC).isoformat(timespec="seconds"),
        },
        "faults": [f.as_dict(inputs.t0) for f in inputs.faults],
        "figures": figures,
        "verdict": {"checks": checks, "passed": all(checks.values())},
        "evidence": {
            "missing": _examples(missing, 20),
            "stuck": _examples(
                {k: r[k] for k in ("id", "state", "attempt", "job_kind", "name")} for r in stuck
            ),
            "never_started": _examples(r["id"] for r in never_started),
            "unrecorded": _examples(described(e) for e in unrecorded),
            "unrecorded_successes": _examples(described(e) for e in unrecorded_successes),
            "duplicates_unexplained": _examples(
                d
                for d in duplicates
                if d["cause"].startswith("no fault") or d["cause"].startswith("unfinished")
            ),
            "extra_attempts": _examples(
                {k: r[k] for k in ("id", "state", "attempt", "job_kind", "error")} for r in extra_attempts
            ),
            "swept_after_success": _examples(
                {"run": r["run_id"], "attempt": r["attempt"]} for r in swept_succeeded
            ),
            "dead_without_execution": _examples(
                {k: r[k] for k in ("id", "attempt", "job_kind", "error")} for r in dead_unexecuted
            ),
            "schedules_in_error": _examples({"id": str(r["id"]), "error": r["error"]} for r in errored),
            "restart_executed_runs": inputs.restart.get("executed_runs", []),
        },
        "timings": {
            "drain_from_last_fault_s": figures["drain_s"],
            "faults_over_s": round(last_fault_end - inputs.t0, 1),
            "supervisor_exit": timings.get("supervisor_exit"),
            "restart": {
                k: v for k, v in inputs.restart.items() if k not in ("pids", "lag_after_graceful_stop")
            },
        },
    }


def _lag(lag: dict[int, int]) -> dict[str, Any]:
    lagging = {str(p): n for p, n in sorted(lag.items()) if n}
    return {
        "known": bool(lag),
        "total": sum(lag.values()),
        "partitions_lagging": len(lagging),
        "per_partition": lagging,
    }


def _commit() -> str:
    import subprocess

    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return f"no git checkout at {Path(__file__).resolve().parents[1]}"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return done.stdout.strip() + ("+changes" if dirty else "")


# --- logs ------------------------------------------------------------------------------------------


def _fault_windows(faults: list[Fault]) -> list[tuple[float, float, str]]:
    windows = []
    for fault in faults:
        if fault.fired_at is None:
            continue
        ended = fault.restored_at or fault.fired_at + fault.hold_s
        windows.append((fault.fired_at - 1, ended + TRACE_GRACE_S, fault.kind))
    return windows


def _stamp(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def scan_traces(paths: list[Path], faults: list[Fault], t0: float) -> dict[str, Any]:
    """Every stack trace in the logs: a JSON line's ``error.stack_trace``, or a raw ``Traceback``
    block (dated by the JSON line before it). Injected when it is a connection failure during a
    fault (or within a minute after it)."""
    windows = _fault_windows(faults)
    found: list[dict[str, Any]] = []
    for path in paths:
        if not path.exists():
            continue
        last_time: float | None = None
        raw: list[str] | None = None
        for line in path.read_text(errors="replace").splitlines():
            record: Any = None
            if line.startswith("{"):
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
            if isinstance(record, dict):
                if raw is not None:
                    found.append(_raw_trace(raw, last_time))
                    raw = None
                last_time = _stamp(record.get("timestamp")) or last_time
                error = record.get("error")
                if isinstance(error, dict) and error.get("stack_trace"):
                    found.append(
                        {
                            "at": last_time,
                            "component": record.get("component"),
                            "type": str(error.get("type")),
                            "message": f"{record.get('message')}: {error.get('message')}",
                            "trace": str(error["stack_trace"]),
                        }
                    )
                continue
            if line.startswith("Traceback (most recent call last)"):
                if raw is not None:
                    found.append(_raw_trace(raw, last_time))
                raw = [line]
            elif raw is not None:
                raw.append(line)
                ends = line and not line[0].isspace()
                if ends and not line.startswith(("During handling", "The above", "Traceback")):
                    found.append(_raw_trace(raw, last_time))
                    raw = None
        if raw is not None:
            found.append(_raw_trace(raw, last_time))
    groups: dict[tuple[str, str, str, bool], dict[str, Any]] = {}
    for trace in found:
        at = trace["at"]
        text = f"{trace['type']} {trace['message']} {trace['trace'][-600:]}"
        injected = (
            bool(_CONNECTIVITY.search(text)) and at is not None and any(b <= at <= e for b, e, _ in windows)
        )
        signature = re.sub(r"\d+", "N", str(trace["message"]))[:160]
        key = (str(trace["component"]), trace["type"], signature, injected)
        group = groups.setdefault(
            key,
            {
                "component": trace["component"],
                "type": trace["type"],
                "message": str(trace["message"])[:300],
                "injected": injected,
                "count": 0,
                "first_s": None if at is None else round(at - t0, 1),
                "sample": "\n".join(str(trace["trace"]).splitlines()[-14:]),
            },
        )
        group["count"] += 1
    listed = sorted(groups.values(), key=lambda g: (g["injected"], -g["count"]))
    return {
        "total": len(found),
        "injected": sum(g["count"] for g in listed if g["injected"]),
        "not_injected": sum(g["count"] for g in listed if not g["injected"]),
        "groups": listed,
    }


def _raw_trace(lines: list[str], at: float | None) -> dict[str, Any]:
    last = next((line for line in reversed(lines) if line.strip()), "")
    kind, _, message = last.partition(":")
    return {
        "at": at,
        "component": "raw stderr",
        "type": kind.strip(),
        "message": message.strip(),
        "trace": "\n".join(lines),
    }


def error_lines(path: Path, limit: int = 20) -> list[dict[str, Any]]:
    """ERROR and CRITICAL log lines of the components, by component and message (digits folded)."""
    counts: Counter[tuple[str, str]] = Counter()
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            if '"ERROR"' not in line and '"CRITICAL"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("level") in ("ERROR", "CRITICAL"):
                message = re.sub(r"\d+", "N", str(record.get("message", "")))[:200]
                counts[(str(record.get("component")), message)] += 1
    return [{"component": c, "message": m, "count": n} for (c, m), n in counts.most_common(limit)]


# --- writing -------------------------------------------------------------------------------------


def write(report: dict[str, Any], folder: Path, latest: Path | None) -> None:
    """``report.json`` and ``report.md`` in ``folder``; copies as ``latest.*`` in ``latest``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (folder / "report.md").write_text(markdown(report))
    if latest is not None:
        shutil.copy(folder / "report.json", latest / "latest.json")
        shutil.copy(folder / "report.md", latest / "latest.md")


def summary(report: dict[str, Any]) -> str:
    lines = [f"{'PASS' if ok else 'FAIL'}  {name}" for name, ok in report["verdict"]["checks"].items()]
    f = report["figures"]
    lines.append(
        f"expected {f['expected_runs']} runs, created {f['created_runs']}, lost {f['lost']}, "
        f"stuck {f['stuck']}, "
        f"duplicates {f['duplicates']} {f['duplicate_causes']}, unrecorded {f['unrecorded_double_effects']}, "
        f"drain {f['drain_s']} s"
    )
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    f = report["figures"]
    c = report["config"]
    out = [
        "# Chaos run",
        "",
        f"{c['jobs']} jobs, {c['workers']} workers × {c['concurrency']} over {c['partitions']} partitions, "
        f"{len(report['faults'])} faults in {c['duration_s']:.0f} s, seed {c['seed']}, code {c['commit']}"
        f"{' (' + c['label'] + ')' if c.get('label') else ''}, started {c['started']}.",
        "",
        "## Verdict",
        "",
        "| check | result |",
        "| --- | --- |",
    ]
    out += [
        f"| {name} | {'pass' if ok else '**FAIL**'} |" for name, ok in report["verdict"]["checks"].items()
    ]
    out += [
        "",
        "## Figures",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| expected runs | {f['expected_runs']} ({_pairs(f['expected_by_kind'])}) |",
        f"| runs created | {f['created_runs']} |",
        f"| expected fires without a run | {f['missing_fires']} |",
        f"| lost | {f['lost']} |",
        f"| stuck after the bound | {f['stuck']} {_pairs(f['stuck_by_state'])} |",
        f"| poison dead after one attempt and on the DLQ | {f['poison']['dead_after_one_attempt_on_dlq']} of "
        f"{f['poison']['runs']} |",
        f"| transient succeeded on attempt 2 | {f['transient']['succeeded_on_attempt_2']} of "
        f"{f['transient']['runs']} |",
        f"| executions recorded by the handlers | {f['executions']['total']} for "
        f"{f['executions']['runs_executed']} runs ({f['executions']['unfinished']} never finished) |",
        f"| duplicate executions | {f['duplicates']} ({f['duplicates_unexplained']} not explained by a "
        "killed or stopped worker) |",
        f"| jobs in flight on killed or stopped workers | {f['in_flight_on_killed_or_stopped_workers']} |",
        f"| jobs the relay published more than once | {f['jobs_published_more_than_once']} |",
        f"| runs with more attempts than planned | {f['runs_with_extra_attempts']} |",
        f"| double effects not recorded in `attempts` | {f['unrecorded_double_effects']} "
        f"(successes: {f['unrecorded_successes']}) |",
        f"| lease expiries by the sweeper | {f['sweeps']['expired']} (of attempts that had succeeded: "
        f"{f['sweeps']['of_attempts_that_had_succeeded']}; never started: "
        f"{f['sweeps']['of_attempts_never_started']}) |",
        f"| dead runs never executed | {f['dead_without_execution']} |",
        f"| drain time after the last fault | {f['drain_s']} s |",
        f"| consumer lag after the drain | {f['consumer_lag_after_drain']['total']} on "
        f"{f['consumer_lag_after_drain']['partitions_lagging']} partitions |",
        f"| consumer lag after a graceful stop of every worker | "
        f"{f['consumer_lag_after_graceful_stop']['total']} on "
        f"{f['consumer_lag_after_graceful_stop']['partitions_lagging']} partitions |",
        f"| outcomes the reconciler had not read after the drain | "
        f"{_pairs(f['reconciler_lag_after_drain'])} |",
        f"| executions after restarting every worker | {f['executions_after_restart']} |",
        f"| stack traces | {f['stack_traces']['total']} ({f['stack_traces']['injected']} injected, "
        f"{f['stack_traces']['not_injected']} not) |",
        f"| quarantined | {sum(int(q['n']) for q in f['quarantine'])} |",
        f"| schedules in error | {f['schedules_in_error']} |",
        f"| Avro commands | {_pairs(f['commands'])} |",
        f"| attempt events | {_pairs(f['attempt_events'])} |",
        "",
        "## Duplicate executions by cause",
        "",
        "| cause | executions |",
        "| --- | --- |",
    ]
    out += [f"| {cause} | {n} |" for cause, n in f["duplicate_causes"].items()] or ["| none | 0 |"]
    out += [
        "",
        "## Outcomes by kind of job",
        "",
        "| kind | expected | runs | as expected | states | attempts |",
    ]
    out += ["| --- | --- | --- | --- | --- | --- |"]
    for kind, o in f["outcomes"].items():
        out.append(
            f"| {kind} ({o['expect']}) | {o['expected']} | {o['runs']} | {o['as_expected']} | "
            f"{_pairs(o['states'])} | {_pairs(o['attempts'])} |"
        )
    out += ["", "## Restarts per component", "", "| component | died | injected | not injected |"]
    out += ["| --- | --- | --- | --- |"]
    out += [f"| {n} | {r['died']} | {r['injected']} | {r['unexpected']} |" for n, r in f["restarts"].items()]
    if f["unexpected_deaths"]:
        out += ["", "Deaths nobody caused:", ""]
        out += [
            f"- {d['name']} (pid {d['pid']}) at +{d['at_s']} s: {d['how']}"
            for d in f["unexpected_deaths"][:20]
        ]
    out += ["", "## Stack traces", ""]
    if not f["stack_traces"]["groups"]:
        out.append("None.")
    for group in f["stack_traces"]["groups"][:30]:
        label = "injected fault" if group["injected"] else "**not an injected fault**"
        out += [
            f"- {group['count']} × `{group['type']}` in {group['component']} ({label}), first at "
            f"+{group['first_s']} s: {group['message'][:200]}",
        ]
        if not group["injected"]:
            out += ["", "  ```", *("  " + line for line in group["sample"].splitlines()), "  ```", ""]
    if f["error_lines"]:
        out += ["", "## ERROR log lines", "", "| component | message | count |", "| --- | --- | --- |"]
        out += [
            f"| {e['component']} | {e['message'].replace('|', '/')[:160]} | {e['count']} |"
            for e in f["error_lines"]
        ]
    if f["quarantine"]:
        out += ["", "## Quarantine", ""]
        out += [f"- {q['n']} × {q['component']}: {q['reason']}" for q in f["quarantine"]]
    out += [
        "",
        "## Faults",
        "",
        "| at (s) | fault | victim | pid | restored (s) | note |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for fault in report["faults"]:
        out.append(
            f"| {fault.get('fired_s', '-')} | {fault['kind']} {fault['target'] or ''} | {fault['victim']} | "
            f"{fault['pid']} | {fault.get('restored_s', '')} | {fault['note']} |"
        )
    evidence = {k: v for k, v in report["evidence"].items() if v}
    if evidence:
        out += ["", "## Evidence (first examples)", ""]
        for name, items in evidence.items():
            out += [f"**{name}**", "", "```", *(json.dumps(i, default=str) for i in items), "```", ""]
    return "\n".join(out) + "\n"


def _pairs(mapping: dict[Any, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in mapping.items()) if mapping else "-"
