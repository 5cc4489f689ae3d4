"""What the integration and end-to-end tests share: waiting on conditions, reading topics with an
independent Kafka client, running components as real processes, and a port of the test's to
PostgreSQL that it opens and closes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.chaos_stack import free_port
from scheduler.devstack.postgres import LocalPostgres
from scheduler.domain.run_state import RunState
from scheduler.kafka.messages import JobMessage, RetryPolicy
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, scan
from scheduler.store.runs import with_attempts
from scheduler.store.scan import NewRun

SCHEDULER = str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "scheduler")
T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | Literal[False] | None], timeout_s: float, what: str, interval_s: float = 0.1
) -> T:
    """Poll until ``condition`` returns something truthy, and return that; fail with ``what`` after
    ``timeout_s``. ``None`` and ``False`` (as from ``cond and value``) are never returned, so they are
    not part of the result's type."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[tuple[bytes | None, bytes, int]]:
    """Every message on ``topic`` now, as (key, value, timestamp ms), read with a plain consumer
    that is assigned all partitions from the beginning and stops at the high watermarks."""
    return [(key, value, timestamp) for key, value, timestamp, _ in read_records(bootstrap, topic, timeout_s)]


def read_records(
    bootstrap: str, topic: str, timeout_s: float = 60.0
) -> list[tuple[bytes | None, bytes, int, dict[str, bytes]]]:
    """Like :func:`read_topic`, with each message's headers."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "independent-reader", "enable.auto.commit": False}
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions: list[int] = list(metadata.topics[topic].partitions)
        ends = {p: watermarks(consumer, TopicPartition(topic, p))[1] for p in partitions}
        remaining = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        messages: list[tuple[bytes | None, bytes, int, dict[str, bytes]]] = []
        deadline = time.monotonic() + timeout_s
        while remaining and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                if message.error():
                    continue
                headers = header_bytes(message.headers())
                messages.append((message.key(), message.value() or b"", message.timestamp()[1], headers))
                partition, offset = message.partition(), message.offset()
                if partition is not None and offset is not None and offset + 1 >= ends[partition]:
                    remaining.discard(partition)
        assert not remaining, f"could not read {topic} to its end within {timeout_s} s"
        return messages
    finally:
        consumer.close()


# What a broker answers while a partition's leadership is still settling (just after the topic was
# created, or a broker restarted): the question is asked again rather than failing the test.
_SETTLING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
}


def settling(code: str | None) -> bool:
    """Whether ``code``, a :class:`~scheduler.kafka.transport.TransportError`'s (librdkafka's error
    name), is what a broker answers while a partition's leadership settles (:data:`_SETTLING`)."""
    return code in _SETTLING_NAMES


_SETTLING_NAMES = frozenset(KafkaError(code).name() for code in _SETTLING)


def watermarks(consumer: Consumer, partition: TopicPartition, timeout_s: float = 60.0) -> tuple[int, int]:
    """(low, high) watermark of ``partition``, asked again while its leadership settles."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=10)
            return low, high
        except KafkaException as exc:
            if exc.args[0].code() not in _SETTLING or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def header_bytes(
    headers: Mapping[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]] | None,
) -> dict[str, bytes]:
    """A message's headers by name, each value as bytes (``b""`` for a header without one)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    return {name: value.encode() if isinstance(value, str) else value or b"" for name, value in pairs}


def json_log_lines(text: str) -> list[dict[str, Any]]:
    """A component's stderr under ``SCHEDULER_LOG_FORMAT=json`` (the default off a terminal), each
    line a JSON object, as docs/operations.md promises; a line of plain text fails the test."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        assert isinstance(record, dict), f"not a JSON log line: {line!r}\n{text[-3000:]}"
        records.append(record)
    return records


class Component:
    """``scheduler run NAME`` as a child process with its own log file."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path, *args: str) -> None:
        self.name = name
        self.log = log_dir / f"{name}-{time.monotonic_ns()}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [SCHEDULER, "run", name, *args], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def kill(self) -> None:
        """SIGKILL: no chance to finish anything."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, and its exit code; one still running after ``timeout_s`` is killed, and the
        failure carries the end of its log (what it was doing instead of stopping)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} still running {timeout_s:g} s after SIGTERM:\n{self.output()[-5000:]}"
            ) from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def peak_rss(component: Component) -> int:
    """The process's peak resident memory so far (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{component.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


@contextmanager
def components(env: dict[str, str], log_dir: Path, *names: str) -> Iterator[list[Component]]:
    started = [Component(name, env, log_dir) for name in names]
    try:
        yield started
    finally:
        stop_all(started)


def stop_all(started: Sequence[Component]) -> None:
    """Stop every one of ``started``, and only then fail for those that did not exit 0: one that
    failed must not leave the others running (into the next tests, against a dropped database)."""
    failures = []
    for component in started:
        try:
            code = component.stop()
        except AssertionError as exc:  # still running past its timeout: killed
            failures.append(str(exc))
            continue
        if code != 0:
            failures.append(f"{component.name} exited {code}:\n{component.output()[-3000:]}")
    assert not failures, "\n".join(failures)


@contextmanager
def own_postgres(root: Path) -> Iterator[LocalPostgres]:
    """A PostgreSQL server of a test's own under ``root``, for tests that stop or freeze one (the
    shared stack's is never touched); continued first when the test stopped it (SIGSTOP), then
    shut down and removed."""
    stack_dir = root / "stack"
    stack_dir.mkdir()
    postgres = LocalPostgres(stack_dir, free_port())
    postgres.up(postgres.preflight())
    try:
        yield postgres
    finally:
        for pid in server_processes(postgres):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a failed test must not leave it stopped
        postgres.down()
        shutil.rmtree(postgres.root, ignore_errors=True)


def server_processes(postgres: LocalPostgres) -> list[int]:
    """The postmaster of ``postgres`` and every process it started (its sessions, its workers)."""
    root = postgres.pid()
    if root is None:
        return []
    found: list[int] = []
    pending = [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        pending += [int(child) for child in children]
    return found


class PostgreSQLPort:
    """A port of the test's to the PostgreSQL of ``database_url`` (the shared server, which is never
    stopped): down, it refuses connections, as a PostgreSQL not started does; :meth:`up`, it
    forwards each connection to the server; :meth:`down` again ends those it forwards (as a stopped
    server ends its sessions) and refuses new ones."""

    def __init__(self, database_url: str) -> None:
        params = conninfo_to_dict(database_url)
        self.port = free_port()
        self._target = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self._listener: socket.socket | None = None
        # Each forwarded connection: its socket to the client, its socket to the server, and the
        # latter's port, which the server sees it come from.
        self._open: list[tuple[socket.socket, socket.socket, int]] = []
        self._lock = threading.Lock()

    def url(self, database_url: str, **params: str) -> str:
        """``database_url`` through this port, with ``params`` (libpq's keywords) over its own."""
        return make_conninfo(database_url, host="127.0.0.1", port=str(self.port), **params)

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, forwarded = self._listener, self._open
            self._listener, self._open = None, []
        # The port first, so that no connection ended here is made again through it.
        for end in [listener] if listener is not None else []:
            _end(end)
        for client, server, _ in forwarded:
            _end(client)
            _end(server)

    def client_ports(self) -> list[int]:
        """The ports PostgreSQL sees the connections forwarded now come from (``client_port`` in
        ``pg_stat_activity``): how a test finds the sessions of what it pointed at this port."""
        with self._lock:
            return [port for _, _, port in self._open]

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            threading.Thread(target=self._forward, args=(listener, client), daemon=True).start()

    def _forward(self, listener: socket.socket, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self._target)
        except OSError:
            _end(client)
            return
        forwarded = (client, server, server.getsockname()[1])
        with self._lock:
            if self._listener is not listener:  # down() meanwhile
                _end(client)
                _end(server)
                return
            self._open.append(forwarded)
        back = threading.Thread(target=_pipe, args=(server, client), daemon=True)
        back.start()
        _pipe(client, server)
        back.join()
        with self._lock:
            if forwarded in self._open:
                self._open.remove(forwarded)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Forward what ``source`` sends to ``sink`` until either end is done; then both are ended
    (which also ends the other direction's pipe)."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    _end(source)
    _end(sink)


def _end(end: socket.socket) -> None:
    with contextlib.suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept() or recv() on it
    end.close()


def attempts_history(database_url: str, run_filter: str = "true", *params: object) -> list[dict[str, Any]]:
    """The attempts of the runs matching ``run_filter`` (SQL over ``runs``) as a user reads them
    (``scheduler runs get``, the API): the events `attempts` recorded and what each run's own row
    holds (its applied start and success), each with its ``run_id``, a run's oldest first."""
    with connect(database_url) as conn:
        runs = conn.execute(f"select id from runs where {run_filter}", params).fetchall()
        return [
            attempt | {"run_id": run["id"]}
            for run in with_attempts(conn, runs)
            for attempt in run["attempts"]
        ]


def make_dead_runs(conn: Any, app: str, count: int, error: str) -> None:
    """``count`` immediate builtin:fail schedules of ``app``, each with one run already dead with
    ``error`` (as a worker and the reconciler would leave it), committed; no outbox row is left."""
    for _ in range(count):
        spec = ScheduleSpec(app=app, handler="builtin:fail", kind="immediate", max_attempts=1)
        schedule = service.create_schedule(conn, spec, "test")
        scan.create_runs(
            conn, [NewRun(uuid.uuid4(), schedule["id"], app, schedule["next_fire_at"], RunState.PENDING, 1)]
        )
    conn.execute("delete from outbox")
    conn.execute("update runs set state = 'dead', finished_at = now(), error = %s", (error,))
    conn.commit()


def job_message(
    app: str, handler: str, payload: Any = None, *, max_attempts: int = 1, timeout_ms: int = 30_000
) -> JobMessage:
    """A first attempt of a new run of ``app``, as a scanner would dispatch it, for tests that produce
    jobs straight onto a worker's topic (no PostgreSQL component runs)."""
    run_id = uuid.uuid4()
    now = datetime.now(UTC)
    return JobMessage(
        run_id=run_id,
        schedule_id=uuid.uuid4(),
        app=app,
        attempt=1,
        idempotency_key=str(run_id),
        scheduled_for=now,
        handler=handler,
        payload=json.dumps(payload),
        timeout_ms=timeout_ms,
        # Long past: the worker runs a job whatever its message's deadline says.
        deadline=now - timedelta(hours=1),
        retry=RetryPolicy(max_attempts=max_attempts, backoff_base_ms=100, backoff_max_ms=1000),
    )
