"""Runs several components as child processes, for ``scheduler run all`` and ``make run``.

Each component is a process of its own (they scale and fail independently, and use both cores).
A child that dies on its own is logged with its name and exit status and restarted with capped
full-jitter backoff; the others go on, since each component recovers from the others' absence
(that is what the outbox and the consumer groups are for). A child it has not heard from (each
writes a byte a second down a pipe it reads) is frozen whole, and is killed and restarted the same
way. Ctrl-C or SIGTERM stops every child: SIGTERM first, SIGKILL for whatever outlives the grace
period.

When a base metrics port is given, the children get consecutive ports starting at it, in the
order the table printed at start shows; children added later (``run all``'s workers, for the apps
PostgreSQL lists once it answers, when it did not at start, and for those created while it runs)
get the next ports, and lines of the table in its columns (their names fit the width the caller
reserves for them). Each worker child gets a static group membership identity
(``SCHEDULER_GROUP_INSTANCE_ID``) that it keeps across its restarts.
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from signal import SIGTERM
from typing import Any

from scheduler.runtime.process import HEARTBEAT_ENV, SUPERVISOR_ENV, stop_signals

log = logging.getLogger("scheduler.supervisor")

RESTART_INITIAL_S = 0.5
RESTART_MAX_S = 10.0
# A child that ran this long before dying starts its backoff afresh: it was not crash-looping.
STABLE_AFTER_S = 60.0
DEFAULT_GRACE_S = 40.0
PIPELINE = ("scanner", "relay", "reconciler", "ingestor")
GROUP_INSTANCE_ENV = "SCHEDULER_GROUP_INSTANCE_ID"
# A child silent this long after its first heartbeat is frozen (as a liveness probe's three
# failures ten seconds apart would judge); before its first, it may take as long as a Kubernetes
# startup probe allows (imports, and building clients on a loaded machine).
SILENT_S = 30.0
STARTUP_SILENT_S = 300.0
# Longer than this between two watches (each 0.1 s apart, after the caller's tick), and the
# supervisor itself was paused.
PAUSE_S = 1.0
# The digits of the largest pid Linux gives (pid_max is at most 2^22): the table's pid column, so that
# a child started or added later lines up with the others whatever its pid.
PID_WIDTH = 7


@dataclass(frozen=True)
class ChildSpec:
    """A component to run: its name in logs, and its arguments after ``scheduler run``."""

    name: str
    args: tuple[str, ...]


def pipeline_children(
    apps: Sequence[str], workers: int, concurrency: int, handlers: Sequence[str] = (), api: bool = False
) -> list[ChildSpec]:
    """Every component of the pipeline, with ``workers`` worker processes for each app, each
    running the builtins and ``handlers`` (besides what SCHEDULER_HANDLERS registers), and the API
    when ``api``."""
    children = [ChildSpec(name, (name,)) for name in (*PIPELINE, *(("api",) if api else ()))]
    return children + worker_children(apps, workers, concurrency, handlers)


def worker_children(
    apps: Sequence[str], workers: int, concurrency: int, handlers: Sequence[str] = ()
) -> list[ChildSpec]:
    """The worker processes of :func:`pipeline_children`: ``workers`` for each app."""
    children = []
    registered = tuple(arg for handler in handlers for arg in ("--handler", handler))
    for app in apps:
        for index in range(1, workers + 1):
            suffix = f"-{index}" if workers > 1 else ""
            children.append(
                ChildSpec(
                    f"worker-{app}{suffix}",
                    ("worker", "--app", app, "--concurrency", str(concurrency), *registered),
                )
            )
    return children


def group_instance_id(spec: ChildSpec, base: str | None = None) -> str | None:
    """The static group membership identity of a worker child: the same across its restarts (so
    it takes its partitions back without a rebalance of the whole group) and unique among every
    supervisor's children (two live members with one identity fence each other). ``base`` is the
    operator's ``SCHEDULER_GROUP_INSTANCE_ID`` (stable across supervisor restarts too, as a pod
    name is), else this host and supervisor."""
    if spec.args[:1] != ("worker",):
        return None
    base = base or f"{socket.gethostname()}-{os.getpid()}"
    return re.sub(r"[^a-zA-Z0-9._-]", "-", f"{base}-{spec.name}")[:249]


def component_argv(args: Sequence[str], metrics_port: int | None = None) -> list[str]:
    port = [] if metrics_port is None else ["--metrics-port", str(metrics_port)]
    return [sys.executable, "-m", "scheduler", "run", *args, *port]


def stop_processes(procs: Sequence[subprocess.Popen[Any]], grace_s: float, *, signal: bool = True) -> None:
    """SIGTERM every process still running (unless ``signal`` is False: they have been told), then
    SIGKILL whatever outlives the grace period.

    One SIGTERM each, never two: a second one that arrives while a child's interpreter is shutting
    down (its handlers back to the default) kills it, which looks like a crash.
    """
    if signal:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


@dataclass
class _Child:
    spec: ChildSpec
    port: int | None
    proc: subprocess.Popen[Any] | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    signalled: bool = False  # told to stop: it gets one SIGTERM, never a second
    heartbeat: int | None = None  # the read end of the pipe it writes a byte a second down
    heard: bool = False  # a byte came down its pipe since its start
    silent_since: float = 0.0  # since when it has said nothing (its start, or its last byte)
    killed: bool = False  # killed for its silence: reaped and restarted by the next watch


class Supervisor:
    def __init__(
        self,
        children: Sequence[ChildSpec],
        *,
        metrics_port: int | None = None,
        env: Mapping[str, str] | None = None,
        tick: Callable[[], None] | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        echo: Callable[[str], None] = lambda line: print(line, flush=True),
        silent_s: float = SILENT_S,
        startup_silent_s: float = STARTUP_SILENT_S,
        name_width: int = 0,
    ) -> None:
        """``name_width``: the least width of the table's name column, that of the longest name a
        child :meth:`add` starts later may have, so that its line keeps the table's columns."""
        self._metrics_port = metrics_port
        self._children = [
            _Child(spec, None if metrics_port is None else metrics_port + index)
            for index, spec in enumerate(children)
        ]
        self._width = max([name_width, *(len(spec.name) for spec in children)])  # of the table's names
        self._env = None if env is None else dict(env)
        self._tick = tick
        self._grace_s = grace_s
        self._echo = echo
        self._silent_s = silent_s
        self._startup_silent_s = startup_silent_s
        self._stopping = False
        self._watched_at: float | None = None
        self._received = 0  # the signal that stopped it, noted by the handler
        self._code = 0  # what run returns when it stopped itself (stop), no signal before

    def _start(self, child: _Child) -> None:
        env = dict(os.environ if self._env is None else self._env)
        env[SUPERVISOR_ENV] = str(os.getpid())  # the child stops when this process dies
        identity = group_instance_id(child.spec, env.get(GROUP_INSTANCE_ENV))
        if identity is not None:
            env[GROUP_INSTANCE_ENV] = identity
        self._close_heartbeat(child)
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        env[HEARTBEAT_ENV] = str(write_end)
        try:
            argv = component_argv(child.spec.args, child.port)
            child.proc = subprocess.Popen(argv, env=env, pass_fds=(write_end,))
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)  # the child's alone: its exit then reads as the end of the pipe
        child.heartbeat = read_end
        child.heard = False
        child.started_at = child.silent_since = time.monotonic()
        child.restart_at = None
        child.signalled = False
        child.killed = False

    @staticmethod
    def _close_heartbeat(child: _Child) -> None:
        if child.heartbeat is not None:
            os.close(child.heartbeat)
            child.heartbeat = None

    @staticmethod
    def _heard(child: _Child) -> bool:
        """Whether the child wrote down its pipe since the last look (read to empty)."""
        heard = False
        while child.heartbeat is not None:
            try:
                data = os.read(child.heartbeat, 4096)
            except BlockingIOError:
                break
            if not data:
                break  # it closed its end, or exited: its exit is seen by poll
            heard = True
        return heard

    def _kill_if_silent(self, child: _Child, now: float) -> None:
        """SIGKILL a running child that has not been heard from: frozen whole, it can neither serve
        nor stop, and a SIGTERM would wait on it. Its death is then seen, and restarted, as any."""
        assert child.proc is not None
        if self._heard(child):
            child.heard, child.silent_since = True, now
        if child.killed:
            return
        limit = self._silent_s if child.heard else self._startup_silent_s
        if now - child.silent_since < limit:
            return
        log.error(
            "%s (pid %d) has not been heard from for %.0f s (frozen: stopped, or stuck in a call that "
            "holds the interpreter); killing it",
            child.spec.name,
            child.proc.pid,
            now - child.silent_since,
        )
        child.killed = True
        child.proc.kill()

    def _stop_all(self, signum: int = 0, _frame: object = None) -> None:
        """The signal handler. It runs between two bytecodes of the main thread, which may be in
        the middle of logging, so it does not log (the main loop does): it notes the stop and
        signals the children at once, which takes no lock that could wait (a child's poll only
        tries its lock), so a stop never waits for the loop's ``tick``. A second Ctrl-C changes
        nothing: each child gets one SIGTERM."""
        if not self._stopping and signum:
            self._received = signum
        self._stopping = True
        self._signal_children()

    def _signal_children(self) -> None:
        for child in self._children:
            if child.proc is not None and child.proc.poll() is None and not child.signalled:
                child.signalled = True
                child.proc.send_signal(signal.SIGTERM)
                # A child stopped by SIGSTOP would hold its SIGTERM until its grace period ran out
                # and it was killed: woken, it stops as the others do.
                child.proc.send_signal(signal.SIGCONT)

    def _stopped_cleanly(self, child: _Child) -> bool:
        if child.proc is None:
            return True  # never started: stopped before its turn
        code = child.proc.returncode
        # Killed by the SIGTERM we sent before it had installed its handler: a stop, not a crash.
        return code == 0 or (child.signalled and code == -signal.SIGTERM)

    def run(self) -> int:
        """Until Ctrl-C or SIGTERM; 0 when every child stopped cleanly at the end."""
        for signum in stop_signals():
            signal.signal(signum, self._stop_all)
        for child in self._children:
            if self._stopping:
                break  # a stop during start-up: the rest are not started at all
            self._start(child)
            self._echo_started(child)
        try:
            while not self._stopping:
                self._watch()
                if self._tick is not None and not self._stopping:
                    self._tick()
                time.sleep(0.1)
        finally:
            self._stopping = True
            if self._received:
                log.info("received %s, stopping every component", signal.Signals(self._received).name)
            self._signal_children()  # also any started after the signal arrived
            stop_processes(
                [c.proc for c in self._children if c.proc is not None], self._grace_s, signal=False
            )
            for child in self._children:
                self._close_heartbeat(child)
        failed = [c for c in self._children if not self._stopped_cleanly(c)]
        for child in failed:
            assert child.proc is not None
            log.error("%s stopped with %s", child.spec.name, describe_exit(child.proc.returncode))
        if self._code and not self._received:
            return self._code
        return 1 if failed else 0

    @property
    def next_port(self) -> int | None:
        """The metrics port :meth:`add` gives the first child it starts."""
        return None if self._metrics_port is None else self._metrics_port + len(self._children)

    @property
    def stopping(self) -> bool:
        """Whether it is stopping: a signal came, or :meth:`stop` was called."""
        return self._stopping

    def stop(self, code: int = 0) -> None:
        """Stop every child, as a signal does, and return ``code`` from :meth:`run` (from ``tick``:
        the caller's own reason to stop). A signal that came first keeps its exit status: the
        stop was the operator's, whatever ``tick`` was doing when it came."""
        if self._stopping:
            return
        # The handler runs between two bytecodes: one that comes after the check above has noted
        # itself (stopping was not yet set), and its exit status wins.
        self._code = code
        self._stop_all()

    def add(self, children: Sequence[ChildSpec]) -> None:
        """Start more children while running (from ``tick``: ``run all``'s workers for the apps
        PostgreSQL lists later), on the ports after those of the children before them."""
        for spec in children:
            if self._stopping:
                return
            child = _Child(spec, self.next_port)
            self._start(child)
            self._children.append(child)
            self._echo_started(child)

    def _echo_started(self, child: _Child) -> None:
        """The child's line of the table printed at start (or of a child added later, in its columns)."""
        assert child.proc is not None
        pid = str(child.proc.pid)
        if child.port is not None:
            pid = f"{pid:<{PID_WIDTH}}  health and metrics on port {child.port}"
        self._echo(f"{child.spec.name:<{self._width}}  pid {pid}")

    def _watch(self) -> None:
        now = time.monotonic()
        # The supervisor was not running itself (stopped with its children by Ctrl-Z, or frozen with
        # them in one cgroup): their silence over that time says nothing of them, so it is not held
        # against them, and on waking they have the whole allowance again to be heard.
        since_last = 0.0 if self._watched_at is None else now - self._watched_at
        self._watched_at = now
        if since_last > PAUSE_S:
            for child in self._children:
                child.silent_since += since_last
        for child in self._children:
            if child.restart_at is not None:
                if now >= child.restart_at and not self._stopping:
                    self._start(child)
                    assert child.proc is not None
                    log.info("restarted %s (pid %d)", child.spec.name, child.proc.pid)
                continue
            assert child.proc is not None
            code = child.proc.poll()
            if self._stopping:
                continue
            if code is None:
                self._kill_if_silent(child, now)
                continue
            if now - child.started_at >= STABLE_AFTER_S:
                child.failures = 0
            delay = random.uniform(0, min(RESTART_MAX_S, RESTART_INITIAL_S * 2**child.failures))
            child.failures += 1
            child.restart_at = now + delay
            if code == 0:
                # Stopped cleanly by someone else's SIGTERM (or its own end): not a crash, though
                # the pipeline needs it back all the same.
                log.warning(
                    "%s (pid %d) stopped on its own (exit status 0); restarting in %.1f s",
                    child.spec.name,
                    child.proc.pid,
                    delay,
                )
            else:
                log.error(
                    "%s (pid %d) died: %s; restarting in %.1f s",
                    child.spec.name,
                    child.proc.pid,
                    describe_exit(code),
                    delay,
                )
