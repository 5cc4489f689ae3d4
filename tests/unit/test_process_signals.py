"""What stops a component, and what ties it to its supervisor (Linux)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import pytest

from scheduler.runtime.process import SUPERVISOR_ENV, stop_signals, stop_with_supervisor

_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG = 1, 2


def test_sighup_stops_cleanly_unless_nohup_ignored_it() -> None:
    before = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert stop_signals() == (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts it
        assert stop_signals() == (signal.SIGTERM, signal.SIGINT)
    finally:
        signal.signal(signal.SIGHUP, before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_child_of_run_all_asks_for_sigterm_at_its_death_and_hands_the_variable_on_to_no_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    monkeypatch.setenv(SUPERVISOR_ENV, str(os.getppid()))
    try:
        stop_with_supervisor()
        asked = ctypes.c_int()
        assert libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(asked), 0, 0, 0) == 0
        assert asked.value == signal.SIGTERM
        # A process this one starts (a handler's subprocess) is no child of run all.
        assert SUPERVISOR_ENV not in os.environ
    finally:
        libc.prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)
