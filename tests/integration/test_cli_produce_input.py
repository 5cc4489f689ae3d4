"""`scheduler produce` reads its input once, whatever it is (a file, a pipe, a FIFO), and a signal
at any moment ends it with its summary: Ctrl-C exit 130, SIGTERM exit 143."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import ScheduleCommand
from tests.support import SCHEDULER, read_topic, wait_for

pytestmark = pytest.mark.integration

CODEC = AvroCodec()


def command(key: str) -> str:
    return json.dumps(
        {"schedule_key": key, "app": "bulk", "operation": "create", "spec": {"handler": "builtin:noop"}}
    )


@pytest.fixture
def env(settings_env: dict[str, str]) -> dict[str, str]:
    """The commands topic exists (`scheduler init`); no ingestor reads it."""
    done = subprocess.run([SCHEDULER, "init"], env=settings_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return settings_env


def produced_keys(settings: Settings) -> list[str]:
    return sorted(
        CODEC.decode(ScheduleCommand, value).schedule_key
        for _, value, _ in read_topic(settings.kafka_bootstrap, settings.schedules_topic)
    )


def summary(out: str, err: str) -> dict[str, Any]:
    """The JSON summary on stdout, after no traceback and no click `Aborted!` on stderr."""
    assert "Traceback" not in err and "Aborted!" not in err, err
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.mark.parametrize("source", ["--file /dev/stdin", "--file FIFO", "--file FILE", "stdin"])
def test_every_line_is_produced_whatever_the_input_is(
    env: dict[str, str], settings: Settings, tmp_path: Path, source: str
) -> None:
    """`--file <(cat cmds.jsonl)` and `cat cmds.jsonl | scheduler produce --file /dev/stdin` produced
    nothing, exit 0: the lines were read once to be counted and were gone when read to be sent."""
    lines = "".join(command(f"k{i}") + "\n" for i in range(5))
    args = ["--json"]
    stdin: str | None = lines
    writer = None
    if source == "--file /dev/stdin":
        args += ["--file", "/dev/stdin"]
    elif source == "--file FILE":
        (tmp_path / "commands.jsonl").write_text(lines)
        args += ["--file", str(tmp_path / "commands.jsonl")]
        stdin = None
    elif source == "--file FIFO":  # as bash's <(cat commands.jsonl)
        fifo = tmp_path / "commands.fifo"
        os.mkfifo(fifo)
        writer = threading.Thread(target=fifo.write_text, args=(lines,))
        writer.start()
        args += ["--file", str(fifo)]
        stdin = None
    done = subprocess.run(
        [SCHEDULER, "produce", *args], env=env, input=stdin, capture_output=True, text=True, timeout=120
    )
    if writer is not None:
        writer.join(10)
    assert done.returncode == 0, done.stderr
    produced = summary(done.stdout, done.stderr)
    assert (produced["produced"], produced["failed"]) == (5, 0)
    assert produced_keys(settings) == [f"k{i}" for i in range(5)]


def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [SCHEDULER, "produce", "--json", *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A child of pytest may inherit SIGINT ignored; a user's Ctrl-C reaches a process that is not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_sigterm_ends_produce_with_what_it_sent_delivered_counted_and_exit_143(
    env: dict[str, str], settings: Settings
) -> None:
    """SIGTERM (a supervisor, `timeout`) killed it at once, exit 143 with no summary: now it stops as
    Ctrl-C does, with the summary, and exits 143 (128 + SIGTERM)."""
    proc = start(env)
    assert proc.stdin is not None
    proc.stdin.write("".join(command(f"k{i}") + "\n" for i in range(3)))
    proc.stdin.flush()
    wait_for(lambda: len(produced_keys(settings)) == 3, 60, "3 commands sent")
    proc.send_signal(signal.SIGTERM)  # while it waits for more input
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    produced = summary(out, err)
    assert (produced["produced"], produced["interrupted"]) == (3, True)
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: terminated: the rest of the input was not produced"), err


def _read_offset(pid: int, path: Path) -> int | None:
    """How far process ``pid`` has read the file ``path`` it holds open (None: not open)."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
                    if line.startswith("pos:"):
                        return int(line.split()[1])
    except OSError:  # it closed the file, or ended, as we looked
        return None
    return None


def test_ctrl_c_while_a_large_file_is_read_still_prints_the_summary_and_exits_130(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Ctrl-C while the lines of a file were counted for the progress bar ended it with click's
    `Aborted!`, exit 1 and no summary: the count was read outside the handler."""
    big = tmp_path / "commands.jsonl"
    with big.open("w") as file:  # 20 million blank lines (skipped, but read): seconds of reading
        file.write("\n" * 20_000_000)
        file.write(command("last") + "\n")
    proc = start(env, "--file", str(big))
    wait_for(lambda: (_read_offset(proc.pid, big) or 0) > 0, 60, "the file being read")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert summary(out, err)["interrupted"] is True
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: interrupted: the rest of the input was not produced"), err


def test_a_file_is_read_once_and_the_progress_bar_counts_its_bytes(
    env: dict[str, str], settings: Settings, tmp_path: Path
) -> None:
    """A regular file was read twice: to its end to count its lines for the progress bar's total,
    then again to produce them. The bar's total is now the file's size, and it advances by the bytes
    of each line done."""
    path = tmp_path / "commands.jsonl"
    with path.open("w") as file:  # blank lines (read, nothing to produce): a second or more of reading
        file.write("\n" * 2_000_000)
        file.write("".join(command(f"k{i}") + "\n" for i in range(5)))
        file.write("\n\n")
    # As on a terminal, so that the bar is drawn.
    proc = start(env | {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "NO_COLOR": "1"}, "--file", str(path))
    offsets: list[int] = []

    def ended() -> bool:
        offset = _read_offset(proc.pid, path)
        if offset is not None:
            offsets.append(offset)
        return proc.poll() is not None

    wait_for(ended, 120, "produce to end", interval_s=0.01)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (summary(out, err)["produced"], summary(out, err)["failed"]) == (5, 0)
    assert len(offsets) > 1 and offsets == sorted(offsets), "the file was read from its start again"
    assert produced_keys(settings) == [f"k{i}" for i in range(5)]
    # The bar as last drawn: every line and byte done.
    assert re.findall(r"\d[\d,]* lines +\d+%", err)[-1] == "5 lines 100%", err[-2000:]


def _librdkafka_clients(pid: int) -> int:
    """How many librdkafka clients process ``pid`` has made (each has one thread named rdk:main)."""
    try:
        return sum(
            path.read_text().strip() == "rdk:main" for path in Path(f"/proc/{pid}/task").glob("*/comm")
        )
    except OSError:  # a thread ended as we looked
        return 0


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_the_topic_check_stops_produce_within_seconds(
    env: dict[str, str], signum: signal.Signals, status: int
) -> None:
    """Ctrl-C while Kafka was asked whether the commands topic exists waited out the check's 10 s:
    librdkafka's one metadata request held the signal until it returned."""
    proc = start(env | {"SCHEDULER_KAFKA_BOOTSTRAP": "127.0.0.1:1"})  # a closed port: no answer
    # The producer, then the admin client that asks for the topic: the check is under way.
    wait_for(lambda: _librdkafka_clients(proc.pid) >= 2, 60, "the topic check")
    signalled = time.monotonic()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - signalled
    assert proc.returncode == status, err
    assert took < 5, f"it ended {took:.1f} s after the signal"
    produced = summary(out, err)
    assert (produced["produced"], produced["failed"], produced["interrupted"]) == (0, 0, True)
    stopped = "terminated" if signum == signal.SIGTERM else "interrupted"
    assert err.strip().splitlines()[-1].startswith(f"error: {stopped}: the rest of the input"), err
