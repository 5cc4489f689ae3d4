"""A component under ``run all`` that stops being live exits, so that the supervisor restarts it.

``run all`` watches its children only for exits; without this, a process whose service loop is
wedged (what ``/live`` reports to Kubernetes) would sit there for good. Each case runs a small
component in a subprocess (``run_component`` installs signal handlers, and a wedged process ends
with ``os._exit``), with a live timeout of 1.5 s instead of 90 s. The test process plays the
supervisor: it is named in ``SCHEDULER_SUPERVISOR_PID``, as ``run all`` names itself, and reads the
heartbeat pipe it hands over in ``SCHEDULER_HEARTBEAT_FD``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from scheduler.runtime.process import HEARTBEAT_ENV, HEARTBEAT_S, LIVE_CHECK_S, SUPERVISOR_ENV, Heartbeat
from tests.support import wait_for

LIVE_TIMEOUT_S = 1.5

COMPONENT = r"""
import logging, sys, time
from pathlib import Path

from prometheus_client import CollectorRegistry

from scheduler.runtime.process import run_component
from scheduler.runtime.service import Check, Service

mode, turns_file, port = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
# In mode "waiting", the dependency answers once this file exists.
answers = turns_file.parent / "answers"
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")


class Loop(Service):
    def __init__(self) -> None:
        super().__init__("loop")
        self.turns = 0

    def step(self) -> bool:
        self.turns += 1
        turns_file.write_text(str(self.turns))
        if mode == "wedged" and self.turns == 3:
            time.sleep(600)  # a loop stuck for good: it never turns again, nor sees the stop
        while mode == "waiting" and self.turns == 3 and not answers.exists():
            time.sleep(0.05)  # a statement held by a PostgreSQL that stopped answering
        return False

    def checks(self):
        def probe():
            if not answers.exists():
                raise TimeoutError("timeout expired")
            return None

        return [Check("postgresql", probe, stalls_steps=True)] if mode == "waiting" else []

    def idle(self, stop) -> None:
        stop.wait(0.1)


code = run_component(
    "demo", [Loop()], CollectorRegistry(), metrics_port=int(port) if port else None,
    grace_s=0.5, live_timeout_s=%(live)s,
)
sys.exit(code)
""".replace("%(live)s", str(LIVE_TIMEOUT_S))


def start(
    tmp_path: Path, mode: str, *, supervised: bool, port: int | None = None, heartbeat: int | None = None
) -> subprocess.Popen[str]:
    script = tmp_path / "component.py"
    script.write_text(COMPONENT)
    env = {k: v for k, v in os.environ.items() if k not in (SUPERVISOR_ENV, HEARTBEAT_ENV)}
    if supervised:
        env[SUPERVISOR_ENV] = str(os.getpid())
    if heartbeat is not None:
        env[HEARTBEAT_ENV] = str(heartbeat)
    return subprocess.Popen(
        [sys.executable, str(script), mode, str(tmp_path / "turns"), str(port or "")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        pass_fds=() if heartbeat is None else (heartbeat,),
    )  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def turns(tmp_path: Path) -> int:
    try:
        return int((tmp_path / "turns").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def finish(proc: subprocess.Popen[str], timeout_s: float = 30) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the component did not exit within {timeout_s} s: {err}")
    return proc.returncode, err


def test_a_supervised_component_that_is_wedged_exits_1_saying_which_loop(tmp_path: Path) -> None:
    proc = start(tmp_path, "wedged", supervised=True)
    began = time.monotonic()
    code, err = finish(proc)
    assert code == 1, err
    assert "not live: loop has not turned for 2 s; stopping, for run all to restart the process" in err
    assert "did not stop within the grace period" in err, "the wedged loop never stops: it is left"
    # Live timeout, one check, the grace period and its margin: it does not linger.
    assert time.monotonic() - began < 20, err


def test_a_supervised_component_that_keeps_turning_stays_up_until_told_to_stop(tmp_path: Path) -> None:
    proc = start(tmp_path, "healthy", supervised=True)
    try:
        # Turns every 0.1 s: past three live timeouts it has had three chances to be wrongly stopped.
        wait_for(lambda: turns(tmp_path) >= 3 * LIVE_TIMEOUT_S / 0.1 + 10, 30, "the loop to keep turning")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 0 and "not live" not in err, err


def test_a_supervised_component_waiting_on_a_postgresql_that_does_not_answer_says_so_once_and_stays(
    tmp_path: Path,
) -> None:
    """A loop held by a PostgreSQL that stopped answering is not wedged: a restart cannot cure the
    outage. The process names the outage once, and once more when the loop turns again."""
    proc = start(tmp_path, "waiting", supervised=True)
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    said = bytearray()

    def log_so_far() -> str:
        with contextlib.suppress(BlockingIOError):
            said.extend(os.read(proc.stderr.fileno(), 65536) if proc.stderr else b"")
        return said.decode(errors="replace")

    try:
        wait_for(lambda: turns(tmp_path) >= 3, 30, "the loop to reach its held step")
        held_since = time.monotonic()
        # Three live timeouts held: three chances to be wrongly stopped, and to say it again.
        wait_for(lambda: time.monotonic() - held_since >= 3 * LIVE_TIMEOUT_S, 30, "the outage to last")
        assert proc.poll() is None
        (tmp_path / "answers").touch()
        wait_for(lambda: "loop turned again" in log_so_far(), 30, "the loop to turn again")
    finally:
        proc.send_signal(signal.SIGTERM)
    code, rest = finish(proc)
    err = said.decode(errors="replace") + rest
    assert code == 0 and "not live" not in err, err
    waiting = "loop has not turned for 2 s: it waits on postgresql, which does not answer"
    assert err.count(waiting) == 1, err
    assert "TimeoutError: timeout expired" in err, err
    assert err.count("loop turned again") == 1, err


def test_an_unsupervised_wedged_component_is_left_to_its_liveness_probe(tmp_path: Path) -> None:
    """Outside ``run all`` the platform's probe of /live decides: the process does not exit itself."""
    port = free_port()
    proc = start(tmp_path, "wedged", supervised=False, port=port)

    def live_status() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=2) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return 0

    try:
        wait_for(lambda: live_status() == 200, 30, "/live to answer")
        wait_for(lambda: live_status() == 503, 30, "/live to report the wedged loop")
        # Not live for three of the checks that stop a supervised process at its first: it would
        # have logged so (it logs before it stops), and it is still running.
        wedged_since = time.monotonic()
        wait_for(
            lambda: live_status() == 503 and time.monotonic() - wedged_since >= 3 * LIVE_CHECK_S,
            30,
            "/live to go on reporting it",
        )
        assert proc.poll() is None, "not supervised: it waits for the probe's restart"
    finally:
        proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 1 and "not live" not in err, err


def test_a_supervised_component_beats_down_its_pipe_while_it_runs_and_while_it_drains(tmp_path: Path) -> None:
    """``run all`` kills a child it has not heard from (frozen whole): a live one must be heard
    from about once a second, also through a stop that outlasts the supervisor's patience."""
    read_end, write_end = os.pipe()
    proc = start(tmp_path, "wedged", supervised=True, heartbeat=write_end)
    os.close(write_end)  # the child's alone: its exit ends the pipe
    arrivals: list[float] = []
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(64):
            arrivals.extend([time.monotonic()] * len(chunk))
    code, err = finish(proc)
    assert code == 1, err
    assert "not live: loop" in err  # it stopped itself, and drained for its grace period and margin
    assert len(arrivals) >= 5, err
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert max(gaps) < 3 * HEARTBEAT_S, gaps


@pytest.mark.parametrize("value", ["99999999999999999999", "\u00b2", "1", "2", "0", "-3", "abc", "", "7 "])
def test_a_heartbeat_variable_set_by_hand_is_ignored(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """Only run all's pipe is taken: never stdout (a pipe in a container, which it would make
    non-blocking and write into), nor a number that is no file descriptor."""
    monkeypatch.setenv(HEARTBEAT_ENV, value)
    blocking = os.get_blocking(1)
    heartbeat = Heartbeat()
    heartbeat.beat()
    assert os.get_blocking(1) == blocking
    assert HEARTBEAT_ENV not in os.environ  # not handed on to a handler's processes


def test_a_heartbeat_variable_naming_stdout_leaves_a_piped_stdout_alone() -> None:
    """A container's stdout is a pipe: taken for the heartbeat, it would turn non-blocking (log
    writes failing with BlockingIOError) and get a dot a second. Pytest's own stdout is a file, so a
    child with its stdout on a pipe asks."""
    script = (
        "import os, sys\n"
        "from scheduler.runtime.process import Heartbeat\n"
        "Heartbeat().beat()\n"
        "print('blocking', os.get_blocking(1))\n"
    )
    env = {**os.environ, HEARTBEAT_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "blocking True\n", done.stdout


def test_a_heartbeat_variable_naming_a_file_that_is_no_pipe_is_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with (tmp_path / "f").open("wb") as f:
        monkeypatch.setenv(HEARTBEAT_ENV, str(f.fileno()))
        Heartbeat().beat()
    assert (tmp_path / "f").read_bytes() == b""
