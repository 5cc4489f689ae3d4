"""The ``run all`` supervisor (``scheduler.runtime.supervisor``).

:class:`Supervisor` installs signal handlers, which only the main thread of a process may do, so
it runs in a subprocess of its own: a small script (written to ``tmp_path``) that replaces
``component_argv`` so the children are tiny Python sleep loops instead of real components. Each
child writes a marker file named by its pid once its SIGTERM handler is installed (so the test
never signals a child that cannot yet handle it), holding the argv the real ``component_argv``
would have given it. Like a component, a child writes its heartbeat with the real
``Heartbeat`` (but a "mute" one). The test reads the table the supervisor prints (stdout) and its log
(stderr), kills children, and signals the supervisor, polling every condition with a deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from scheduler.runtime.supervisor import (
    PIPELINE,
    ChildSpec,
    component_argv,
    describe_exit,
    pipeline_children,
)
from tests.support import wait_for

# The children: "good" exits 0 on SIGTERM, "stubborn" ignores it, "crash" exits 3 at once, "mute"
# is good but never writes its heartbeat.
CHILD = r"""
import os, pathlib, signal, sys, time
from scheduler.runtime.process import Heartbeat
markers, mode = sys.argv[1], sys.argv[2]
heartbeat = Heartbeat()
if mode == "crash":
    sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
marker = pathlib.Path(markers, str(os.getpid()))
marker.with_suffix(".tmp").write_text("\0".join(sys.argv[3:]))
marker.with_suffix(".tmp").rename(marker)
while True:
    if mode != "mute":
        heartbeat.beat()
    time.sleep(0.05)
"""

SCRIPT = r"""
import json, logging, pathlib, signal, sys

import scheduler.runtime.supervisor as supervisor

config = json.loads(sys.argv[1])
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
real_argv = supervisor.component_argv
modes = config["modes"]


def fake_argv(args, metrics_port=None):
    name = args[0]
    return [sys.executable, "-c", config["child"], config["markers"], modes.get(name, "good"),
            *real_argv(args, metrics_port)]


supervisor.component_argv = fake_argv
children = [supervisor.ChildSpec(name, (name,)) for name in config["children"]]
late = [supervisor.ChildSpec(name, (name,)) for name in config["late"]]


stop = config["stop"]


def tick():
    # As `run all` does once PostgreSQL lists the apps: more children, on the first tick.
    if late:
        sup.add(late)
        late.clear()
    # As `run all` does for a reason of its own (a port taken), once every child has started.
    if stop is not None and len(list(pathlib.Path(config["markers"]).glob("[0-9]*"))) == len(children):
        if stop["signal_first"]:
            signal.raise_signal(signal.SIGTERM)  # the operator's, during the tick's work
        sup.stop(stop["code"])


sup = supervisor.Supervisor(
    children,
    metrics_port=config["metrics_port"],
    grace_s=config["grace_s"],
    tick=tick,
    name_width=config["name_width"],
    **config["silence"],
)
sys.exit(sup.run())
"""

TABLE_LINE = re.compile(r"^(?P<name>\S+)\s+pid (?P<pid>\d+)(?:\s+health and metrics on port (?P<port>\d+))?$")


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    wait_for(condition, timeout, what, interval_s=0.02)


def running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in {"Z", "X"}


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@dataclass(frozen=True)
class Row:
    name: str
    pid: int
    port: int | None


class SupervisorRun:
    """A supervisor script running as a subprocess, its output in files."""

    def __init__(
        self,
        tmp: Path,
        children: list[str],
        *,
        modes: dict[str, str] | None = None,
        metrics_port: int | None = None,
        grace_s: float = 5.0,
        unbuffered: bool = True,
        silence: dict[str, float] | None = None,
        late: list[str] | None = None,
        name_width: int = 0,
        stop: dict[str, object] | None = None,
    ) -> None:
        self.markers = tmp / "markers"
        self.markers.mkdir()
        script = tmp / "supervise.py"
        script.write_text(SCRIPT)
        config = {
            "children": children,
            "modes": modes or {},
            "metrics_port": metrics_port,
            "grace_s": grace_s,
            "markers": str(self.markers),
            "child": CHILD,
            "silence": silence or {},
            "late": late or [],
            "name_width": name_width,
            "stop": stop,
        }
        self.stdout_path, self.stderr_path = tmp / "stdout.txt", tmp / "stderr.txt"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        argv = [sys.executable, *(["-u"] if unbuffered else []), str(script), json.dumps(config)]
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        self.expected = len(children) + len(late or [])
        self.grace_s = grace_s

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def log(self) -> str:
        return self.stderr_path.read_text()

    def rows(self) -> list[Row]:
        rows = []
        for line in self.stdout().splitlines():
            match = TABLE_LINE.match(line)
            if match:
                port = match["port"]
                rows.append(Row(match["name"], int(match["pid"]), None if port is None else int(port)))
        return rows

    def table(self, timeout: float = 10.0) -> list[Row]:
        wait_until(
            lambda: len(self.rows()) == self.expected or self.proc.poll() is not None,
            timeout,
            "the table of children",
        )
        rows = self.rows()
        assert len(rows) == self.expected, f"stdout: {self.stdout()!r}\nstderr: {self.log()}"
        return rows

    def ready(self, pid: int) -> bool:
        return (self.markers / str(pid)).exists()

    def argv_of(self, pid: int) -> list[str]:
        return (self.markers / str(pid)).read_text().split("\0")

    def wait_ready(self, pids: list[int], timeout: float = 10.0) -> None:
        wait_until(lambda: all(self.ready(pid) for pid in pids), timeout, f"children {pids} to start")

    def wait_log(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            match = re.search(pattern, self.log())
            if match:
                found.append(match)
            return bool(match)

        try:
            wait_until(seen, timeout, f"{pattern!r} in the supervisor's log")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlog:\n{self.log()}") from None
        return found[0]

    def our_children(self) -> list[int]:
        """Every child pid this run ever started (each wrote a marker), still running or not."""
        return [int(p.name) for p in self.markers.iterdir() if p.name.isdigit()]

    def kill_everything(self) -> None:
        """After a test, passed or not: the supervisor and every child it started end."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # it stops its children, even unmarked ones
            try:
                self.proc.wait(self.grace_s + 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pid in self.our_children():
            # Only a process still running our marker-writing child code, never a reused pid.
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if str(self.markers).encode() in cmdline:
                os.kill(pid, signal.SIGKILL)


class Supervise(Protocol):
    def __call__(
        self,
        children: list[str],
        *,
        modes: dict[str, str] | None = None,
        metrics_port: int | None = None,
        grace_s: float = 5.0,
        unbuffered: bool = True,
        silence: dict[str, float] | None = None,
        late: list[str] | None = None,
        name_width: int = 0,
        stop: dict[str, object] | None = None,
    ) -> SupervisorRun: ...


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Supervise]:
    runs: list[SupervisorRun] = []

    def factory(
        children: list[str],
        *,
        modes: dict[str, str] | None = None,
        metrics_port: int | None = None,
        grace_s: float = 5.0,
        unbuffered: bool = True,
        silence: dict[str, float] | None = None,
        late: list[str] | None = None,
        name_width: int = 0,
        stop: dict[str, object] | None = None,
    ) -> SupervisorRun:
        directory = tmp_path / f"run{len(runs)}"
        directory.mkdir()
        run = SupervisorRun(
            directory,
            children,
            modes=modes,
            metrics_port=metrics_port,
            grace_s=grace_s,
            unbuffered=unbuffered,
            silence=silence,
            late=late,
            name_width=name_width,
            stop=stop,
        )
        runs.append(run)
        return run

    yield factory
    for run in runs:
        run.kill_everything()


# Restart of a child that dies -------------------------------------------------------------------


def test_a_killed_child_is_restarted_and_the_others_are_left_alone(supervise: Supervise) -> None:
    run = supervise(["alpha", "beta"])
    rows = run.table()
    assert [row.name for row in rows] == ["alpha", "beta"]
    alpha, beta = rows[0].pid, rows[1].pid
    assert alpha != beta
    assert all(row.port is None for row in rows)
    run.wait_ready([alpha, beta])
    assert parent_of(alpha) == parent_of(beta) == run.proc.pid

    os.kill(alpha, signal.SIGKILL)

    run.wait_log(rf"alpha \(pid {alpha}\) died: killed by SIGKILL; restarting in \d+\.\d s")
    restarted = int(run.wait_log(r"restarted alpha \(pid (\d+)\)")[1])
    assert restarted != alpha
    run.wait_ready([restarted])
    assert running(restarted)
    assert parent_of(restarted) == run.proc.pid
    assert not running(alpha)

    # beta never noticed: same pid, same process, never reported dead or restarted.
    assert running(beta)
    assert parent_of(beta) == run.proc.pid
    assert "beta" not in run.log()
    assert run.our_children().count(beta) == 1

    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(10) == 0
    wait_until(lambda: not running(restarted) and not running(beta), 5, "every child to be gone")
    assert not any(running(pid) for pid in run.our_children())
    assert "received SIGTERM, stopping every component" in run.log()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_stops_every_child_and_exits_0(supervise: Supervise, signum: signal.Signals) -> None:
    run = supervise(["one", "two", "three"])
    pids = [row.pid for row in run.table()]
    run.wait_ready(pids)

    run.proc.send_signal(signum)

    assert run.proc.wait(10) == 0
    wait_until(lambda: not any(running(pid) for pid in pids), 5, "every child to be gone")
    assert f"received {signum.name}, stopping every component" in run.log()
    assert "died" not in run.log()  # a requested stop is not a death
    assert "restarted" not in run.log()


def test_a_stop_of_its_own_exits_with_its_code_unless_a_signal_came_first(supervise: Supervise) -> None:
    """`run all` stops itself with exit 2 when a worker it adds would find its port taken; a signal
    that came while it was checking the port made it exit 2 as well, where a signal stops it with 0."""
    own = supervise(["one", "two"], stop={"code": 2, "signal_first": False})
    assert own.proc.wait(10) == 2, own.log()
    assert "received" not in own.log()
    signalled = supervise(["one", "two"], stop={"code": 2, "signal_first": True})
    assert signalled.proc.wait(10) == 0, signalled.log()
    assert "received SIGTERM, stopping every component" in signalled.log()
    assert "died" not in own.log() + signalled.log()


def test_a_child_that_exits_on_its_own_is_reported_with_its_status_and_restarted(
    supervise: Supervise,
) -> None:
    run = supervise(["steady", "flaky"], modes={"flaky": "crash"})
    rows = run.table()
    steady = rows[0].pid
    run.wait_ready([steady])

    first = run.wait_log(r"flaky \(pid (\d+)\) died: exit status 3; restarting in")
    assert int(first[1]) == rows[1].pid
    restarted = int(run.wait_log(r"restarted flaky \(pid (\d+)\)")[1])
    run.wait_log(rf"flaky \(pid {restarted}\) died: exit status 3")  # and again: a crash loop

    assert running(steady)
    assert "steady" not in run.log()
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(10) == 1  # not every child stopped cleanly: flaky's last exit was 3
    wait_until(lambda: not running(steady), 5, "the steady child to be gone")


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(supervise: Supervise) -> None:
    grace_s = 0.5
    run = supervise(["good", "stubborn"], modes={"stubborn": "stubborn"}, grace_s=grace_s)
    pids = [row.pid for row in run.table()]
    run.wait_ready(pids)

    started = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    code = run.proc.wait(10)
    took = time.monotonic() - started

    assert code == 1  # the stubborn child was SIGKILLed, not stopped cleanly
    assert grace_s * 0.8 <= took < grace_s + 3.0
    wait_until(lambda: not any(running(pid) for pid in pids), 5, "every child to be gone")


# Frozen children --------------------------------------------------------------------------------


def test_a_frozen_child_is_killed_and_restarted_and_the_others_are_left_alone(supervise: Supervise) -> None:
    """A child stopped whole (SIGSTOP here; a cgroup freezer, or a C call that never lets go of
    the interpreter) neither dies nor notices it is not live: only its silence tells."""
    run = supervise(["alpha", "beta"], silence={"silent_s": 2.0})
    alpha, beta = [row.pid for row in run.table()]
    run.wait_ready([alpha, beta])
    time.sleep(3.0)  # past the silence allowed: both are heard from, so neither is touched
    assert "heard" not in run.log() and running(alpha)

    os.kill(alpha, signal.SIGSTOP)

    run.wait_log(rf"alpha \(pid {alpha}\) has not been heard from for \d+ s \(frozen.*\); killing it")
    run.wait_log(rf"alpha \(pid {alpha}\) died: killed by SIGKILL; restarting in")
    restarted = int(run.wait_log(r"restarted alpha \(pid (\d+)\)")[1])
    run.wait_ready([restarted])
    assert not running(alpha)
    assert running(beta) and "beta" not in run.log()

    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(10) == 0


def test_a_pause_of_the_supervisor_with_its_children_kills_none_of_them(supervise: Supervise) -> None:
    """Ctrl-Z on ``run all``, or a frozen cgroup, stops the supervisor and its children together:
    their silence over that time says nothing of them, even when the supervisor wakes first."""
    run = supervise([f"c{i}" for i in range(4)], silence={"silent_s": 2.0})
    pids = [row.pid for row in run.table()]
    run.wait_ready(pids)
    everyone = [run.proc.pid, *pids]
    for pid in everyone:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(4.0)  # twice the silence allowed
    os.kill(run.proc.pid, signal.SIGCONT)
    time.sleep(0.5)  # the supervisor scheduled first, its children a moment later: it looks before they beat
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    time.sleep(3.0)  # past the allowance again: had the pause counted, they would be dead by now

    assert "heard" not in run.log() and "died" not in run.log(), run.log()
    assert all(running(pid) for pid in pids)
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(10) == 0


def test_a_stop_wakes_a_stopped_child_so_it_stops_cleanly_at_once(supervise: Supervise) -> None:
    run = supervise(["alpha", "beta"], grace_s=20.0)
    alpha, beta = [row.pid for row in run.table()]
    run.wait_ready([alpha, beta])
    os.kill(alpha, signal.SIGSTOP)  # not yet silent long enough to be killed for it

    began = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)

    assert run.proc.wait(15) == 0, run.log()  # alpha stopped on its SIGTERM, not killed at the grace's end
    assert time.monotonic() - began < 10


def test_a_child_never_heard_from_is_given_its_start_up_allowance_then_killed(supervise: Supervise) -> None:
    began = time.monotonic()
    run = supervise(["quiet"], modes={"quiet": "mute"}, silence={"silent_s": 0.5, "startup_silent_s": 3.0})
    (row,) = run.table()
    run.wait_ready([row.pid])

    run.wait_log(rf"quiet \(pid {row.pid}\) has not been heard from for \d+ s .*; killing it")

    assert time.monotonic() - began >= 3.0  # not the 0.5 s allowed once it has been heard from
    run.wait_log(r"restarted quiet \(pid (\d+)\)")


# Ports ------------------------------------------------------------------------------------------


def test_children_get_consecutive_ports_in_table_order_and_keep_them_on_restart(
    supervise: Supervise,
) -> None:
    base = 19_100  # never bound: the children only receive it
    run = supervise(["scanner", "relay", "worker-x"], metrics_port=base)
    rows = run.table()

    assert [(row.name, row.port) for row in rows] == [
        ("scanner", base),
        ("relay", base + 1),
        ("worker-x", base + 2),
    ]
    pids = [row.pid for row in rows]
    run.wait_ready(pids)
    for row in rows:  # what the table says is what each child was given
        assert run.argv_of(row.pid) == component_argv((row.name,), row.port)

    os.kill(rows[1].pid, signal.SIGKILL)
    restarted = int(run.wait_log(r"restarted relay \(pid (\d+)\)")[1])
    run.wait_ready([restarted])
    assert run.argv_of(restarted) == component_argv(("relay",), base + 1)

    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(10) == 0


def test_the_table_aligns_the_names(supervise: Supervise) -> None:
    run = supervise(["a", "much-longer-name"], metrics_port=19_200)
    rows = run.table()
    lines = [line for line in run.stdout().splitlines() if TABLE_LINE.match(line)]
    assert lines[0].index(" pid ") == lines[1].index(" pid ")
    run.wait_ready([row.pid for row in rows])
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(10) == 0


def test_the_lines_of_children_added_later_keep_the_columns_of_the_table(supervise: Supervise) -> None:
    """`run all` adds its workers once PostgreSQL lists the apps: their lines were as wide as their
    own names (longer than the pipeline's), out of the table's columns. The caller reserves the
    width of the longest name a later child may have, and a pid of any length keeps its column."""
    late = ["worker-" + "a" * 48, "worker-b"]
    run = supervise(["scanner", "reconciler"], metrics_port=19_300, late=late, name_width=len(late[0]))
    rows = run.table()
    assert [(row.name, row.port) for row in rows] == [
        ("scanner", 19_300), ("reconciler", 19_301), (late[0], 19_302), ("worker-b", 19_303)
    ]  # fmt: skip
    lines = [line for line in run.stdout().splitlines() if TABLE_LINE.match(line)]
    assert len({line.index(" pid ") for line in lines}) == 1, lines
    assert len({line.index(" health and metrics") for line in lines}) == 1, lines
    run.wait_ready([row.pid for row in rows])
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(10) == 0


def test_the_table_is_visible_at_once_when_stdout_is_not_a_terminal(supervise: Supervise) -> None:
    run = supervise(["alpha", "beta"], unbuffered=False)
    wait_until(lambda: len(run.rows()) == 2 or run.proc.poll() is not None, 2.0, "the table")


# Pure parts -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "described"),
    [
        (0, "exit status 0"),
        (1, "exit status 1"),
        (3, "exit status 3"),
        (137, "exit status 137"),
        (-signal.SIGKILL, "killed by SIGKILL"),
        (-signal.SIGTERM, "killed by SIGTERM"),
        (-signal.SIGSEGV, "killed by SIGSEGV"),
        (-signal.SIGINT, "killed by SIGINT"),
        (-200, "killed by signal 200"),
    ],
)
def test_describe_exit(code: int, described: str) -> None:
    assert describe_exit(code) == described


def test_pipeline_children_one_worker_per_app() -> None:
    children = pipeline_children(["billing", "mail"], workers=1, concurrency=8)
    assert children == [
        ChildSpec("scanner", ("scanner",)),
        ChildSpec("relay", ("relay",)),
        ChildSpec("reconciler", ("reconciler",)),
        ChildSpec("ingestor", ("ingestor",)),
        ChildSpec("worker-billing", ("worker", "--app", "billing", "--concurrency", "8")),
        ChildSpec("worker-mail", ("worker", "--app", "mail", "--concurrency", "8")),
    ]


def test_pipeline_children_several_workers_per_app_are_numbered() -> None:
    children = pipeline_children(["billing", "mail"], workers=3, concurrency=2)
    names = [child.name for child in children]
    assert names == [
        *PIPELINE,
        "worker-billing-1",
        "worker-billing-2",
        "worker-billing-3",
        "worker-mail-1",
        "worker-mail-2",
        "worker-mail-3",
    ]
    assert len(set(names)) == len(names)
    assert {child.args for child in children[len(PIPELINE) :]} == {
        ("worker", "--app", "billing", "--concurrency", "2"),
        ("worker", "--app", "mail", "--concurrency", "2"),
    }


def test_pipeline_children_without_apps_is_the_pipeline_alone() -> None:
    assert [child.name for child in pipeline_children([], workers=4, concurrency=1)] == list(PIPELINE)
    assert PIPELINE == ("scanner", "relay", "reconciler", "ingestor")


def test_component_argv() -> None:
    assert component_argv(("relay",)) == [sys.executable, "-m", "scheduler", "run", "relay"]
    assert component_argv(("worker", "--app", "a"), 9100) == [
        sys.executable,
        "-m",
        "scheduler",
        "run",
        "worker",
        "--app",
        "a",
        "--metrics-port",
        "9100",
    ]


def test_a_child_stopped_cleanly_by_someone_else_is_restarted_without_an_error(supervise: Supervise) -> None:
    run = supervise(["one", "two"])
    pids = [row.pid for row in run.table()]
    run.wait_ready(pids)

    os.kill(pids[0], signal.SIGTERM)  # an operator's kill, not the supervisor's stop

    run.wait_log(rf"one \(pid {pids[0]}\) stopped on its own \(exit status 0\); restarting in")
    run.wait_log(r"restarted one \(pid (\d+)\)")
    assert "died" not in run.log()
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(10) == 0
