"""The chaos run's faults: a seeded plan, and ``scheduler run all`` as the tree they are applied to.

The supervisor restarts a child that dies, as Kubernetes would. Its children are found from its
own output: the table it prints at start (``name  pid N  health and metrics on port P``) and its
log lines ``restarted NAME (pid N)`` and ``NAME (pid N) died: HOW``. A pid is signalled only while
it is alive and a child of this supervisor, so a reused pid is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ("scanner", "relay", "reconciler", "ingestor")
_TABLE_LINE = re.compile(r"^(?P<name>\S+)\s+pid (?P<pid>\d+)\s+health and metrics on port (?P<port>\d+)\s*$")
_RESTARTED = re.compile(r"^restarted (?P<name>\S+) \(pid (?P<pid>\d+)\)$")
_DIED = re.compile(r"^(?P<name>\S+) \(pid (?P<pid>\d+)\) died: (?P<how>.*?)(?:; restarting in .*)?$")
# Plain HTTP to 127.0.0.1, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Fault:
    """One fault of the plan; ``fired_at``/``restored_at`` (epoch seconds) once it happened."""

    at_s: float  # seconds after the jobs were created
    kind: str  # kill_worker | stop_worker | kill_component | kill_kafka | stop_postgres
    target: str | None = None  # the component of kill_component; a worker is picked when it fires
    hold_s: float = 0.0  # how long a stopped worker, Kafka or PostgreSQL stays down
    victim: str | None = None
    pid: int | None = None
    fired_at: float | None = None
    restored_at: float | None = None
    note: str = ""

    @property
    def ended_at(self) -> float | None:
        """When the fault was over: restored, or fired for a kill (the supervisor does the rest)."""
        return self.restored_at if self.hold_s else self.fired_at

    def as_dict(self, t0: float) -> dict[str, Any]:
        record = asdict(self)
        for name in ("fired_at", "restored_at"):
            if record[name] is not None:
                record[f"{name.removesuffix('_at')}_s"] = round(record[name] - t0, 2)
        return record


def plan_faults(
    duration_s: float,
    seed: int,
    *,
    kill_every_s: float,
    stop_s: float,
    kafka_down_s: float,
    pg_down_s: float,
) -> list[Fault]:
    """Every fault of a run, in time order: a worker killed every ``kill_every_s``; one worker
    stopped (SIGSTOP) for ``stop_s``; each pipeline component killed once; the broker killed for
    ``kafka_down_s`` and, after it is back, PostgreSQL stopped for ``pg_down_s``."""
    rng = random.Random(seed)
    faults = [Fault(t, "kill_worker") for t in _every(kill_every_s, duration_s)]
    faults.append(Fault(round(rng.uniform(0.03, 0.15) * duration_s, 2), "stop_worker", hold_s=stop_s))
    for name in PIPELINE:
        faults.append(Fault(round(rng.uniform(0.05, 0.9) * duration_s, 2), "kill_component", name))
    kafka_at = round(rng.uniform(0.2, 0.3) * duration_s, 2)
    faults.append(Fault(kafka_at, "kill_kafka", hold_s=kafka_down_s))
    pg_at = max(kafka_at + kafka_down_s + 5, round(rng.uniform(0.6, 0.7) * duration_s, 2))
    faults.append(Fault(pg_at, "stop_postgres", hold_s=pg_down_s))
    return sorted(faults, key=lambda f: f.at_s)


def _every(step: float, until: float) -> list[float]:
    times, t = [], step
    while t < until:
        times.append(round(t, 2))
        t += step
    return times


@dataclass(frozen=True)
class Death:
    name: str
    pid: int
    how: str
    at: float  # epoch seconds


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def http_get(port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """``GET http://127.0.0.1:<port><path>``: its status (0 when nothing answered) and body."""
    try:
        with _OPENER.open(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


@dataclass
class Supervised:
    """``scheduler run all`` in a process group of its own, its output in two files."""

    argv: Sequence[str]
    env: Mapping[str, str]
    log_dir: Path
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    deaths: list[Death] = field(default_factory=list)
    restarts: list[Death] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.out_path = self.log_dir / "supervisor.out"
        self.err_path = self.log_dir / "supervisor.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                list(self.argv), env=dict(self.env), stdout=out, stderr=err, cwd=ROOT, start_new_session=True
            )
        self._read = 0
        self._partial = b""

    def table(self, count: int, timeout_s: float) -> None:
        """Wait for the ``count`` lines of the start table; fills ``pids`` and ``ports``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"run all exited {self.proc.returncode}: {self.err_tail()}")
            rows = [m for line in self.out_path.read_text().splitlines() if (m := _TABLE_LINE.match(line))]
            if len(rows) >= count:
                for m in rows:
                    self.pids[m["name"]] = int(m["pid"])
                    self.ports[m["name"]] = int(m["port"])
                return
            time.sleep(0.2)
        raise RuntimeError(f"run all printed no table of {count} children in {timeout_s:.0f} s")

    def err_tail(self, chars: int = 3000) -> str:
        return self.err_path.read_text(errors="replace")[-chars:]

    def refresh(self) -> None:
        """Read the supervisor's new log lines: who died, who was restarted with which pid."""
        with self.err_path.open("rb") as err:
            err.seek(self._read)
            chunk = err.read()
        self._read += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(record, dict) or record.get("component") != "supervisor":
                continue
            message = str(record.get("message", ""))
            at = _epoch(record.get("timestamp"))
            if m := _RESTARTED.match(message):
                self.pids[m["name"]] = int(m["pid"])
                self.restarts.append(Death(m["name"], int(m["pid"]), "restarted", at))
            elif m := _DIED.match(message):
                self.deaths.append(Death(m["name"], int(m["pid"]), m["how"], at))

    def alive_child(self, name: str) -> int | None:
        """The pid of ``name`` if it runs now as this supervisor's child."""
        pid = self.pids.get(name)
        if pid is None:
            return None
        fields = _stat(pid)
        if fields is None or fields[0] == "Z" or int(fields[1]) != self.proc.pid:
            return None
        return pid

    def signal_child(self, name: str, signum: int) -> int | None:
        """Send ``signum`` to ``name`` if it is alive and ours; the pid signalled."""
        pid = self.alive_child(name)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
                return pid
        return None

    def stop(self, timeout_s: float = 90.0) -> int | None:
        """SIGTERM, as a service manager would; its exit status (None if it outlived the wait)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill_leftovers(self) -> list[int]:
        """SIGKILL whatever of this process group still runs (nothing after a clean stop)."""
        members = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                fields = _stat(int(entry.name))
                if fields is not None and fields[0] != "Z" and int(fields[2]) == self.proc.pid:
                    members.append(int(entry.name))
        if members:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)
        return members


def _epoch(stamp: object) -> float:
    if isinstance(stamp, str):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return time.time()
