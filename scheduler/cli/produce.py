"""``scheduler produce``: schedule commands from JSON lines onto ``<prefix>.schedules``.

Each line is one command in the JSON shape the README documents; it is encoded as Avro and
produced with :class:`scheduler.client.ScheduleClient` (idempotent producer, acks=all). A line
without a ``command_id`` gets one derived from its text (and, for a line repeated in the input, how
many times it came before), so producing the same file twice applies every command once. Bad
lines are reported one per line on stderr and do not stop the run; the exit code says whether
every line was acknowledged by Kafka. What the ingestor then makes of each command (applied, or
rejected with a reason) is in ``scheduler schedules rejected``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from scheduler.cli.common import (
    Terminated,
    echo_json,
    fail,
    interrupted_exit_code,
    sigterm_as_interrupt,
    wiring_or_exit,
)
from scheduler.client import KAFKA_LOG, CommandFormatError, DeliveryError, ScheduleClient, command_from_json
from scheduler.kafka.avro import MessageEncodeError
from scheduler.kafka.registry import RegistryUnavailable
from scheduler.kafka.transport import KafkaUnavailable
from scheduler.wiring import Wiring

COMMAND_ID_NAMESPACE = uuid.UUID("5c4ed01e-3a1d-4c0e-9a8b-1f2e3d4c5b6a")
"""Namespace of the uuid5 command ids derived from a line's text (stripped of surrounding blanks)."""


def derived_command_id(line: str) -> str:
    return str(uuid.uuid5(COMMAND_ID_NAMESPACE, line.strip()))


class CommandIds:
    """The command ids of one input's lines: a line's :func:`derived_command_id`, and for the n-th
    repetition of the same text (n > 1) that of the text with ``#n``, so that pause, resume, pause
    pauses again (one id for both would make the second pause a duplicate), while the same input
    produced twice still gets the same ids."""

    def __init__(self) -> None:
        # Keyed by 8 bytes of each id (as an int), not the id's text: about 90 bytes a line rather
        # than 120, for inputs of millions of lines. Two texts sharing those bits (unlikely below
        # billions of lines) would give the second an id of text and "#2": still its own, harmless.
        self._seen: dict[int, int] = {}

    def derive(self, line: str) -> str:
        first = uuid.uuid5(COMMAND_ID_NAMESPACE, line.strip())
        key = first.int >> 64
        count = self._seen[key] = self._seen.get(key, 0) + 1
        return str(first) if count == 1 else str(uuid.uuid5(COMMAND_ID_NAMESPACE, f"{line.strip()}#{count}"))


TOPIC_CHECK_S = 10.0
"""How long the check that the commands topic exists waits for Kafka's metadata."""

INTERRUPTED_FLUSH_S = 10.0
"""How long an interrupted run still waits for Kafka to acknowledge what it sent."""


MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest line read: a command with a 1 MiB payload, its strings escaped, fits several times.
A longer one (or a stream without newlines, such as /dev/zero) is one bad line, read past in
pieces rather than held whole."""


@dataclass(frozen=True, slots=True)
class _BadLine:
    reason: str


def _produce_lines(
    stream: IO[bytes], client: ScheduleClient, command_ids: CommandIds, tally: _Tally
) -> KeyboardInterrupt | None:
    """Send each line's command; what stopped the reading (Ctrl-C, or SIGTERM)."""
    try:
        tally.expect(_InputSize.of(stream))
        for number, line, size in _lines(stream):
            tally.read(size)
            if line is None:
                tally.blank(size)
                continue
            if isinstance(line, _BadLine):
                tally.bad_line(number, size, line.reason)
                continue
            try:
                document = json.loads(line)
            except ValueError as exc:  # JSONDecodeError, or an integer past Python's 4300 digits
                tally.bad_line(number, size, f"not JSON: {exc}")
                continue
            except RecursionError:
                tally.bad_line(
                    number, size, "not JSON this reader can take: it nests about a thousand levels deep"
                )
                continue
            try:
                command = command_from_json(document, default_command_id=command_ids.derive(line))
                client.send(command, on_delivery=partial(tally.delivered, number, size))
            except (CommandFormatError, MessageEncodeError) as exc:
                tally.bad_line(number, size, str(exc))
            except RecursionError:
                tally.bad_line(number, size, "its payload nests too deep to encode")
        tally.input_ended()
    except KeyboardInterrupt as stop:
        return stop
    return None


class _InputSize:
    """The bytes a regular file holds from where the reading began: the progress bar's total. Its
    size, not a count of its lines: counting would read it twice, and a pipe, a FIFO or a terminal
    (``--file /dev/stdin``, ``<(cat …)``) can be read only once. A file that grows while it is read
    (a log still written) is looked at again when the reading reaches the size last seen."""

    def __init__(self, fd: int, start: int) -> None:
        self._fd = fd
        self._start = start

    @classmethod
    def of(cls, stream: IO[bytes]) -> _InputSize | None:
        """None unless ``stream`` is a regular file: no size to show a share of."""
        try:
            fd = stream.fileno()
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return cls(fd, stream.tell())
        except (OSError, ValueError):  # no file descriptor behind it
            return None

    def now(self) -> int:
        try:
            return max(os.fstat(self._fd).st_size - self._start, 0)
        except OSError:
            return 0


class _LinesColumn(ProgressColumn):
    """The lines done (produced or failed), and for a regular file how much of it that is."""

    def render(self, task: Task) -> Text:
        done = f"{task.fields['lines']:,} lines"
        if task.total is not None:
            done += f" {task.percentage:>3.0f}%"
        return Text(done, style="progress.download")


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        # The task advances by bytes; rich keeps their recent speed, and the lines done so far say
        # how many bytes a line takes.
        speed = task.finished_speed or task.speed
        if speed is None or not task.completed:
            return Text("")
        return Text(
            f"{speed * task.fields['lines'] / task.completed:,.0f} lines/s", style="progress.data.speed"
        )


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, str | _BadLine | None, int]]:
    """Each line's number, its text decoded on its own (a BOM before the first is none of its text),
    and the bytes it took. A blank line is None; one that is not UTF-8, or longer than
    :data:`MAX_LINE_BYTES`, is one bad line rather than the end of the run."""
    number = 0
    while raw := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        size = len(raw)
        if size > MAX_LINE_BYTES:
            ended = raw.endswith(b"\n")
            while not ended and (rest := stream.readline(1024 * 1024)):
                ended = rest.endswith(b"\n")
                size += len(rest)
            yield number, _BadLine(f"longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB; not read"), size
            continue
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            yield number, _BadLine(f"not UTF-8 (byte {exc.start + 1} of the line)"), size
            continue
        # Blank as text: non-ASCII spaces too.
        yield number, line if line.strip() else None, size


class _Tally:
    """Outcomes as Kafka reports them; bad lines are printed as they are found. The progress bar
    advances by the bytes of each line as its outcome is known, and counts the lines."""

    def __init__(self, progress: Progress, task: TaskID, err: Console) -> None:
        self.progress = progress
        self.task = task
        self.err = err
        self.produced = 0
        self.failed = 0
        self._blank_bytes = 0
        self._size: _InputSize | None = None
        self._total: int | None = None
        self._read = 0

    def expect(self, size: _InputSize | None) -> None:
        self._size = size
        self._total = None if size is None else size.now()
        self.progress.update(self.task, total=self._total)

    def read(self, size: int) -> None:
        """A line read. Read up to the total, the file is looked at again: grown as it was read, its
        total is its size now (at least what was read), so that the bar is full (and its clock
        stopped) only when all of it is done."""
        self._read += size
        if self._size is not None and self._total is not None and self._read >= self._total:
            self._total = max(self._size.now(), self._read)
            self.progress.update(self.task, total=self._total)

    def blank(self, size: int) -> None:
        # Shown with the next line done, at the end of the input, or by the mebibyte: a file of
        # millions of blank lines would otherwise update the bar for each.
        self._blank_bytes += size
        if self._blank_bytes >= 1024 * 1024:
            self._advance(0)

    def input_ended(self) -> None:
        # All of it read: the total is what was read (a file cut short as it was read, too).
        if self._total is not None:
            self._total = self._read
            self.progress.update(self.task, total=self._total)
        self._advance(0)

    def bad_line(self, number: int, size: int, reason: str) -> None:
        self.failed += 1
        self.err.print(f"line {number}: {reason}", markup=False, highlight=False, soft_wrap=True)
        self._advance(size)

    def delivered(self, number: int, size: int, error: str | None) -> None:
        if error is None:
            self.produced += 1
            self._advance(size)
        else:
            self.bad_line(number, size, f"not acknowledged by Kafka: {error}")

    def _advance(self, size: int) -> None:
        self.progress.update(self.task, advance=size + self._blank_bytes, lines=self.produced + self.failed)
        self._blank_bytes = 0


@click.command()
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON lines to produce (default: standard input).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON only.")
def produce(path: Path | None, as_json: bool) -> None:
    """Produce Avro ScheduleCommands from JSON lines onto <prefix>.schedules."""
    wiring = wiring_or_exit()
    # Connection trouble shows as failed lines; librdkafka's retry chatter would bury them.
    KAFKA_LOG.addHandler(logging.NullHandler())
    KAFKA_LOG.propagate = False
    err = Console(stderr=True)
    progress = Progress(
        SpinnerColumn(),
        TextColumn("producing"),
        BarColumn(),
        _LinesColumn(),
        TimeElapsedColumn(),
        _RateColumn(),
        console=err,
    )
    # Started once the topic check is done: its elapsed time, as the summary's, is of the producing.
    tally = _Tally(progress, progress.add_task("producing", total=None, start=False, lines=0), err)
    topic = wiring.settings.schedules_topic
    started = time.monotonic()
    interrupted: KeyboardInterrupt | None = None
    read_to_the_end = False  # then a signal cut only the wait for Kafka's acknowledgements
    stream: IO[bytes] | None = None
    with sigterm_as_interrupt():
        try:
            client = _checked_client(wiring)
            started = time.monotonic()  # the seconds and the rate are of the producing, not of the check
            progress.start_task(tally.task)
            stream = path.open("rb") if path is not None else sys.stdin.buffer
            with progress:
                interrupted = _produce_lines(stream, client, CommandIds(), tally)
                read_to_the_end = interrupted is None
                # Delivery reports of the tail arrive here; each one is counted by its callback. After
                # Ctrl-C too, for a while: what was sent is delivered and counted. Ctrl-C may also land
                # here, past the reading (the input ended as it came); a second one stops the wait.
                try:
                    client.flush(60.0 if interrupted is None else INTERRUPTED_FLUSH_S)
                except KeyboardInterrupt as stop:
                    if interrupted is not None:
                        raise
                    interrupted = stop
                    client.flush(INTERRUPTED_FLUSH_S)
        except KeyboardInterrupt as stop:
            # Before the reading (Kafka asked for the topic), or a second one during the wait: the
            # summary still says what was acknowledged so far.
            if interrupted is None:
                interrupted = stop
        except RegistryUnavailable as exc:
            fail(str(exc))
        except DeliveryError as exc:
            if interrupted is None:
                fail(f"Kafka at {wiring.settings.kafka_bootstrap} did not answer: {exc}")
            # Interrupted: what Kafka did not acknowledge in time is in neither count of the summary, and
            # producing the same input again sends it.
        finally:
            if path is not None and stream is not None:
                stream.close()
    seconds = time.monotonic() - started
    rate = tally.produced / seconds if seconds > 0 else 0.0
    if as_json:
        echo_json(
            {
                "produced": tally.produced,
                "failed": tally.failed,
                "seconds": round(seconds, 3),
                "rate": round(rate, 1),
                "interrupted": interrupted is not None,
            }
        )
    else:
        click.echo(
            f"produced {tally.produced} commands to {topic}, {tally.failed} failed, "
            f"in {seconds:.1f} s ({rate:,.0f} commands/s)"
        )
    if interrupted is not None:
        stopped = "terminated" if isinstance(interrupted, Terminated) else "interrupted"
        what = (
            "every line was sent, but not every acknowledgement waited for"
            if read_to_the_end
            else "the rest of the input was not produced"
        )
        fail(
            f"{stopped}: {what}; producing the same input again sends what is missing (its lines keep "
            "their command ids, so none is applied twice)",
            code=interrupted_exit_code(interrupted),
        )
    if tally.failed:
        raise SystemExit(1)


def _checked_client(wiring: Wiring) -> ScheduleClient:
    """The producer, once Kafka has said that the commands topic exists."""
    try:
        client = wiring.schedule_client("scheduler-produce")
    except RegistryUnavailable as exc:
        fail(str(exc))
    try:
        # Asked up front: without the topic (or a broker) every line would wait out its delivery
        # timeout and fail with librdkafka's "Message timed out", naming neither. In requests of a
        # second, so that a Ctrl-C (or SIGTERM) stops the check within one, not after all of it.
        exists = client.topic in wiring.admin.topics_interruptibly(TOPIC_CHECK_S)
    except KafkaUnavailable as exc:
        fail(f"Kafka at {wiring.settings.kafka_bootstrap} did not answer: {exc}")
    if not exists:
        fail(f"topic {client.topic} does not exist: `scheduler init` creates it")
    return client
