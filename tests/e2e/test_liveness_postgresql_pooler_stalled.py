"""A PostgreSQL that stops answering behind a pooler (PgBouncer, which docs/operations.md supports):
the pooler still takes new connections and logs them in, and only their first statement waits on the
frozen server, for good (PgBouncer's ``query_timeout`` is off by default).

``/live`` probes PostgreSQL once a loop is overdue, to tell a loop waiting on an outage from a
wedged one, and the process's main thread does the same every second. The probe bounds only its
connect (``connect_timeout``), not its ``select 1``: behind a pooler it never returns. Each endpoint
waits for a probe at most 2.5 s, so ``/live`` answers within a kubelet's 3 s; it once waited on the
hung probe for good, and the pod was restarted for the outage.

The pooler is stood in for by a port of the test's own in front of the shared PostgreSQL (which is
never touched): stalled, it holds every statement, on the connections it forwards already and on
new ones once the server has logged them in, as PgBouncer in front of a frozen server does."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.chaos_stack import free_port
from scheduler.runtime.health import LIVE_TIMEOUT_S
from tests.e2e.health import get, wait_for_statuses
from tests.support import Component, wait_for

pytestmark = pytest.mark.e2e

# The manifests' liveness probe gives /live 3 s (k8s/components/pod-defaults/deployment.yaml); the
# test waits far longer for an answer, so that only no answer at all fails it.
ANSWER_WITHIN_S = 15.0
# A server's ReadyForQuery ('Z', length 5): the end of a login, and of every statement.
READY_FOR_QUERY = b"Z\x00\x00\x00\x05"


class StallingPooler:
    """Forwards each connection to PostgreSQL; :meth:`stall` holds every statement from then on (the
    login of a new connection still goes through), :meth:`resume` lets them all through again."""

    def __init__(self, database_url: str) -> None:
        params = conninfo_to_dict(database_url)
        self.port = free_port()
        self._target = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self._answering = threading.Event()
        self._answering.set()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen()
        self._ends: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database_url: str) -> str:
        # No TLS, so that the end of the login can be read on the wire.
        return make_conninfo(database_url, host="127.0.0.1", port=str(self.port), sslmode="disable")

    def stall(self) -> None:
        self._answering.clear()

    def resume(self) -> None:
        self._answering.set()

    def close(self) -> None:
        self.resume()
        for end in [self._listener, *self._ends]:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            self._ends += [client, server]
            logged_in = threading.Event()
            threading.Thread(target=self._pipe, args=(server, client, logged_in, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(client, server, logged_in, False), daemon=True).start()

    def _pipe(
        self, source: socket.socket, sink: socket.socket, logged_in: threading.Event, back: bool
    ) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                while logged_in.is_set() and not self._answering.is_set():
                    self._answering.wait(0.1)  # held, as a frozen server holds it
                sink.sendall(data)
                if back and READY_FOR_QUERY in data:
                    logged_in.set()
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)


def test_live_answers_while_a_postgresql_behind_a_pooler_does_not(
    settings_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    pooler = StallingPooler(database_url)
    port = free_port()
    env = settings_env | {
        "SCHEDULER_DATABASE_URL": pooler.url(database_url),
        "SCHEDULER_METRICS_PORT": str(port),
        "SCHEDULER_MAX_SCAN_SLEEP": "0.2",
    }
    scanner = Component("scanner", env, tmp_path)
    try:
        wait_for_statuses({"scanner": port}, "/ready", 200, 120, scanner.output)
        pooler.stall()
        # Only /live is asked (as a kubelet's liveness probe would), past the live timeout: the scan
        # loop waits on its statement, and /live is to say it waits on PostgreSQL, not that it is wedged.
        outlasted = time.monotonic() + LIVE_TIMEOUT_S + 20

        def live_throughout() -> bool:
            answer = get(port, "/live", timeout_s=ANSWER_WITHIN_S)
            assert answer.status == 200, (
                f"/live answered {answer.status or f'nothing within {ANSWER_WITHIN_S:g} s'} while "
                f"PostgreSQL, behind a pooler, does not answer:\n{scanner.output()[-3000:]}"
            )
            return time.monotonic() > outlasted

        wait_for(live_throughout, LIVE_TIMEOUT_S + 120, "the outage to outlast the live timeout", 2.0)
    finally:
        pooler.close()
        with contextlib.suppress(AssertionError):
            scanner.stop(60)
