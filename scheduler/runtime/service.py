"""The one lifecycle every long-running component has.

A :class:`Service` is a loop of :meth:`Service.step` calls: one unit of work each (a scan batch, a
relay batch, a polled batch of outcomes). The base class owns everything around the work, so that
every component behaves the same way:

1. It runs until the ``stop`` event is set, idling between steps when no work is waiting.
2. A transient failure (the service declares which exceptions are transient: PostgreSQL or Kafka
   unavailable) is retried with capped full-jitter exponential backoff (tenacity), and before each
   retry :meth:`Service.reset` drops the clients the failure may have broken, so the next step
   rebuilds them: a broken Kafka consumer or PostgreSQL connection is always rebuilt, never reused.
3. Any other exception ends the service; the process exits non-zero and its supervisor (``run
   all``, Kubernetes) restarts it. So does a transient failure that ``refusal`` (given by the
   composition root) says is a setting to fix rather than an outage to wait out: a URL
   PostgreSQL refuses for good before it ever answered the process. It ends the service with
   :class:`Refused`, whose message is the process's one error line.
4. Once stopped it drains (finishes in-flight work within its grace period) and closes.

The :class:`ServiceStatus` it keeps is what the health endpoints report: whether the loop is
turning, whether it has completed a first step, and the last failure.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_when_event_set,
    wait_random_exponential,
)

log = logging.getLogger(__name__)

BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 5.0
# An outage of an hour would otherwise log a warning every few seconds from every loop of every
# process: the first failures of a streak are each a warning, then one a minute (the rest DEBUG).
RETRY_WARNINGS = 3
RETRY_WARN_EVERY_S = 60.0


class Refused(Exception):
    """A dependency refused this process's settings for good; the message says which, and what to fix."""


#: Whether a transient failure is a setting to fix (its error line) rather than an outage (None).
Refusal = Callable[[BaseException], str | None]


class _Stopped(Exception):
    """Raised out of a backoff wait when ``stop`` is set during it: no further attempt may start."""


class ServiceStatus:
    """What the health endpoints read: written by the service's thread, read by the HTTP thread.

    Single attribute writes are atomic under the GIL and a reader only needs a recent value, so
    there is no lock.
    """

    def __init__(self) -> None:
        self.started_at = time.monotonic()
        self.last_turn = self.started_at
        self.stepped = False  # a first step done, or failed and retried: /startup
        self.started = False  # a first step completed: /ready
        self.stopping = False
        self.failures = 0  # consecutive transient failures
        self.last_error: str | None = None

    def turned(self) -> None:
        self.last_turn = time.monotonic()
        self.stepped = True

    def succeeded(self) -> None:
        self.turned()
        self.started = True
        self.failures = 0
        self.last_error = None

    def failed(self, error: BaseException) -> None:
        self.turned()
        self.failures += 1
        self.last_error = f"{type(error).__name__}: {error}".strip().splitlines()[0][:500]

    def seconds_since_turn(self) -> float:
        return time.monotonic() - self.last_turn


@dataclass(frozen=True)
class Check:
    """A dependency the service needs to be ready: ``probe`` raises when it does not answer, and
    returns a short detail otherwise. Probes run on the health server's thread, so they must use
    their own clients (never the service's) and bound their own time.

    ``stalls_steps``: a step can wait on this dependency for as long as it does not answer, its
    client having no bound of its own (PostgreSQL: see :meth:`Database.check`). While its probe
    fails, a loop that does not turn is waiting on it, which ``/live`` does not count as wedged."""

    name: str
    probe: Callable[[], str | None]
    stalls_steps: bool = False


class Service(ABC):
    """Base of every long-running component; see the module docstring for the lifecycle."""

    #: Exceptions that mean "a dependency failed, try again later", not "this is a bug".
    transient: tuple[type[BaseException], ...] = ()
    backoff_initial_s: float = BACKOFF_INITIAL_S
    backoff_max_s: float = BACKOFF_MAX_S

    def __init__(self, name: str) -> None:
        self.name = name
        self.status = ServiceStatus()
        self.log = logging.getLogger(f"scheduler.{name}")
        self._warned_at = 0.0  # when a retry was last logged as a warning
        self._unwarned = 0  # retries logged at DEBUG since then

    @abstractmethod
    def step(self) -> bool:
        """One unit of work; True when more work is waiting right now (so no idling)."""

    def idle(self, stop: threading.Event) -> None:
        """Wait for work: until a wake-up, a timeout, or ``stop``. The default polls every second."""
        stop.wait(1.0)

    def reset(self) -> None:
        """Drop the clients a transient failure may have broken; the next step rebuilds them."""
        return None

    def drain(self) -> None:
        """After ``stop``: finish in-flight work within the service's grace period."""
        return None

    def close(self) -> None:
        """Release every client; called once, last."""
        return None

    def checks(self) -> Sequence[Check]:
        """The dependencies ``/ready`` probes for this service."""
        return ()

    def seconds_since_turn(self) -> float:
        """How long the service has gone without turning, which ``/live`` holds to its timeout. A
        service with a loop of its own besides :meth:`step`'s (the worker's job loop, where
        handlers run) reports that one too: either one wedged is a process to restart."""
        return self.status.seconds_since_turn()

    def run(self, stop: threading.Event, refusal: Refusal | None = None) -> None:
        """Step until ``stop`` is set, retrying transient failures; then drain and close. A failure
        ``refusal`` words as a setting to fix raises :class:`Refused` instead of being retried."""

        def backoff(seconds: float) -> None:
            if stop.wait(seconds):
                raise _Stopped

        retrying = Retrying(
            retry=retry_if_exception_type(self.transient),
            wait=wait_random_exponential(multiplier=self.backoff_initial_s, max=self.backoff_max_s),
            stop=stop_when_event_set(stop),
            sleep=backoff,
            before_sleep=self._before_retry,
            reraise=True,
        )

        def step() -> bool:
            try:
                return self.step()
            except self.transient as error:
                why = None if refusal is None else refusal(error)
                if why is not None:
                    raise Refused(why) from error
                raise

        self.log.info("started")
        try:
            while not stop.is_set():
                try:
                    more = retrying(step)
                except _Stopped:
                    break  # stopped while backing off: not a failure of the service
                except self.transient:
                    if stop.is_set():
                        break  # stopped while backing off: not a failure of the service
                    raise
                if self.status.failures:
                    self.log.info("recovered after %d failed attempts", self.status.failures)
                    self._unwarned = 0
                self.status.succeeded()
                if not more and not stop.is_set():
                    try:
                        self.idle(stop)
                    except self.transient as error:
                        # A wake-up connection that broke while idle: the next step rebuilds
                        # it, and backs off there should the dependency still be down.
                        self.status.failed(error)
                        self.log.warning("%s while idle; rebuilding clients", self.status.last_error)
                        self.reset()
                    self.status.turned()
            self.status.stopping = True
            self.drain()
        finally:
            self.status.stopping = True
            self.close()
            self.log.info("stopped")

    def _warning_clock(self) -> float:
        """The clock that spaces retry warnings apart (a test's own, to cover a long outage)."""
        return time.monotonic()

    def _before_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if error is None:
            return
        self.status.failed(error)
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        now = self._warning_clock()
        if self.status.failures <= RETRY_WARNINGS or now - self._warned_at >= RETRY_WARN_EVERY_S:
            unwarned = (
                f" ({self._unwarned} more failed attempts since the last warning)" if self._unwarned else ""
            )
            self._warned_at, self._unwarned = now, 0
            level = logging.WARNING
        else:
            unwarned, level = "", logging.DEBUG
            self._unwarned += 1
        self.log.log(
            level,
            "%s (attempt %d); rebuilding clients and retrying in %.1f s%s",
            self.status.last_error,
            state.attempt_number,
            delay,
            unwarned,
        )
        try:
            self.reset()
        except Exception:
            # A client that fails to close is dropped all the same; the retry builds a new one.
            self.log.debug("reset after a failure raised", exc_info=True)
