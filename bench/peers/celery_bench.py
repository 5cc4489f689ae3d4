"""Celery with a Redis broker: no-op tasks drained by worker processes, then tasks with an ETA.

Runs in the peers' virtualenv (see ``harness``), and is also the Celery app its workers import
(``celery -A celery_bench worker``). It starts its own ``redis-server`` (Debian's package) on
127.0.0.1 on a non-default port, without persistence, and stops it at the end. Workers are
``--pool solo`` processes (each fetches and runs its own tasks: for no-op tasks the fastest
pool), late acknowledgement (at-least-once, as ours and PgQueuer) and results ignored.
Throughput: N tasks are published (``apply_async`` from one client; its rate is reported apart,
as it is one client's, not Celery's) onto a queue no worker consumes yet; then every worker is told
to consume it (``add_consumer``), and the drain is timed from there until every task has started.
Delayed: tasks with ``eta`` spread evenly over the window; lag is the task's start minus its ETA.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import harness
from celery import Celery

REDIS_PORT = int(os.environ.get("BENCH_REDIS_PORT", "16379"))
PREFETCH = int(os.environ.get("BENCH_CELERY_PREFETCH", "64"))

app = Celery("bench", broker=f"redis://127.0.0.1:{REDIS_PORT}/0")
app.conf.update(
    task_ignore_result=True,
    task_acks_late=True,
    worker_prefetch_multiplier=PREFETCH,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
recorder = harness.Recorder(os.environ.get("BENCH_WORK_DIR", tempfile.gettempdir()))


@app.task(name="noop")
def noop(key: str, due_epoch: float) -> None:
    recorder.started(key, due_epoch)


def port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def start_redis(work_dir: str) -> subprocess.Popen[bytes]:
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server not found: apt-get install -y redis-server")
    if port_in_use(REDIS_PORT):
        raise SystemExit(f"port {REDIS_PORT} is taken; set BENCH_REDIS_PORT to a free one")
    redis: subprocess.Popen[bytes]
    (redis,) = harness.start(
        [
            [
                server,
                "--port",
                str(REDIS_PORT),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                work_dir,
                "--daemonize",
                "no",
            ]
        ]
    )
    harness.wait_until(lambda: port_in_use(REDIS_PORT), 20)
    return redis


def send(keys: list[str], dues: list[float], eta: bool, queue: str = "celery") -> None:
    with app.producer_or_acquire() as producer:
        for key, due in zip(keys, dues, strict=True):
            when = datetime.fromtimestamp(due, UTC) if eta else None
            noop.apply_async((key, due), eta=when, producer=producer, queue=queue)


def main() -> None:
    args = harness.arguments(__doc__.splitlines()[0])
    work_dir = tempfile.mkdtemp(prefix="celery-", dir=args.work_dir)
    redis = start_redis(work_dir)
    env = dict(os.environ) | {
        "BENCH_WORK_DIR": work_dir,
        "BENCH_REDIS_PORT": str(REDIS_PORT),
        "PYTHONPATH": str(Path(__file__).resolve().parent),
    }
    workers = []
    try:
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "celery_bench",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        # Workers first consume only a warm-up queue, so the throughput tasks wait in Redis.
        workers = harness.start(
            [[*command, "-Q", "warm", "-n", f"w{i}@bench"] for i in range(args.workers)], env
        )
        send([f"w{i}" for i in range(200)], [time.time()] * 200, eta=False, queue="warm")
        harness.wait_until(lambda: harness.count_starts(work_dir, "w") >= 200, 120)

        publish_started = time.monotonic()
        send([f"t{i}" for i in range(args.jobs)], [time.time()] * args.jobs, eta=False)
        enqueue_s = time.monotonic() - publish_started
        started = time.monotonic()
        app.control.add_consumer("celery")
        finished = harness.wait_until(lambda: harness.count_starts(work_dir, "t") >= args.jobs, 600)

        fires = max(1, round(args.rate * args.window))
        lead_s = 2.0 + fires / 700  # apply_async is about a millisecond a task here: leave it time
        opens = time.time() + lead_s
        send(
            [f"l{i}" for i in range(fires)], [opens + i * args.window / fires for i in range(fires)], eta=True
        )
        ahead_s = opens - time.time()
        harness.wait_until(
            lambda: harness.count_starts(work_dir, "l") >= fires, lead_s + args.window + 300, interval_s=0.2
        )
        harness.stop(workers)
        lag = harness.read_starts(work_dir, "l")
        harness.write(
            args.out,
            {
                "system": "celery",
                "config": f"{args.workers} x celery worker --pool solo, prefetch {PREFETCH}, acks_late, "
                "Redis broker, results ignored",
                "jobs": args.jobs,
                "jobs_done": harness.count_starts(work_dir, "t"),
                "seconds": finished - started,
                "enqueue_s": enqueue_s,
                "fires": fires,
                "lag_ms": harness.lag_ms(lag),
                "lag_duplicates": len(lag) - len({key for key, _, _ in lag}),
                "inserted_ahead_s": ahead_s,
            },
        )
    finally:
        harness.stop(workers)
        harness.stop([redis])


if __name__ == "__main__":
    main()
