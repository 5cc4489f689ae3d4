"""Background processes of the local stack: pid files, ports, waiting and stopping.

The stack only ever signals a pid it recorded itself, and only after checking that the process
behind that pid is still the one it started (its command line names this stack's folder), so a
reused pid or another checkout's stack is never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class StackError(RuntimeError):
    """The local stack cannot do what was asked; the message is one line for the user."""


@dataclass(frozen=True)
class ProcessStatus:
    name: str
    running: bool
    pid: int | None
    port: int
    detail: str = ""


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; only its parent has not collected it yet.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def owned_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in ``pid_file`` if that process is alive and its command line contains ``marker``."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if is_alive(pid) and marker in cmdline(pid):
        return pid
    return None


def stale_pid(pid_file: Path, marker: str) -> int | None:
    """A pid recorded in ``pid_file`` whose process is gone (or is no longer ours)."""
    if not pid_file.exists():
        return None
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1
    return None if owned_pid(pid_file, marker) is not None else pid


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def require_free_port(port: int, what: str, variable: str) -> None:
    if port_in_use(port):
        raise StackError(f"port {port} for {what} is already in use by another process (set {variable})")


def wait_until(
    condition: Callable[[], bool],
    timeout_s: float,
    what: str,
    *,
    alive: Callable[[], bool] | None = None,
    log: Path | None = None,
) -> None:
    """Poll ``condition`` until true; fail early with the log's last line if the process died."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while time.monotonic() < deadline:
        if condition():
            return
        if alive is not None and not alive():
            raise StackError(f"{what} exited during start-up: {last_line(log)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    raise StackError(f"{what} did not answer within {timeout_s:.0f} s: {last_line(log)}")


def last_line(log: Path | None) -> str:
    if log is None or not log.exists():
        return "no log"
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line or "FATAL" in line or "Exception" in line]
    picked = (errors or lines or ["empty log"])[-1]
    return f"{picked.strip()[:300]} (see {log})"


def terminate(pid: int, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if the process outlives ``timeout_s``; returns once it is gone."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive(pid):
            _reap(pid)
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while is_alive(pid):
        time.sleep(0.05)
    _reap(pid)


def _reap(pid: int) -> None:
    # Collect the exit status when the stack was started by this very process (tests do that).
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
