"""SIGTERM taken as Ctrl-C, the one way `scheduler produce` and the benchmarks share: what unwinds
on Ctrl-C unwinds on it, and the exit status is the shell's for the signal (130, 143)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli.common import Terminated, interrupted_exit_code, sigterm_as_interrupt

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_in_the_block_is_an_interrupt_and_the_handler_before_is_back_after() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as stopped, sigterm_as_interrupt():
        signal.raise_signal(signal.SIGTERM)  # its handler runs before the call returns
    assert isinstance(stopped.value, KeyboardInterrupt)
    assert interrupted_exit_code(stopped.value) == 143
    assert interrupted_exit_code(KeyboardInterrupt()) == 130
    assert signal.getsignal(signal.SIGTERM) is before


# A benchmark step: it says when it waits, and its clean-up leaves a file behind.
BENCH_STEP = """
import sys
from pathlib import Path
from bench.common import run_main

def main() -> None:
    try:
        print("waiting", flush=True)
        sys.stdin.read()
    finally:
        Path(sys.argv[1]).write_text("cleaned up")

run_main(main)
"""


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_benchmark_stopped_by_a_signal_cleans_up_and_says_so_in_one_line(
    tmp_path: Path, signum: signal.Signals, status: int
) -> None:
    marker = tmp_path / "cleaned"
    proc = subprocess.Popen(
        [sys.executable, "-c", BENCH_STEP, str(marker)],
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A child of pytest may inherit SIGINT ignored; a user's Ctrl-C reaches a process that is not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "waiting\n"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == status, err
    assert err == "interrupted; cleaned up\n"
    assert marker.read_text() == "cleaned up"
