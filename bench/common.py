"""What the benchmarks share: an isolated database and topic prefix on the local stack, the
components as processes, percentiles, and the results file."""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from scheduler.config import Settings, load_settings
from scheduler.devstack import LocalStack
from scheduler.kafka.transport import TopicAdmin
from scheduler.store import connect
from scheduler.store.migrate import migrate

RESULTS = Path(__file__).resolve().parent / "results"


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
    with psycopg.connect(base_url, autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
    url = base_url.rsplit("/", 1)[0] + f"/{name}"
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    settings = load_settings(env | {"SCHEDULER_DATABASE_URL": url, "SCHEDULER_TOPIC_PREFIX": prefix})
    with connect(url) as conn:
        migrate(conn)
    TopicAdmin(settings.kafka_bootstrap).ensure_topics(settings.core_topics, partitions=6)
    try:
        yield settings
    finally:
        with psycopg.connect(base_url, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')
        admin_client = TopicAdmin(settings.kafka_bootstrap)
        admin_client.delete_topics([t for t in admin_client.topics() if t.startswith(prefix + ".")])


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


@contextmanager
def running(
    commands: Sequence[Sequence[str]], env: dict[str, str]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "scheduler", "run", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for args in commands
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_until(condition: Any, timeout_s: float, interval_s: float = 0.05) -> float:
    """Poll until true; returns the monotonic time it became true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(interval_s)
    raise TimeoutError(f"not done within {timeout_s} s")


def percentiles(values_ms: Sequence[float]) -> dict[str, float]:
    if not values_ms:
        return {}
    ordered = sorted(values_ms)
    if len(ordered) == 1:
        return {"p50": ordered[0], "p90": ordered[0], "p99": ordered[0], "max": ordered[0]}
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
