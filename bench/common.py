"""What the benchmarks share: an isolated database and topic prefix on the local stack, the
components as processes, percentiles, and the results file."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from scheduler.cli.common import interrupted_exit_code, sigterm_as_interrupt
from scheduler.config import Settings, load_settings
from scheduler.devstack import LocalStack
from scheduler.kafka.transport import KafkaUnavailable
from scheduler.runtime.supervisor import stop_processes
from scheduler.store.migrate import migrate
from scheduler.wiring import Wiring

RESULTS = Path(__file__).resolve().parent / "results"

# The ids of the schedules and runs the benchmarks insert themselves, made as the scheduler makes
# its own (time-ordered, UUIDv7: scheduler/domain/ids.py), at the instant given: a loaded history
# then has the keys this release would have written. PostgreSQL 18 has uuidv7(); before it, random.
BENCH_ID = """
create function bench_id(at timestamptz default clock_timestamp()) returns uuid language plpgsql as $$
begin
    if current_setting('server_version_num')::int >= 180000 then
        return uuidv7(at - clock_timestamp());
    end if;
    return gen_random_uuid();
end $$
"""


@contextmanager
def isolated_settings(label: str) -> Iterator[Settings]:
    """A fresh database and topic prefix on the local stack (started if needed), removed after."""
    env = dict(os.environ)
    if not (env.get("SCHEDULER_DATABASE_URL") and env.get("SCHEDULER_KAFKA_BOOTSTRAP")):
        stack = LocalStack(load_settings())
        stack.up()
        env |= stack.env()
    base_url = env["SCHEDULER_DATABASE_URL"]
    name = f"bench_{label}_{uuid.uuid4().hex[:6]}"
    url = base_url.rsplit("/", 1)[0] + f"/{name}"
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    settings = load_settings(env | {"SCHEDULER_DATABASE_URL": url, "SCHEDULER_TOPIC_PREFIX": prefix})
    wiring = Wiring(settings)
    # The set-up is inside the try: a migration or a topic creation that fails or is interrupted
    # still has the database dropped and the topics made so far deleted.
    try:
        with psycopg.connect(base_url, autocommit=True) as admin:
            admin.execute(f'create database "{name}"')
        with wiring.database.connect() as conn:
            migrate(conn)
            conn.execute(BENCH_ID)
            conn.commit()
        wiring.admin.ensure_topics(settings.core_topics, partitions=6)
        yield settings
    finally:
        with psycopg.connect(base_url, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')
        wiring.admin.delete_topics([t for t in wiring.admin.topics() if t.startswith(prefix + ".")])


def component_env(settings: Settings, extra: dict[str, str] | None = None) -> dict[str, str]:
    return (
        dict(os.environ)
        | {
            "SCHEDULER_DATABASE_URL": settings.database_url,
            "SCHEDULER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "SCHEDULER_TOPIC_PREFIX": settings.topic_prefix,
        }
        | (extra or {})
    )


class ComponentExited(RuntimeError):
    """A component that a benchmark started (``running``) ended before the benchmark was done."""


# The components of the ``running`` blocks open now: the command after ``scheduler run``, the log.
_RUNNING: list[tuple[subprocess.Popen[bytes], str, Path | None]] = []


def check_components() -> None:
    """Raise :class:`ComponentExited` when a component of an open ``running`` block has ended: a
    wait for the work it was to do would wait out its limit (600 s for e2e) for nothing."""
    for proc, command, log in _RUNNING:
        code = proc.poll()
        if code is not None:
            where = f"; its log: {log}" if log else ""
            raise ComponentExited(
                f"`scheduler run {command}` (pid {proc.pid}) exited with status {code}{where}"
            )


def wait_until(condition: Any, timeout_s: float, interval_s: float = 0.05) -> float:
    """Poll until true; returns the monotonic time it became true. Inside ``running``, a component
    that has exited ends the wait (:class:`ComponentExited`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        check_components()
        if condition():
            return time.monotonic()
        time.sleep(interval_s)
    raise TimeoutError(f"not done within {timeout_s} s")


def percentiles(values_ms: Sequence[float]) -> dict[str, float]:
    if not values_ms:
        return {}
    ordered = sorted(values_ms)
    if len(ordered) == 1:
        only = round(ordered[0], 1)
        return {"p50": only, "p90": only, "p99": only, "max": only}
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {
        "p50": round(q[49], 1),
        "p90": round(q[89], 1),
        "p99": round(q[98], 1),
        "max": round(ordered[-1], 1),
    }


def machine() -> dict[str, Any]:
    memory_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kb = int(line.split()[1])
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def record(section: str, figures: dict[str, Any]) -> Path:
    """Write this run's figures and merge them into ``results/latest.json``."""
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS / f"{section}-{stamp}.json").write_text(json.dumps(figures, indent=2))
    latest_path = RESULTS / "latest.json"
    latest = json.loads(latest_path.read_text()) if latest_path.exists() else {}
    latest[section] = figures
    latest["machine"] = machine()
    latest_path.write_text(json.dumps(latest, indent=2))
    return latest_path


# Added for the lag, peers and ingestion benchmarks; the helpers above stay as bench/e2e.py uses them.

BENCH_APP = "bench"
PEERS_VENV = RESULTS / ".venv-peers"
PEERS_REQUIREMENTS = Path(__file__).resolve().parent / "peers" / "requirements.txt"


def create_bench_app(settings: Settings, partitions: int, name: str = BENCH_APP) -> None:
    """The app every benchmark's jobs belong to, with its topic."""
    from scheduler.schedule import service

    wiring = Wiring(settings)
    with wiring.database.connect() as conn:
        service.create_app(conn, wiring.admin, settings, name, partitions, "bench")


def pipeline_commands(workers: int, concurrency: int, app: str = BENCH_APP) -> list[list[str]]:
    """Scanner, relay, reconciler and ``workers`` worker processes: what ``scheduler run all`` runs."""
    commands = [["scanner"], ["relay"], ["reconciler"]]
    return commands + [["worker", "--app", app, "--concurrency", str(concurrency)]] * workers


def warm_up(conn: psycopg.Connection[Any], jobs: int, app: str = BENCH_APP, timeout_s: float = 120) -> float:
    """Run ``jobs`` immediate no-op jobs through the pipeline and wait for them: connections open,
    the workers' consumer group settled. Their schedules are named ``warmup-*``; returns seconds."""
    started = time.monotonic()
    conn.execute(
        "insert into schedules (id, app, name, kind, handler, next_fire_at) "
        "select bench_id(), %s, 'warmup-' || g, 'immediate', 'builtin:noop', now() "
        "from generate_series(1, %s) g",
        (app, jobs),
    )
    conn.execute("select pg_notify('scheduler_due', '')")
    conn.commit()

    def done() -> bool:
        row = conn.execute(
            "select count(*) as n from runs r join schedules s on s.id = r.schedule_id "
            "where s.name like %s and r.state = 'succeeded'",
            ("warmup-%",),
        ).fetchone()
        conn.commit()
        return row is not None and row["n"] >= jobs

    return wait_until(done, timeout_s, interval_s=0.1) - started


def ms_percentiles(values_ms: Sequence[float]) -> dict[str, float]:
    """``percentiles`` with the unit in the key (``p99_ms``), as the lag figures are recorded."""
    return {f"{key}_ms": value for key, value in percentiles(values_ms).items()}


def peers_python() -> Path:
    """The interpreter of the peers' own virtualenv (kept apart so the project's dependencies stay
    lean), created and filled from ``bench/peers/requirements.txt`` on first use."""
    python = PEERS_VENV / "bin" / "python"
    stamp = PEERS_VENV / ".installed"
    wanted = PEERS_REQUIREMENTS.read_text()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    if not stamp.exists() or stamp.read_text() != wanted:
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "-r", str(PEERS_REQUIREMENTS)], check=True
        )
        stamp.write_text(wanted)
    return python


def latest() -> dict[str, Any]:
    """What ``results/latest.json`` holds so far (empty before the first run)."""
    path = RESULTS / "latest.json"
    return json.loads(path.read_text()) if path.exists() else {}


@contextmanager
def running(
    commands: Sequence[Sequence[str]], env: dict[str, str], log_dir: Path | None = None, grace_s: float = 30
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``scheduler run`` components as processes, stopped on exit. With ``log_dir`` each one's output
    is kept there (one file per process) so that a stall or a crash can be read afterwards."""
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    entries: list[tuple[subprocess.Popen[bytes], str, Path | None]] = []
    try:
        for index, args in enumerate(commands):
            name = "-".join(a for a in args if not a.startswith("-") and not a.isdigit())
            path = log_dir / f"{index:02d}-{name}.log" if log_dir else None
            with open(path or os.devnull, "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "scheduler", "run", *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            procs.append(proc)
            entries.append((proc, " ".join(args), path))
        _RUNNING.extend(entries)
        yield procs
    finally:
        # Stopped on purpose from here on: no longer a reason for a wait to end.
        for entry in entries:
            if entry in _RUNNING:
                _RUNNING.remove(entry)
        stop_processes(procs, grace_s)


def stack_database_url() -> str:
    """The local stack's server (started if needed), for peers that make their own database."""
    url = os.environ.get("SCHEDULER_DATABASE_URL")
    if url and os.environ.get("SCHEDULER_KAFKA_BOOTSTRAP"):
        return url
    stack = LocalStack(load_settings())
    stack.up()
    return stack.env()["SCHEDULER_DATABASE_URL"]


def console() -> Any:
    """A rich console wide enough for the tables when output is not a terminal (``make bench | tee``)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=150)


def run_main(main: Callable[[], object]) -> None:
    """A benchmark's entry point: ``main`` with SIGTERM (a CI timeout, say) unwinding like Ctrl-C,
    so that every process started is stopped and every database and topic made is removed by the
    context managers above; an interruption is reported in one line (after the clean-up it unwound
    through) with the shell's status for the signal, 130 for Ctrl-C, rather than with a traceback."""
    try:
        with sigterm_as_interrupt():
            main()
    except KeyboardInterrupt as stop:
        print("interrupted; cleaned up", file=sys.stderr)
        raise SystemExit(interrupted_exit_code(stop)) from None
    except ComponentExited as exited:
        # Cleaned up as for an interruption, on the way out of the context managers.
        print(f"error: {exited}", file=sys.stderr)
        raise SystemExit(1) from None
    except psycopg.OperationalError as exc:
        # A stack that is not there (or went away): one line, as the CLI says it. libpq's message
        # names the host and port, never the password.
        print(f"error: PostgreSQL (SCHEDULER_DATABASE_URL): {_first_line(exc)}", file=sys.stderr)
        raise SystemExit(1) from None
    except KafkaUnavailable as exc:
        print(f"error: Kafka (SCHEDULER_KAFKA_BOOTSTRAP): {_first_line(exc)}", file=sys.stderr)
        raise SystemExit(1) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# argparse types for the command lines: a count, a rate or a duration that is zero or negative
# (or not a number) is refused with one line and exit status 2, before anything is started.


def _number(text: str, kind: Callable[[str], float], allow_zero: bool) -> float:
    try:
        value = kind(text.replace("_", ""))
    except ValueError:
        wanted = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise argparse.ArgumentTypeError(f"{text!r}: must be {'0 or more' if allow_zero else 'above 0'}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, int, allow_zero=False))


def non_negative_int(text: str) -> int:
    """A count where 0 means "skip this part"."""
    return int(_number(text, int, allow_zero=True))


def positive_float(text: str) -> float:
    return _number(text, float, allow_zero=False)


def non_negative_float(text: str) -> float:
    return _number(text, float, allow_zero=True)


def positive_ints(text: str) -> list[int]:
    """Comma separated counts or rates, each above zero ('' is none)."""
    return [positive_int(part) for part in text.split(",") if part]


def non_negative_ints(text: str) -> list[int]:
    """Comma separated counts, each zero or more ('' is none)."""
    return [non_negative_int(part) for part in text.split(",") if part]
