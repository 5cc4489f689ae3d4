"""What the peer benchmarks share. They run in the peers' virtualenv, as scripts, so they import
nothing from the project: each one starts its workers, runs a throughput phase and a delayed-job
phase, and writes its raw figures as JSON for ``bench/compare.py`` to summarise.

Every worker process appends one line per job it starts to its own file:
``<key> <due epoch> <start epoch>``, where the key's first letter names the phase
(``w`` warm-up, ``t`` throughput, ``l`` lag). Both epochs come from the same machine's clock.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO


class Recorder:
    """One process's start records, written as they happen (line-buffered)."""

    def __init__(self, out_dir: str | Path) -> None:
        self._path = Path(out_dir) / f"starts-{os.getpid()}.txt"
        self._file: TextIO | None = None

    def started(self, key: str, due_epoch: float) -> None:
        now = time.time()
        if self._file is None:
            self._file = self._path.open("a", buffering=1)
        self._file.write(f"{key} {due_epoch:.6f} {now:.6f}\n")


def read_starts(out_dir: str | Path, phase: str) -> list[tuple[str, float, float]]:
    starts = []
    for path in Path(out_dir).glob("starts-*.txt"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].startswith(phase):
                starts.append((parts[0], float(parts[1]), float(parts[2])))
    return starts


def count_starts(out_dir: str | Path, phase: str) -> int:
    return len({key for key, _, _ in read_starts(out_dir, phase)})


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(interval_s)
    raise TimeoutError(f"not done within {timeout_s} s")


def start(
    commands: Sequence[Sequence[str]], env: dict[str, str] | None = None
) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            list(command),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for command in commands
    ]


def stop(procs: Sequence[subprocess.Popen[bytes]], grace_s: float = 20) -> None:
    """SIGTERM each process we started, then SIGKILL what is left after the grace period."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def lag_ms(starts: list[tuple[str, float, float]]) -> list[float]:
    return [(started - due) * 1000 for _, due, started in starts]


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--jobs", type=int, default=10_000, help="no-op jobs for the throughput phase")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--rate", type=int, default=1000, help="delayed jobs due per second")
    parser.add_argument("--window", type=float, default=10.0, help="seconds the delayed jobs are spread over")
    parser.add_argument("--out", required=True, help="where to write the JSON figures")
    parser.add_argument("--work-dir", required=True, help="a scratch folder for the workers' records")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_known_args()[0]


def write(path: str | Path, figures: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(figures))
