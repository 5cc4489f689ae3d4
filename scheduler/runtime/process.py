"""One component process: its services, signals, logs, traces and health endpoints.

``scheduler run <component>`` builds the component's services in the composition root and hands
them here. Each service runs in a thread of its own; the main thread only waits. SIGTERM or
Ctrl-C sets the shared stop event, and every service drains and closes within its grace period;
a service that dies of a non-transient error stops the others and the process exits 1, so that
its supervisor restarts it whole.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge

from scheduler import __version__
from scheduler.runtime.health import LIVE_TIMEOUT_S, Health, HealthServer
from scheduler.runtime.service import Refusal, Refused, Service

log = logging.getLogger("scheduler.process")

# After the grace period the process exits even if a thread (a handler that ignores cancellation)
# does not: a stop that never ends is worse than an unfinished job, which is redelivered.
EXIT_MARGIN_S = 5.0
# How soon the main thread notices a signal (see run_component's handler).
SIGNAL_POLL_S = 0.1
# How often a component checks that it is live, or waits on an outage (see run_component).
LIVE_CHECK_S = 1.0


SUPERVISOR_ENV = "SCHEDULER_SUPERVISOR_PID"
"""Set by ``run all`` on its children: the pid whose death stops them (see :func:`stop_with_supervisor`)."""
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

HEARTBEAT_ENV = "SCHEDULER_HEARTBEAT_FD"
"""Set by ``run all`` on its children: the pipe down which each says it runs (see :class:`Heartbeat`)."""
HEARTBEAT_S = 1.0


class Heartbeat:
    """Under ``run all``, a byte a second down a pipe the supervisor reads. A process frozen whole
    (stopped by SIGSTOP or a cgroup freezer, or in a C call that never lets go of the interpreter)
    cannot notice that it is not live, as a wedged loop is noticed: the supervisor kills a child it
    has not heard from instead. Elsewhere (a component run on its own) it does nothing."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._next = 0.0
        # Taken out of the environment: a process this one starts (a handler's) is not run all's child.
        value = os.environ.pop(HEARTBEAT_ENV, "")
        fd = int(value) if value.isascii() and value.isdigit() else -1
        if fd <= 2:
            return  # not run all's: set by hand, or naming stdin, stdout or stderr (a pipe in a container)
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return  # the variable set by hand, naming some other file
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        except (OSError, OverflowError):
            return  # not open, or no file descriptor at all: the variable set by hand
        self._fd = fd

    def beat(self) -> None:
        if self._fd is None or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + HEARTBEAT_S
        try:
            os.write(self._fd, b".")
        except BlockingIOError:
            pass  # the pipe is full: the supervisor has bytes enough to read
        except OSError:
            self._fd = None  # the supervisor is gone (its death stops this process anyway)


def stop_with_supervisor(stop: signal.Signals = signal.SIGTERM) -> None:
    """Under ``run all``, have the kernel send ``stop`` when the supervisor dies, however it dies:
    a supervisor killed by SIGKILL (or the OOM killer) could not stop its children, which then
    held their ports, and a restarted ``run all`` refused to start. Linux only; elsewhere a no-op."""
    # Taken out of the environment: a process this one starts (a handler's) is not run all's child.
    supervisor = os.environ.pop(SUPERVISOR_ENV, "")
    if not supervisor.isdigit() or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(stop), 0, 0, 0) != 0:
        log.warning("cannot ask to be stopped with the supervisor: errno %d", ctypes.get_errno())
        return
    if os.getppid() != int(supervisor):
        # The supervisor died before the request was made: nothing will send it now.
        os.kill(os.getpid(), stop)


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop a component or ``run all`` cleanly: SIGTERM, SIGINT, and SIGHUP (a
    closed terminal, a service manager's hang-up) unless it is ignored, as ``nohup`` asks."""
    hang_up = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGTERM, signal.SIGINT, *hang_up)


def build_info(registry: CollectorRegistry, component: str) -> None:
    try:
        info = Gauge(
            "scheduler_build_info", "The running version", ["component", "version"], registry=registry
        )
    except ValueError:
        return  # registered by an earlier run in this process (tests)
    info.labels(component, __version__).set(1)


def run_component(
    component: str,
    services: Sequence[Service],
    registry: CollectorRegistry,
    *,
    metrics_port: int | None,
    metrics_host: str = "0.0.0.0",
    grace_s: float = 30.0,
    live_timeout_s: float = LIVE_TIMEOUT_S,
    refusal: Refusal | None = None,
) -> int:
    """Run ``services`` until a signal (0) or a service's failure (1). ``refusal`` tells a
    dependency refusing the settings for good from an outage (see :class:`Service`): the one
    error line, then exit 1 (not under ``run all``, whose own line it is).

    Under ``run all`` a process that stops being live (a service loop wedged past
    ``live_timeout_s``, as ``/live`` judges it) stops itself and exits 1, so that the supervisor,
    which watches only for exits, restarts it as a liveness probe would have.

    A loop that has not turned for ``live_timeout_s`` because it waits on a dependency that does
    not answer (a PostgreSQL that stopped answering holds its statement: see ``Check``) is not
    wedged: the process says so once, a warning naming the dependency, and once more when the loop
    turns again. Nothing else would: the loop neither fails nor retries while it waits.
    """
    stop = threading.Event()
    # The handler only notes the signal: it runs on the main thread between two of its bytecodes,
    # and setting the event there takes the event's lock, which the main thread may be holding in
    # its own wait at that moment; the process then waits for itself forever. The main loop below
    # sets the event instead.
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    for signum in stop_signals():
        signal.signal(signum, on_signal)
    supervised = os.environ.get(SUPERVISOR_ENV, "").isdigit()
    if supervised:
        # run all asks PostgreSQL itself, says a refusal once and stops every component: each one
        # dying of it would only be restarted, with a line each time, until then.
        refusal = None
    heartbeat = Heartbeat()
    stop_with_supervisor()  # after the handlers: the supervisor's death is then a clean stop
    build_info(registry, component)
    health = Health(component, services, registry, live_timeout_s=live_timeout_s)
    server: HealthServer | None = None
    if metrics_port is not None:
        server = HealthServer(health, metrics_port, metrics_host)
        server.start()
        log.info("health and metrics on port %d", server.port)

    failed: list[str] = []
    refused: set[str] = set()  # each refusal's line, said once though several services meet it
    refused_lock = threading.Lock()

    def guarded(service: Service) -> None:
        try:
            service.run(stop, refusal)
        except Refused as exc:
            with refused_lock:
                if str(exc) not in refused:
                    refused.add(str(exc))
                    log.error("%s", exc)  # a setting to fix: its one line says which, no traceback
            failed.append(service.name)
            stop.set()
        except Exception:
            log.exception("service %s failed", service.name)
            failed.append(service.name)
            stop.set()

    # What start-up built (modules, clients, wiring) lives as long as the process: moved out of the
    # cycle collector's reach, a full collection no longer walks it, which paused a worker's job
    # loop for tens of milliseconds each time. Garbage is collected first, so none of it is kept;
    # a start-up object that becomes cyclic garbage later is never freed, at most once each.
    gc.collect()
    gc.freeze()
    threads = [threading.Thread(target=guarded, args=(s,), name=s.name, daemon=True) for s in services]
    for thread in threads:
        thread.start()
    next_live_check = time.monotonic() + LIVE_CHECK_S
    said_waiting: set[str] = set()  # the loops whose wait on an outage was said, until they turn
    while not stop.is_set() and not received and any(t.is_alive() for t in threads):
        stop.wait(SIGNAL_POLL_S)
        heartbeat.beat()
        if time.monotonic() >= next_live_check:
            next_live_check = time.monotonic() + LIVE_CHECK_S
            wedged, waiting = health.overdue()
            for name, (dependency, probe) in waiting.items():
                if name not in said_waiting:
                    said_waiting.add(name)
                    log.warning(
                        "%s has not turned for %.0f s: it waits on %s, which does not answer (%s); "
                        "not ready, and live, until it answers",
                        name,
                        live_timeout_s,
                        dependency,
                        probe.detail,
                    )
            for name in sorted(said_waiting - set(waiting) - set(wedged)):
                said_waiting.discard(name)
                log.info("%s turned again", name)
            if supervised and wedged:
                log.error(
                    "not live: %s has not turned for %.0f s; stopping, for run all to restart the process",
                    " and ".join(wedged),
                    live_timeout_s,
                )
                failed.append("liveness")
                stop.set()
    if received:
        log.info("received %s, stopping", signal.Signals(received[0]).name)
    stop.set()
    deadline = time.monotonic() + grace_s + EXIT_MARGIN_S
    for thread in threads:
        # Still heard from while it drains: a worker's grace period outlasts the supervisor's patience.
        while thread.is_alive() and time.monotonic() < deadline:
            heartbeat.beat()
            thread.join(min(HEARTBEAT_S, max(0.0, deadline - time.monotonic())))
    stuck = [t.name for t in threads if t.is_alive()]
    if server is not None:
        server.close()
    if stuck:
        log.error("services %s did not stop within the grace period; exiting anyway", stuck)
        logging.shutdown()
        os._exit(1)
    return 1 if failed else 0
