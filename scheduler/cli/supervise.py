"""Runs several ``scheduler run <component>`` processes as one, for ``run all`` and ``make run``.

Each component is a process of its own (they scale and fail independently, and use both cores);
the supervisor forwards Ctrl-C and SIGTERM to all of them, waits, and exits non-zero if any
component failed. If one component dies on its own, the others are stopped too: a half pipeline
that looks alive is worse than a stopped one.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def pipeline_commands(apps: Sequence[str], workers: int, concurrency: int) -> list[list[str]]:
    """Every component of the pipeline, with ``workers`` worker processes for each app."""
    commands = [["scanner"], ["relay"], ["reconciler"], ["ingestor"]]
    for app in apps:
        commands += [["worker", "--app", app, "--concurrency", str(concurrency)]] * workers
    return commands


def stop_processes(procs: Sequence[subprocess.Popen[Any]], grace_s: float) -> None:
    """SIGTERM every process still running, then SIGKILL whatever outlives the grace period."""
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


def component_argv(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "scheduler", "run", *args]


def supervise(
    commands: list[list[str]], tick: Callable[[], None] | None = None, grace_s: float = 40.0
) -> int:
    procs = [subprocess.Popen(component_argv(args)) for args in commands]
    stopping = False

    def stop_all(_signum: int = 0, _frame: object = None) -> None:
        nonlocal stopping
        stopping = True
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    try:
        while any(proc.poll() is None for proc in procs):
            if not stopping and any(proc.poll() is not None for proc in procs):
                stop_all()
            if tick is not None and not stopping:
                tick()
            time.sleep(0.2)
    finally:
        stop_processes(procs, grace_s)
    return 0 if all(proc.returncode == 0 for proc in procs) else 1
