"""What the operability tests share: a component's endpoints over plain HTTP, the
metric families a ``/metrics`` page declares, the CLI as a user types it, and ``scheduler run all``
as a supervised process tree of the test's own."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support import SCHEDULER, wait_for

# Plain HTTP to 127.0.0.1, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Answer:
    status: int  # 0 when nothing answered (refused, reset, timed out)
    body: bytes
    content_type: str

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


def get(port: int, path: str, timeout_s: float = 5.0) -> Answer:
    """``GET http://127.0.0.1:<port><path>``, whatever it answers."""
    try:
        with _OPENER.open(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as response:
            return Answer(response.status, response.read(), response.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as error:
        return Answer(error.code, error.read(), error.headers.get("Content-Type", ""))
    except (OSError, http.client.HTTPException):
        return Answer(0, b"", "")


def status(port: int, path: str) -> int:
    return get(port, path).status


def wait_for_statuses(
    ports: Mapping[str, int],
    path: str,
    want: int,
    timeout_s: float,
    log: Callable[[], str] | None = None,
) -> None:
    """Poll ``path`` of every port until each answers ``want``; on timeout say who did not."""
    last: dict[str, int] = {}

    def settled() -> bool:
        last.update({name: status(port, path) for name, port in ports.items()})
        return all(last[name] == want for name in ports)

    try:
        wait_for(settled, timeout_s, f"{path} to answer {want} on {sorted(ports)}", interval_s=0.25)
    except AssertionError as error:
        tail = f"\n--- log tail ---\n{log()[-6000:]}" if log is not None else ""
        raise AssertionError(f"{error}; last answers {last}{tail}") from None


def declared_metrics(exposition: str) -> dict[str, str]:
    """Each metric family a ``/metrics`` page declares, with its type, from its ``# TYPE`` lines.

    prometheus_client writes HELP and TYPE for a labelled metric before its first use too (with no
    sample yet), so a component's whole set is visible from its start."""
    return {m[1]: m[2] for m in re.finditer(r"^# TYPE (\S+) (\S+)\s*$", exposition, re.MULTILINE)}


def sample_values(exposition: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called ``name`` (e.g. ``job_scheduled_total``), with its labels."""
    return [
        (dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == name
    ]


def cli(env: Mapping[str, str], *args: str, timeout_s: float = 60.0) -> str:
    """``scheduler ARGS``: its stdout; a failure shows the command's stderr."""
    done = subprocess.run(
        [SCHEDULER, *args], env=dict(env), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, f"scheduler {' '.join(args)} exited {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


def cli_json(env: Mapping[str, str], *args: str) -> Any:
    return json.loads(cli(env, *args))


# --- processes ---------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, session, …)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, is not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def children_of(parent: int) -> set[int]:
    """Live processes whose parent is ``parent``."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None and fields[0] != "Z" and int(fields[1]) == parent:
            found.add(int(entry.name))
    return found


def group_members(pgid: int) -> set[int]:
    """Live processes of process group ``pgid``."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            found.add(int(entry.name))
    return found


@dataclass(frozen=True)
class Child:
    """One line of the table ``run all`` prints at start."""

    name: str
    pid: int
    port: int


_TABLE_LINE = re.compile(r"^(?P<name>\S+)\s+pid (?P<pid>\d+)\s+health and metrics on port (?P<port>\d+)\s*$")


def log_messages(text: str) -> list[str]:
    """The message of each log line: the ``message`` of a JSON line, a human line as it is."""
    messages = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            messages.append(line)
            continue
        messages.append(str(record.get("message", line)) if isinstance(record, dict) else line)
    return messages


class Supervised:
    """``scheduler run all ARGS`` with stdout and stderr in files of their own.

    It leads a process group of its own, so that :meth:`kill_leftovers` can end exactly this tree
    (the supervisor and the components it started), whatever a failed test left running."""

    def __init__(self, env: Mapping[str, str], log_dir: Path, *args: str) -> None:
        stamp = time.monotonic_ns()
        self.stdout_path = log_dir / f"run-all-{stamp}.out"
        self.stderr_path = log_dir / f"run-all-{stamp}.err"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [SCHEDULER, "run", "all", *args],
                env=dict(env),
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def messages(self) -> list[str]:
        return log_messages(self.stderr())

    def table(self, count: int, timeout_s: float = 30.0) -> list[Child]:
        """The ``count`` lines of the start table, once printed."""

        def rows() -> list[Child] | None:
            assert self.proc.poll() is None, (
                f"run all exited {self.proc.returncode} before printing its table:\n{self.stderr()[-4000:]}"
            )
            found = [
                Child(m["name"], int(m["pid"]), int(m["port"]))
                for line in self.stdout().splitlines()
                if (m := _TABLE_LINE.match(line))
            ]
            return found if len(found) >= count else None

        try:
            found = wait_for(rows, timeout_s, f"run all to print {count} table lines on stdout")
        except AssertionError as error:
            raise AssertionError(f"{error}; stdout so far: {self.stdout()!r}") from None
        assert found is not None
        return found

    def stop(self, timeout_s: float = 90.0) -> int:
        """SIGTERM, as Ctrl-C or a service manager would; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill_leftovers(self) -> None:
        """SIGKILL whatever of this process group still runs (nothing, when the test passed)."""
        if group_members(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)
