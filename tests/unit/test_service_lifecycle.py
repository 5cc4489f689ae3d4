"""The one lifecycle of every component (``scheduler.runtime.service``), attacked from outside.

Every test drives a scripted :class:`Service` subclass: each ``step`` call pops the next action of
its script (raise a transient error, raise a fatal one, report more work, report none, set stop).
Nothing here touches PostgreSQL or Kafka, and nothing waits a fixed time: a test that needs the
service to reach a state polls for it with a deadline.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from scheduler.runtime.service import Refused, Service, ServiceStatus
from tests.support import wait_for


class Transient(Exception):
    """A dependency that failed: the service declares it retryable."""


class TransientChild(Transient):
    """A subclass of a declared transient error is transient too."""


class Fatal(Exception):
    """A bug: never retried."""


Action = Callable[["Scripted", threading.Event], bool]


def fail(message: str = "dependency down") -> Action:
    def action(_service: Scripted, _stop: threading.Event) -> bool:
        raise Transient(message)

    return action


def crash(message: str = "a bug") -> Action:
    def action(_service: Scripted, _stop: threading.Event) -> bool:
        raise Fatal(message)

    return action


def more(_service: Scripted, _stop: threading.Event) -> bool:
    return True


def nothing(_service: Scripted, _stop: threading.Event) -> bool:
    return False


def stop_then(result: bool) -> Action:
    def action(_service: Scripted, stop: threading.Event) -> bool:
        stop.set()
        return result

    return action


@dataclass(frozen=True)
class StepSeen:
    """What a step observed of the status when it was called."""

    started: bool
    failures: int
    last_error: str | None
    stop_was_set: bool


@dataclass
class Journal:
    events: list[str] = field(default_factory=list)
    steps: list[StepSeen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, event: str) -> None:
        with self.lock:
            self.events.append(event)

    def count(self, event: str) -> int:
        with self.lock:
            return self.events.count(event)


class Scripted(Service):
    """Steps through ``script``; once it is exhausted, every further step runs ``then``."""

    transient = (Transient,)
    backoff_initial_s = 0.001
    backoff_max_s = 0.004

    def __init__(
        self,
        script: list[Action],
        then: Action | None = None,
        *,
        stop: threading.Event,
        reset_raises: bool = False,
        drain_raises: bool = False,
    ) -> None:
        super().__init__("scripted")
        self.script = list(script)
        self.then = then
        self.stop = stop
        self.journal = Journal()
        self.reset_raises = reset_raises
        self.drain_raises = drain_raises

    def step(self) -> bool:
        st = self.status
        self.journal.steps.append(StepSeen(st.started, st.failures, st.last_error, self.stop.is_set()))
        self.journal.add("step")
        if self.script:
            return self.script.pop(0)(self, self.stop)
        if self.then is None:
            raise AssertionError("the script ran out and the service was not stopped")
        return self.then(self, self.stop)

    def idle(self, stop: threading.Event) -> None:
        self.journal.add("idle")

    def reset(self) -> None:
        self.journal.add("reset")
        if self.reset_raises:
            raise RuntimeError("closing the broken client failed too")

    def drain(self) -> None:
        self.journal.add("drain")
        if self.drain_raises:
            raise RuntimeError("drain failed")

    def close(self) -> None:
        self.journal.add("close")


class RecordingEvent(threading.Event):
    """A stop event that records every timed wait on it (the backoff sleeps go through it)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.waits.append(timeout)
        return super().wait(timeout)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    wait_for(condition, timeout, what, interval_s=0.002)


@dataclass
class Runner:
    """Runs a service's ``run`` in a thread and keeps what it raised."""

    service: Service
    stop: threading.Event
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> Runner:
        def target() -> None:
            try:
                self.service.run(self.stop)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()
        return self

    def join(self, timeout: float) -> float:
        """Seconds it took to end; fails when it did not end within ``timeout``."""
        assert self.thread is not None
        started = time.monotonic()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"run() did not end within {timeout} s"
        return time.monotonic() - started


@pytest.fixture
def runners() -> Iterator[list[Runner]]:
    started: list[Runner] = []
    yield started
    for runner in started:  # never leave a looping thread behind a failed test
        runner.stop.set()
        if runner.thread is not None:
            runner.thread.join(5)


# Retries ------------------------------------------------------------------------------------------


def test_transient_failures_are_retried_with_a_reset_before_each_retry() -> None:
    stop = threading.Event()
    service = Scripted([fail("pg down 1"), fail("pg down 2"), fail("pg down 3"), stop_then(True)], stop=stop)

    service.run(stop)

    assert service.journal.events == [
        *["step", "reset"] * 3,
        "step",
        "drain",
        "close",
    ]


def test_failures_count_up_while_failing_and_reset_after_a_success() -> None:
    stop = threading.Event()
    service = Scripted(
        [fail("a"), fail("b"), more, fail("c"), more, fail("d"), fail("e"), stop_then(True)], stop=stop
    )

    service.run(stop)

    assert [seen.failures for seen in service.journal.steps] == [0, 1, 2, 0, 1, 0, 1, 2]
    assert [seen.last_error for seen in service.journal.steps] == [
        None,
        "Transient: a",
        "Transient: b",
        None,
        "Transient: c",
        None,
        "Transient: d",
        "Transient: e",
    ]
    assert service.status.failures == 0
    assert service.status.last_error is None


def test_started_only_after_a_first_successful_step() -> None:
    stop = threading.Event()
    service = Scripted([fail(), fail(), more, stop_then(True)], stop=stop)
    assert service.status.started is False

    service.run(stop)

    assert [seen.started for seen in service.journal.steps] == [False, False, False, True]
    assert service.status.started is True


def test_a_service_that_never_succeeds_never_reports_started(runners: list[Runner]) -> None:
    stop = threading.Event()
    service = Scripted([], then=fail("never up"), stop=stop)
    runner = Runner(service, stop).start()
    runners.append(runner)

    wait_until(lambda: service.status.failures >= 5, what="five failures")
    assert service.status.started is False
    assert service.status.last_error == "Transient: never up"
    stop.set()
    runner.join(2)
    assert runner.error is None
    assert service.status.started is False


def test_a_subclass_of_a_declared_transient_error_is_retried() -> None:
    stop = threading.Event()

    def child(_service: Scripted, _stop: threading.Event) -> bool:
        raise TransientChild("still transient")

    service = Scripted([child, stop_then(True)], stop=stop)
    service.run(stop)
    assert service.journal.events == ["step", "reset", "step", "drain", "close"]


def test_a_reset_that_raises_does_not_stop_the_retries() -> None:
    stop = threading.Event()
    service = Scripted([fail(), fail(), stop_then(True)], stop=stop, reset_raises=True)
    service.run(stop)
    assert service.journal.events == ["step", "reset", "step", "reset", "step", "drain", "close"]
    assert service.status.started is True


def test_failure_message_is_one_bounded_line() -> None:
    status = ServiceStatus()
    status.failed(Transient("first line\nsecond line " + "x" * 1000))
    assert status.last_error == "Transient: first line"
    status.failed(Transient("y" * 2000))
    assert status.last_error is not None
    assert len(status.last_error) == 500
    assert "\n" not in status.last_error


def retry_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and "retrying in" in r.getMessage()]


def test_a_long_outage_warns_for_its_first_failures_then_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every retry of an hour-long outage a warning, from every loop of every process, would bury
    the log; each one still is at DEBUG, and the streak's size reaches the next warning."""
    caplog.set_level(logging.DEBUG, logger="scheduler.scripted")
    stop = threading.Event()
    service = Scripted([*[fail("pg down")] * 20, more, fail("pg down again"), stop_then(True)], stop=stop)

    service.run(stop)

    warnings = retry_lines(caplog, logging.WARNING)
    assert [line.split(";")[0] for line in warnings] == [
        "Transient: pg down (attempt 1)",
        "Transient: pg down (attempt 2)",
        "Transient: pg down (attempt 3)",
        "Transient: pg down again (attempt 1)",  # a new outage after a recovery warns at once
    ]
    assert len(retry_lines(caplog, logging.DEBUG)) == 17  # none lost: the rest of the first streak
    assert "recovered after 20 failed attempts" in caplog.text


def test_a_warning_a_minute_apart_says_how_many_failures_went_unwarned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="scheduler.scripted")
    clock = [1000.0]

    class Clocked(Scripted):
        def _warning_clock(self) -> float:
            return clock[0]

    def fail_later(seconds: float) -> Action:
        def action(service: Scripted, stop: threading.Event) -> bool:
            clock[0] += seconds
            raise Transient("kafka down")

        return action

    stop = threading.Event()
    script = [*[fail_later(5.0)] * 15, fail_later(5.0), stop_then(True)]  # 16 failures, 5 s apart
    Clocked(script, stop=stop).run(stop)

    warnings = retry_lines(caplog, logging.WARNING)
    # Failures 1-3 warn (the third at 1015 s); the next warning is the first a minute after it.
    assert len(warnings) == 4, warnings
    assert "(attempt 15)" in warnings[3]
    assert warnings[3].endswith("retrying in 0.0 s (11 more failed attempts since the last warning)")


# Backoff ------------------------------------------------------------------------------------------


class Slow(Scripted):
    backoff_initial_s = 0.001
    backoff_max_s = 0.005


def test_backoff_ceiling_doubles_from_the_initial_wait_up_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Full jitter draws uniformly below the ceiling: pin the draw to the ceiling to read it.
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    stop = RecordingEvent()
    service = Slow([fail()] * 7 + [stop_then(True)], stop=stop)

    service.run(stop)

    assert stop.waits == pytest.approx([0.001, 0.002, 0.004, 0.005, 0.005, 0.005, 0.005])


def test_backoff_is_jittered_below_a_capped_ceiling() -> None:
    stop = RecordingEvent()
    failures = 40
    service = Slow([fail()] * failures + [stop_then(True)], stop=stop)

    service.run(stop)

    waits = stop.waits
    assert len(waits) == failures
    for attempt, wait in enumerate(waits, start=1):
        ceiling = min(Slow.backoff_max_s, Slow.backoff_initial_s * 2 ** (attempt - 1))
        assert 0.0 <= wait <= ceiling + 1e-12, (attempt, wait, ceiling)
    assert len(set(waits)) > failures // 2, "the waits are not jittered"
    assert max(waits) <= Slow.backoff_max_s
    # Full jitter: draws spread over the whole window, not bunched at its top.
    capped = waits[5:]
    assert min(capped) < Slow.backoff_max_s / 2 < max(capped)


def test_the_default_backoff_is_capped() -> None:
    # The base class's own defaults (used by every component that does not override them).
    assert 0 < Service.backoff_initial_s <= Service.backoff_max_s <= 30


# Errors that end the service ----------------------------------------------------------------------


def test_a_non_transient_error_propagates_and_close_is_still_called() -> None:
    stop = threading.Event()
    service = Scripted([more, crash("boom")], stop=stop)

    with pytest.raises(Fatal, match="boom"):
        service.run(stop)

    assert service.journal.count("close") == 1
    assert service.journal.events[-1] == "close"
    assert service.journal.count("reset") == 0
    assert service.status.stopping is True


def refuse(word: str) -> Callable[[BaseException], str | None]:
    """A refusal that words failures whose message holds ``word`` as a setting to fix."""

    def refusal(error: BaseException) -> str | None:
        return f"fix the setting: {error}" if word in str(error) else None

    return refusal


def test_a_failure_the_refusal_words_ends_the_service_unretried_with_its_line() -> None:
    stop = threading.Event()
    service = Scripted([fail("pg down"), fail("wrong password"), more], stop=stop)

    with pytest.raises(Refused, match=r"^fix the setting: wrong password$") as raised:
        service.run(stop, refuse("password"))

    assert isinstance(raised.value.__cause__, Transient)
    assert service.journal.events == ["step", "reset", "step", "close"]


def test_failures_the_refusal_does_not_word_are_waited_out() -> None:
    stop = threading.Event()
    service = Scripted([fail("pg down"), fail("pg down"), stop_then(True)], stop=stop)

    service.run(stop, refuse("password"))

    assert service.journal.count("step") == 3 and service.journal.count("reset") == 2


def test_the_refusal_is_not_asked_about_a_bug() -> None:
    stop = threading.Event()
    asked: list[BaseException] = []

    def refusal(error: BaseException) -> str | None:
        asked.append(error)
        return "never"

    with pytest.raises(Fatal):
        Scripted([crash("password bug")], stop=stop).run(stop, refusal)
    assert asked == []


def test_a_non_transient_error_after_transient_ones_propagates_unretried() -> None:
    stop = threading.Event()
    service = Scripted([fail(), fail(), crash("bug after outage")], stop=stop)

    with pytest.raises(Fatal, match="bug after outage"):
        service.run(stop)

    assert service.journal.count("step") == 3
    assert service.journal.count("reset") == 2
    assert service.journal.count("close") == 1


def test_with_no_transient_errors_declared_every_error_is_fatal() -> None:
    class Plain(Service):
        def __init__(self) -> None:
            super().__init__("plain")
            self.steps = 0
            self.resets = 0
            self.closed = 0

        def step(self) -> bool:
            self.steps += 1
            raise ConnectionError("not declared transient")

        def reset(self) -> None:
            self.resets += 1

        def close(self) -> None:
            self.closed += 1

    service = Plain()
    with pytest.raises(ConnectionError):
        service.run(threading.Event())
    assert (service.steps, service.resets, service.closed) == (1, 0, 1)


def test_close_is_called_even_when_drain_raises() -> None:
    stop = threading.Event()
    service = Scripted([stop_then(True)], stop=stop, drain_raises=True)
    with pytest.raises(RuntimeError, match="drain failed"):
        service.run(stop)
    assert service.journal.events[-2:] == ["drain", "close"]


# Stopping -----------------------------------------------------------------------------------------


class LongBackoff(Scripted):
    backoff_initial_s = 30.0
    backoff_max_s = 30.0


def _pin_backoff_to_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "uniform", lambda low, high: high)


def test_stop_while_backing_off_ends_run_promptly_without_raising(
    monkeypatch: pytest.MonkeyPatch, runners: list[Runner]
) -> None:
    _pin_backoff_to_ceiling(monkeypatch)  # a 30 s wait, so only the stop can end it
    stop = threading.Event()
    service = LongBackoff([], then=fail("kafka down"), stop=stop)
    runner = Runner(service, stop).start()
    runners.append(runner)
    wait_until(lambda: service.status.failures == 1, what="the first failure")

    stop.set()
    took = runner.join(5)

    assert took < 1.0
    assert runner.error is None
    assert service.journal.count("drain") == 1
    assert service.journal.count("close") == 1
    assert service.journal.events[-2:] == ["drain", "close"]
    assert service.status.stopping is True


def test_no_step_runs_after_stop_is_set_during_a_backoff(
    monkeypatch: pytest.MonkeyPatch, runners: list[Runner]
) -> None:
    _pin_backoff_to_ceiling(monkeypatch)
    stop = threading.Event()
    service = LongBackoff([], then=fail("kafka down"), stop=stop)
    runner = Runner(service, stop).start()
    runners.append(runner)
    wait_until(lambda: service.status.failures == 1, what="the first failure")

    stop.set()
    runner.join(5)

    assert [seen.stop_was_set for seen in service.journal.steps] == [False]


def test_idle_is_called_only_when_step_reports_no_more_work() -> None:
    stop = threading.Event()
    service = Scripted([more, more, nothing, more, nothing, nothing, stop_then(True)], stop=stop)

    service.run(stop)

    assert service.journal.events == [
        "step",
        "step",
        "step",
        "idle",
        "step",
        "step",
        "idle",
        "step",
        "idle",
        "step",
        "drain",
        "close",
    ]


def test_no_idle_after_the_step_that_saw_stop() -> None:
    stop = threading.Event()
    service = Scripted([nothing, stop_then(False)], stop=stop)
    service.run(stop)
    assert service.journal.events == ["step", "idle", "step", "drain", "close"]


def test_no_idle_after_a_failed_step_only_a_backoff() -> None:
    stop = threading.Event()
    service = Scripted([fail(), fail(), stop_then(True)], stop=stop)
    service.run(stop)
    assert service.journal.count("idle") == 0


class DefaultIdle(Service):
    """Uses the base class's idle (wait on stop for a second): the real path of an idle service."""

    def __init__(self) -> None:
        super().__init__("idler")
        self.steps = 0
        self.drained = threading.Event()
        self.closed = threading.Event()

    def step(self) -> bool:
        self.steps += 1
        return False

    def drain(self) -> None:
        self.drained.set()

    def close(self) -> None:
        self.closed.set()


def test_stop_is_honoured_within_a_second_when_idle(runners: list[Runner]) -> None:
    stop = threading.Event()
    service = DefaultIdle()
    runner = Runner(service, stop).start()
    runners.append(runner)
    wait_until(lambda: service.status.started, what="the first step")
    assert service.steps == 1  # idling now, a second between steps

    stop.set()
    took = runner.join(3)

    assert took < 1.0
    assert runner.error is None
    assert service.drained.is_set()
    assert service.closed.is_set()
    assert service.status.stopping is True


def test_an_idle_loop_keeps_turning(runners: list[Runner]) -> None:
    class BriefIdle(Scripted):
        def idle(self, stop: threading.Event) -> None:
            self.journal.add("idle")
            stop.wait(0.01)

    stop = threading.Event()
    service = BriefIdle([], then=nothing, stop=stop)
    runner = Runner(service, stop).start()
    runners.append(runner)
    wait_until(lambda: service.journal.count("idle") >= 5, what="five idles")
    first = service.status.last_turn
    wait_until(lambda: service.status.last_turn > first, what="another turn")
    assert service.status.seconds_since_turn() < 1.0
    stop.set()
    runner.join(2)


def test_a_stop_set_before_run_skips_every_step() -> None:
    stop = threading.Event()
    stop.set()
    service = Scripted([], stop=stop)
    service.run(stop)
    assert service.journal.events == ["drain", "close"]
    assert service.status.started is False
    assert service.status.stopping is True
