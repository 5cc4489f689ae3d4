"""The published scenario with faults: N jobs through every component while they are killed.

On a PostgreSQL and a Kafka of its own (never the shared development stack), it runs ``scheduler
run all`` for an app with many partitions (20 workers × 5 slots over 100 partitions by default;
the supervisor restarts what dies, as Kubernetes would), creates the jobs (immediate ones, delayed
ones due over the next minutes, cron schedules firing every few seconds, a few created by Avro
commands through the ingestor) and applies a seeded plan of faults: a worker killed every 10 s, a
worker stopped past its session timeout, each of scanner, relay, reconciler and ingestor killed,
the broker killed and restarted, PostgreSQL stopped immediately and restarted. Then it waits for
every run to end, reads the workers' consumer group, restarts every worker and watches that
nothing runs again, and writes the report (see ``bench/chaos_report.py`` and ``bench/README.md``).

    python -m bench.chaos --jobs 10000 --duration 240 --seed 1
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from bench import chaos_report
from bench.chaos_faults import PIPELINE, ROOT, Fault, Supervised, http_get, plan_faults
from bench.chaos_handlers import EXECUTIONS_DIR_ENV
from bench.chaos_kafka import group_lag
from bench.chaos_stack import ChaosStack, free_port_range
from scheduler.cli.common import interrupted_exit_code, sigterm_as_interrupt
from scheduler.client import ScheduleClient
from scheduler.client import spec as command_spec
from scheduler.domain.cron import CronSchedule
from scheduler.kafka.messages import ScheduleCommand
from scheduler.schedule import service
from scheduler.schedule.spec import MAX_PAYLOAD_BYTES, ScheduleSpec

RESULTS = Path(__file__).resolve().parent / "results" / "chaos"
APP = "chaos"
PREFIX = "chaos"
HANDLERS_MODULE = "bench.chaos_handlers"
HANDLERS = {"sync": f"{HANDLERS_MODULE}:run", "async": f"{HANDLERS_MODULE}:run_async"}
SPECIAL_KINDS = ("nul_result", "nul_error", "big_payload", "big_result")
UNFINISHED = ("pending", "dispatched", "running", "retry_wait")


@dataclass(frozen=True)
class ChaosOptions:
    jobs: int = 10_000
    duration_s: float = 240.0  # the fault phase; jobs are due within its first three quarters
    seed: int = 1
    workers: int = 20
    concurrency: int = 5
    partitions: int = 100
    kill_every_s: float = 10.0
    stop_s: float = 15.0  # SIGSTOP: longer than the consumers' 10 s session timeout
    kafka_down_s: float = 30.0
    pg_down_s: float = 20.0
    drain_timeout_s: float = 300.0  # the end bound, after the last fault
    quiet_s: float = 10.0  # watched after every worker restarted
    special: int | None = None  # jobs of each special kind (NUL result/error, near-1-MiB); default by size
    timeout_s: int = 30  # each attempt's execution timeout
    label: str = ""  # what code was run, for the report (a branch, "before the fix")
    report_dir: Path | None = None

    @property
    def special_count(self) -> int:
        return self.special if self.special is not None else max(1, self.jobs // 2500)


# --- the jobs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What one schedule asks its handler to do."""

    kind: str  # ok | poison | transient | one of SPECIAL_KINDS
    sleep: float
    mode: str  # sync | async

    @property
    def handler(self) -> str:
        return HANDLERS[self.mode]

    def payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": self.kind, "sleep": self.sleep}
        if self.kind == "big_payload":
            # Just under the limit the validation accepts, once encoded as the job message carries it.
            encoded = len(json.dumps(body | {"pad": ""}, separators=(",", ":")).encode())
            body["pad"] = incompressible(MAX_PAYLOAD_BYTES - encoded - 16, self.sleep)
        return body


def incompressible(size: int, seed: object) -> str:
    """``size`` random letters and digits: the producers compress (lz4), and a megabyte of one
    repeated letter would reach the broker as a few kilobytes, far from any size limit."""
    return "".join(random.Random(str(seed)).choices(string.ascii_letters + string.digits, k=size))


@dataclass(frozen=True)
class OneShot:
    id: uuid.UUID
    name: str
    job: Job
    due_s: float | None  # None: immediate; else delayed by this much after the start


@dataclass(frozen=True)
class CronPlan:
    name: str
    job: Job
    expression: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class CommandPlan:
    key: str
    job: Job
    wave: int


@dataclass
class JobPlan:
    one_shots: list[OneShot] = field(default_factory=list)
    crons: list[CronPlan] = field(default_factory=list)
    commands: list[CommandPlan] = field(default_factory=list)
    waves_s: list[float] = field(default_factory=list)


def plan_jobs(options: ChaosOptions) -> JobPlan:
    """The seeded mix: 40 % immediate, 40 % delayed, 20 % cron runs, 5 % of all created by Kafka
    commands; ~3 % poison, ~5 % transient; a few NUL-bearing and near-1-MiB ones."""
    rng = random.Random(options.seed)
    plan = JobPlan()
    jobs = options.jobs
    due_until = 0.75 * options.duration_s

    def job(kind: str | None = None) -> Job:
        if kind is None:
            draw = rng.random()
            kind = "poison" if draw < 0.03 else "transient" if draw < 0.08 else "ok"
        seconds = 0.2 if kind in SPECIAL_KINDS else round(rng.uniform(0.2, 2.0), 3)
        return Job(kind, seconds, rng.choice(("sync", "async")))

    def new_id() -> uuid.UUID:
        return uuid.UUID(int=rng.getrandbits(128), version=4)

    commands = max(1, round(jobs * 0.05))
    cron_runs = round(jobs * 0.2)
    delayed = round(jobs * 0.4)
    specials = [kind for kind in SPECIAL_KINDS for _ in range(options.special_count)]
    immediate = max(len(specials), jobs - commands - cron_runs - delayed)
    for index in range(immediate):
        kind = specials[index] if index < len(specials) else None
        plan.one_shots.append(OneShot(new_id(), f"now-{index}", job(kind), None))
    for index in range(delayed):
        plan.one_shots.append(
            OneShot(new_id(), f"later-{index}", job(), round(rng.uniform(2.0, due_until), 3))
        )
    planned = 0
    while planned < cron_runs:
        step = rng.choice((2, 3, 4, 5, 6))
        start = round(rng.uniform(2.0, due_until / 3), 3)
        end = round(rng.uniform(max(start + 10, due_until / 2), due_until), 3)
        index = len(plan.crons)
        plan.crons.append(CronPlan(f"cron-{index}", job(), f"*/{step} * * * * *", start, end))
        planned += int((end - start) / step)
    waves = max(1, min(8, commands))
    plan.waves_s = sorted(round(rng.uniform(0.05, 0.8) * options.duration_s, 2) for _ in range(waves))
    plan.commands = [CommandPlan(f"cmd-{i}", job(), i % waves) for i in range(commands)]
    return plan


def create_jobs(url: str, plan: JobPlan, options: ChaosOptions) -> tuple[datetime, dict[str, int]]:
    """Insert the one-shot and cron schedules at once; returns the database's start instant and
    the runs each cron schedule should produce (by name), computed by the scheduler's own cron."""
    expected: dict[str, int] = {}
    with psycopg.connect(url, row_factory=dict_row) as conn:
        row = conn.execute("select now() as now").fetchone()
        assert row is not None
        start: datetime = row["now"]
        with (
            conn.cursor() as cursor,
            cursor.copy(
                "copy schedules (id, app, name, kind, handler, payload, run_at, next_fire_at, timeout_ms) "
                "from stdin"
            ) as copy,
        ):
            for one in plan.one_shots:
                due = start if one.due_s is None else start + timedelta(seconds=one.due_s)
                copy.write_row(
                    (
                        one.id,
                        APP,
                        one.name,
                        "immediate" if one.due_s is None else "delayed",
                        one.job.handler,
                        Jsonb(one.job.payload()),
                        None if one.due_s is None else due,
                        due,
                        options.timeout_s * 1000,
                    )
                )
        for cron in plan.crons:
            created = service.create_schedule(
                conn,
                ScheduleSpec(
                    app=APP,
                    handler=cron.job.handler,
                    kind="cron",
                    name=cron.name,
                    cron=cron.expression,
                    start_at=start + timedelta(seconds=cron.start_s),
                    end_at=start + timedelta(seconds=cron.end_s),
                    payload=cron.job.payload(),
                    timeout_ms=options.timeout_s * 1000,
                    # Every fire must run, however late the scan finds it (after the outage of
                    # PostgreSQL, say): the expected count stays exact.
                    misfire_policy="fire_all",
                ),
                "chaos",
            )
            expected[cron.name] = cron_fires(created, start + timedelta(seconds=cron.end_s))
        conn.execute("select pg_notify('scheduler_due', '')")
        conn.commit()
    return start, expected


def cron_fires(schedule: dict[str, Any], end_at: datetime) -> int:
    first: datetime | None = schedule["next_fire_at"]
    if first is None:
        return 0
    fires = CronSchedule.of(schedule["cron"], schedule["tz"], schedule_id=schedule["id"]).fire_times(first)
    count = 1
    for fire in fires:
        if fire > end_at:
            break
        count += 1
    return count


class CommandSender(threading.Thread):
    """Sends the Avro create commands in waves during the faults; a command Kafka did not
    acknowledge is sent again with the same id (applied once: the ingestor deduplicates ids)."""

    def __init__(self, client: ScheduleClient, plan: JobPlan, t0: float, options: ChaosOptions) -> None:
        super().__init__(name="commands", daemon=True)
        self.client = client
        self.plan = plan
        self.t0 = t0
        self.timeout_s = options.timeout_s
        self.ids = {c.key: str(uuid.UUID(int=random.Random(c.key).getrandbits(128))) for c in plan.commands}
        self.acked: set[str] = set()
        self.sends = 0
        self.failures: list[str] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def _send(self, command: CommandPlan) -> None:
        def delivered(error: str | None) -> None:
            with self._lock:
                if error is None:
                    self.acked.add(command.key)
                else:
                    self.failures.append(f"{command.key}: {error}")

        self.sends += 1
        self.client.send(
            ScheduleCommand(
                command_id=self.ids[command.key],
                schedule_key=command.key,
                app=APP,
                operation="create",
                spec=command_spec(
                    handler=command.job.handler,
                    name=command.key,
                    payload=command.job.payload(),
                    timeout_seconds=self.timeout_s,
                ),
                actor="chaos",
            ),
            delivered,
        )

    def _flush(self, timeout_s: float) -> None:
        try:
            self.client.flush(timeout_s)
        except Exception as exc:  # reported per command by the callbacks; sent again below
            with self._lock:
                self.failures.append(f"flush: {exc}")

    def run(self) -> None:
        for wave, at in enumerate(self.plan.waves_s):
            if self.stop.wait(max(0.0, self.t0 + at - time.time())):
                return
            for command in self.plan.commands:
                if command.wave <= wave and command.key not in self.acked:
                    self._send(command)
            self._flush(20)
        while not self.stop.is_set() and len(self.acked) < len(self.plan.commands):
            for command in self.plan.commands:
                if command.key not in self.acked:
                    self._send(command)
            self._flush(20)
            self.stop.wait(2)


# --- the run -------------------------------------------------------------------------------------


def say(line: str) -> None:
    print(f"[chaos {datetime.now(UTC).strftime('%H:%M:%S')}] {line}", flush=True)


def child_env(stack: ChaosStack, executions: Path) -> dict[str, str]:
    """The components' environment: this stack only (no SCHEDULER_* inherited from the caller),
    JSON logs, the chaos handlers registered and importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    path = [str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    return (
        env
        | stack.env()
        | {
            "SCHEDULER_TOPIC_PREFIX": PREFIX,
            "SCHEDULER_LOG_FORMAT": "json",
            "SCHEDULER_HANDLERS": HANDLERS_MODULE,
            EXECUTIONS_DIR_ENV: str(executions),
            "PYTHONPATH": os.pathsep.join(path),
        }
    )


def cli(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scheduler", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"scheduler {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
        )


def worker_names(options: ChaosOptions) -> list[str]:
    if options.workers == 1:
        return [f"worker-{APP}"]
    return [f"worker-{APP}-{i}" for i in range(1, options.workers + 1)]


def assigned_partitions(port: int) -> int | None:
    """What a worker's /health says it holds (``N partitions assigned``, 0 while joining), None if
    it does not say."""
    status, body = http_get(port, "/health")
    if status == 0:
        return None
    try:
        detail = str(json.loads(body)["components"]["consumer_group"].get("detail", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if "joining" in detail:
        return 0
    words = detail.split()
    return int(words[0]) if words and words[0].isdigit() and "assigned" in detail else None


def wait_ready(sup: Supervised, names: Sequence[str], partitions: int, timeout_s: float) -> bool:
    """Every child answers /ready, and the workers hold every partition between them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sup.refresh()
        ready = all(http_get(sup.ports[name], "/ready")[0] == 200 for name in names)
        workers = [n for n in names if n.startswith("worker")]
        held = [assigned_partitions(sup.ports[n]) for n in workers]
        # A worker whose health does not say what it holds: its readiness is all there is to go by.
        if ready and (all(h is None for h in held) or sum(h or 0 for h in held) >= partitions):
            return True
        time.sleep(0.5)
    return False


class FaultRunner:
    """Applies the plan as its times come; restores (SIGCONT, broker and database restarts) run in
    threads so that a slow restart never delays the next fault."""

    def __init__(
        self, faults: list[Fault], sup: Supervised, stack: ChaosStack, options: ChaosOptions
    ) -> None:
        self.faults = faults
        self.sup = sup
        self.stack = stack
        self.workers = worker_names(options)
        self.rng = random.Random(options.seed + 2)
        self.stopped: dict[str, int] = {}  # worker name -> pid, while SIGSTOPped
        self.killed: dict[int, float] = {}  # pid -> when it was killed (kill -9)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def done(self) -> bool:
        return all(
            f.fired_at is not None and (not f.hold_s or f.restored_at is not None) for f in self.faults
        )

    def tick(self, t0: float) -> None:
        now = time.time()
        for fault in self.faults:
            if fault.fired_at is None and now >= t0 + fault.at_s:
                self._fire(fault)
            elif (
                fault.kind == "stop_worker"
                and fault.fired_at
                and fault.restored_at is None
                and now >= fault.fired_at + fault.hold_s
            ):
                self._resume(fault)

    def _pick_worker(self) -> tuple[str, int] | None:
        alive = [(n, pid) for n in self.workers if n not in self.stopped and (pid := self.sup.alive_child(n))]
        return self.rng.choice(alive) if alive else None

    def _fire(self, fault: Fault) -> None:
        if fault.kind in ("kill_worker", "stop_worker"):
            picked = self._pick_worker()
            if picked is None:
                return  # every worker is down or stopped: try again at the next tick
            fault.victim, fault.pid = picked
            if fault.kind == "kill_worker":
                os.kill(fault.pid, signal.SIGKILL)
                self.killed[fault.pid] = time.time()
            else:
                os.kill(fault.pid, signal.SIGSTOP)
                self.stopped[fault.victim] = fault.pid
        elif fault.kind == "kill_component":
            assert fault.target is not None
            pid = self.sup.alive_child(fault.target)
            if pid is None:
                return  # being restarted: kill the next one
            fault.victim, fault.pid = fault.target, pid
            os.kill(pid, signal.SIGKILL)
            self.killed[pid] = time.time()
        elif fault.kind == "kill_kafka":
            fault.victim, fault.pid = "kafka", self.stack.kill_kafka()
            fault.fired_at = time.time()
            self._later(fault, self.stack.start_kafka)
        elif fault.kind == "stop_postgres":
            fault.victim, fault.pid = "postgres", self.stack.stop_postgres_immediately()
            fault.fired_at = time.time()
            self._later(fault, self.stack.start_postgres)
        fault.fired_at = fault.fired_at or time.time()
        say(f"fault: {fault.kind} {fault.victim} (pid {fault.pid})")

    def _resume(self, fault: Fault) -> None:
        assert fault.victim is not None and fault.pid is not None
        if self.sup.alive_child(fault.victim) == fault.pid:
            os.kill(fault.pid, signal.SIGCONT)
        self.stopped.pop(fault.victim, None)
        fault.restored_at = time.time()
        say(f"restored: SIGCONT {fault.victim} (pid {fault.pid})")

    def _later(self, fault: Fault, restart: Callable[[], None]) -> None:
        fired = fault.fired_at or time.time()

        def restore() -> None:
            time.sleep(max(0.0, fired + fault.hold_s - time.time()))
            for attempt in range(1, 6):
                try:
                    restart()
                    break
                except Exception as exc:
                    fault.note += f"restart attempt {attempt} failed: {exc}; "
                    say(f"restarting {fault.victim} failed: {exc}")
                    time.sleep(2)
            fault.restored_at = time.time()
            say(f"restored: {fault.victim} after {fault.restored_at - fired:.1f} s")

        thread = threading.Thread(target=restore, name=f"restore-{fault.kind}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def resume_all(self) -> None:
        """SIGCONT whatever is still stopped (a run that fails half-way must not leave it so)."""
        for name, pid in list(self.stopped.items()):
            if self.sup.alive_child(name) == pid:
                os.kill(pid, signal.SIGCONT)
            self.stopped.pop(name, None)

    def join(self, timeout_s: float) -> None:
        for thread in self._threads:
            thread.join(timeout_s)


def progress(url: str) -> str:
    """Runs by state now, as a line."""
    try:
        with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
            rows = conn.execute("select state, count(*) from runs group by state order by 1").fetchall()
    except psycopg.Error:
        return "PostgreSQL does not answer"
    return ", ".join(f"{state} {n}" for state, n in rows) or "none yet"


def drained(url: str, commands: int) -> bool:
    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        row = conn.execute(
            "select (select count(*) from runs where state = any(%s)) as unfinished, "
            "(select count(*) from schedules where state = 'active') as active, "
            "(select count(*) from schedule_keys) as keyed, "
            # A relay killed mid-batch leaves rows that are published again once its claim lapses.
            "(select count(*) from outbox) as outbox",
            (list(UNFINISHED),),
        ).fetchone()
    assert row is not None
    unfinished, active, keyed, outbox = (int(n) for n in row)
    return unfinished == 0 and active == 0 and keyed >= commands and outbox == 0


def run_chaos(options: ChaosOptions) -> dict[str, Any]:
    """The whole run; returns the report (also written as JSON and Markdown)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report_dir = options.report_dir or RESULTS / stamp
    logs, executions = report_dir / "logs", report_dir / "executions"
    logs.mkdir(parents=True, exist_ok=True)
    executions.mkdir(parents=True, exist_ok=True)
    plan = plan_jobs(options)
    faults = plan_faults(
        options.duration_s,
        options.seed,
        kill_every_s=options.kill_every_s,
        stop_s=options.stop_s,
        kafka_down_s=options.kafka_down_s,
        pg_down_s=options.pg_down_s,
    )
    say(
        f"{options.jobs} jobs, {options.workers} workers x {options.concurrency} over "
        f"{options.partitions} partitions, {len(faults)} faults in {options.duration_s:.0f} s, "
        f"seed {options.seed}"
    )
    stack = ChaosStack()
    sup: Supervised | None = None
    runner: FaultRunner | None = None
    sender: CommandSender | None = None
    client: ScheduleClient | None = None
    timings: dict[str, Any] = {}
    try:
        stack.up()
        env = child_env(stack, executions)
        url = stack.postgres.url
        cli(env, "init")
        cli(env, "apps", "create", APP, "--partitions", str(options.partitions))
        names = [*PIPELINE, *worker_names(options)]
        base = free_port_range(len(names))
        argv = [sys.executable, "-m", "scheduler", "run", "all", "--app", APP]
        argv += ["--workers", str(options.workers), "--concurrency", str(options.concurrency)]
        sup = Supervised([*argv, "--metrics-port", str(base)], env, logs)
        sup.table(len(names), 120)
        if not wait_ready(sup, names, options.partitions, 180):
            say("not every component was ready after 180 s; starting anyway")
        runner = FaultRunner(faults, sup, stack, options)
        start_db, cron_expected = create_jobs(url, plan, options)
        t0 = time.time()
        timings["t0"] = t0
        say(f"jobs created: {len(plan.one_shots)} one-shots, {len(plan.crons)} cron schedules")
        client = ScheduleClient(stack.kafka.bootstrap, PREFIX, client_id="chaos-commands")
        sender = CommandSender(client, plan, t0, options)
        sender.start()

        last_progress = 0.0
        while not (runner.done() and time.time() >= t0 + options.duration_s):
            sup.refresh()
            runner.tick(t0)
            if time.time() - last_progress >= 10:
                last_progress = time.time()
                say(f"+{time.time() - t0:.0f} s runs: {progress(url)}")
            time.sleep(0.1)
        fault_end = max(f.ended_at or t0 for f in faults)
        timings["last_fault_end"] = fault_end
        say(f"faults over at +{fault_end - t0:.0f} s; draining")

        bound = fault_end + options.drain_timeout_s
        drained_at: float | None = None
        while time.time() < bound:
            sup.refresh()
            try:
                if drained(url, len(plan.commands)):
                    drained_at = time.time()
                    break
            except psycopg.Error:
                pass
            if time.time() - last_progress >= 10:
                last_progress = time.time()
                say(f"+{time.time() - t0:.0f} s runs: {progress(url)}")
            time.sleep(1)
        timings["drained_at"] = drained_at
        timings["bound"] = bound
        sender.stop.set()
        say("drained" if drained_at else "NOT drained by the end bound")

        group = f"{PREFIX}.workers.{APP}"
        topic = f"{PREFIX}.jobs.{APP}"
        lag_after_drain = settle_lag(stack.kafka.bootstrap, group, topic, 30)
        say(f"consumer lag after the drain: {sum(lag_after_drain.values())}")
        outcome_lag = {
            name: sum(
                settle_lag(stack.kafka.bootstrap, f"{PREFIX}.reconciler", f"{PREFIX}.{name}", 5).values()
            )
            for name in ("results", "retry", "dlq")
        }
        restart = restart_workers(sup, options, stack.kafka.bootstrap, group, topic, executions, url)
        say(f"after restarting every worker: {restart['executions']} executions")
        code = sup.stop()
        timings["supervisor_exit"] = code
        sup.refresh()
        dump_tables(url, report_dir / "data")

        report = chaos_report.build(
            chaos_report.Inputs(
                options=asdict(replace(options, report_dir=None)),
                url=url,
                bootstrap=stack.kafka.bootstrap,
                prefix=PREFIX,
                app=APP,
                start_db=start_db,
                t0=t0,
                timings=timings,
                faults=faults,
                killed=dict(runner.killed),
                graceful=set(restart["pids"]),
                cron_expected=cron_expected,
                cron_kinds={c.name: c.job.kind for c in plan.crons},
                one_shots={one.id: one.job.kind for one in plan.one_shots},
                commands={c.key: c.job.kind for c in plan.commands},
                command_sends=sender.sends,
                supervisor=sup,
                executions_dir=executions,
                lag_after_drain=lag_after_drain,
                outcome_lag=outcome_lag,
                restart=restart,
            )
        )
    finally:
        if sender is not None:
            sender.stop.set()
        if runner is not None:
            runner.resume_all()
        if sup is not None:
            if sup.proc.poll() is None:
                sup.stop(60)
            leftovers = sup.kill_leftovers()
            if leftovers:
                say(f"killed leftover processes {leftovers}")
        if runner is not None:
            runner.join(60)
        for name, path in stack.logs().items():
            if path.exists():
                shutil.copy(path, logs / name)
        stack.down()
    chaos_report.write(report, report_dir, latest=RESULTS if options.report_dir is None else None)
    return report


def dump_tables(url: str, folder: Path) -> None:
    """The runs and attempts as CSV, for reading a report's evidence after the stack is gone."""
    folder.mkdir(parents=True, exist_ok=True)
    queries = {
        "runs.csv": "select r.id, r.schedule_id, s.name, s.payload->>'kind' as job_kind, r.state, r.attempt, "
        "r.worker, r.scheduled_for, r.dispatched_at, r.started_at, r.finished_at, r.lease_expires_at, "
        "left(r.error, 300) as error from runs r join schedules s on s.id = r.schedule_id order by r.id",
        "attempts.csv": "select id, run_id, attempt, event_id, kind, outcome, worker, started_at, "
        "finished_at, received_at, error_class, left(error, 300) as error from attempts order by id",
    }
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        for name, sql in queries.items():
            with (
                (folder / name).open("wb") as out,
                cursor.copy(f"copy ({sql}) to stdout with csv header") as copy,
            ):
                for chunk in copy:
                    out.write(chunk)


def settle_lag(bootstrap: str, group: str, topic: str, timeout_s: float) -> dict[int, int]:
    """The group's lag once it reaches 0 (commits trail the last outcomes by a moment), or as it
    is after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            lag = group_lag(bootstrap, group, topic)
        except Exception as exc:
            say(f"reading the group's offsets failed: {exc}")
            lag = {}
        if (lag and sum(lag.values()) == 0) or time.monotonic() >= deadline:
            return lag
        time.sleep(1)


def restart_workers(
    sup: Supervised,
    options: ChaosOptions,
    bootstrap: str,
    group: str,
    topic: str,
    executions: Path,
    url: str,
) -> dict[str, Any]:
    """SIGTERM every worker (the supervisor starts a new one for each), wait until the new ones hold
    every partition, watch ``quiet_s``; what ran meanwhile should be nothing."""
    names = worker_names(options)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("select now()").fetchone()
    assert row is not None
    since_db: datetime = row[0]
    since = time.time()
    stopped = {name: pid for name in names if (pid := sup.signal_child(name, signal.SIGTERM)) is not None}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(sup.alive_child(n) == pid for n, pid in stopped.items()):
        time.sleep(0.2)
    try:
        lag_after_stop = group_lag(bootstrap, group, topic)
    except Exception:
        lag_after_stop = {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        sup.refresh()
        if all(sup.alive_child(n) not in (None, stopped.get(n)) for n in names):
            break
        time.sleep(0.2)
    settled = wait_ready(sup, names, options.partitions, 90)
    watched_from = time.time()
    time.sleep(options.quiet_s)
    sup.refresh()
    ran = [e for e in chaos_report.load_executions(executions) if e.start >= since]
    with psycopg.connect(url, autocommit=True) as conn:
        # Recorded events, and the runs an event was applied to (their rows hold the plain ones).
        events = conn.execute(
            "select (select count(*) from attempts where received_at >= %(since)s)"
            "     + (select count(*) from runs where reconciled_at >= %(since)s)",
            {"since": since_db},
        ).fetchone()
    return {
        "pids": list(stopped.values()),
        "workers_stopped": len(stopped),
        "group_settled": settled,
        "watched_s": round(time.time() - watched_from, 1),
        "lag_after_graceful_stop": lag_after_stop,
        "executions": len(ran),
        "executed_runs": sorted({e.run for e in ran})[:20],
        "attempt_events": int(events[0]) if events else 0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    # The command producer's reconnect warnings during the broker's outage are expected.
    logging.getLogger("scheduler").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = ChaosOptions()
    parser.add_argument("--jobs", type=int, default=defaults.jobs)
    parser.add_argument("--duration", type=float, default=defaults.duration_s, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--partitions", type=int, default=defaults.partitions)
    parser.add_argument("--kill-every", type=float, default=defaults.kill_every_s)
    parser.add_argument("--stop", type=float, default=defaults.stop_s, help="seconds a worker is SIGSTOPped")
    parser.add_argument("--kafka-down", type=float, default=defaults.kafka_down_s)
    parser.add_argument("--pg-down", type=float, default=defaults.pg_down_s)
    parser.add_argument("--drain-timeout", type=float, default=defaults.drain_timeout_s)
    parser.add_argument("--quiet", type=float, default=defaults.quiet_s)
    parser.add_argument("--special", type=int, default=None, help="jobs of each NUL/near-1-MiB kind")
    parser.add_argument("--timeout", type=int, default=defaults.timeout_s, help="attempt timeout, seconds")
    parser.add_argument("--label", default="", help="what code this is, shown in the report")
    parser.add_argument("--report-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    options = ChaosOptions(
        jobs=args.jobs,
        duration_s=args.duration,
        seed=args.seed,
        workers=args.workers,
        concurrency=args.concurrency,
        partitions=args.partitions,
        kill_every_s=args.kill_every,
        stop_s=args.stop,
        kafka_down_s=args.kafka_down,
        pg_down_s=args.pg_down,
        drain_timeout_s=args.drain_timeout,
        quiet_s=args.quiet,
        special=args.special,
        timeout_s=args.timeout,
        label=args.label,
        report_dir=args.report_dir,
    )
    try:
        # SIGTERM (a CI timeout, say) unwinds like Ctrl-C, so that every process started is stopped.
        with sigterm_as_interrupt():
            report = run_chaos(options)
    except KeyboardInterrupt as stop:
        print("interrupted; cleaned up", file=sys.stderr)
        return interrupted_exit_code(stop)
    print(chaos_report.summary(report), flush=True)
    return 0 if report["verdict"]["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
