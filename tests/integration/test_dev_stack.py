"""`scheduler dev`: the local stack reports itself truthfully and fails with one clear line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from bench.chaos_stack import free_port
from scheduler.devstack.process import is_alive

pytestmark = pytest.mark.integration

SCHEDULER = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "scheduler")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDULER, *args], env=env, capture_output=True, text=True, check=False, timeout=300
    )


@pytest.fixture
def other_stack(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a second, never-started stack in its own folder and on its own ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")} | {
        "SCHEDULER_STACK_DIR": str(tmp_path / "stack"),
        "SCHEDULER_PG_PORT": str(free_port()),
        "SCHEDULER_KAFKA_PORT": str(free_port()),
        "SCHEDULER_KAFKA_CONTROLLER_PORT": str(free_port()),
    }
    yield env
    run("dev", "down", env=env)


def test_status_and_env_describe_the_running_stack(stack: object) -> None:
    exports = dict(
        line.removeprefix("export ").split("=", 1) for line in run("dev", "env").stdout.splitlines()
    )
    assert set(exports) == {"SCHEDULER_DATABASE_URL", "SCHEDULER_KAFKA_BOOTSTRAP"}
    # The suite's stack, brought up by the suite (or by `make up`) and named in the environment of
    # processes that share it, is the project's own; one named there that is not, is someone else's.
    if (
        os.environ.get("SCHEDULER_DATABASE_URL", exports["SCHEDULER_DATABASE_URL"])
        != exports["SCHEDULER_DATABASE_URL"]
    ):
        pytest.skip("the suite runs against an external stack, not the project's own")
    status = run("dev", "status")
    assert status.returncode == 0
    lines = status.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["postgres", "running"], ["kafka", "running"]]
    assert exports["SCHEDULER_KAFKA_BOOTSTRAP"].startswith("127.0.0.1:")
    # An independent client (not our transport layer) reaches the broker the env lines name.
    metadata = AdminClient({"bootstrap.servers": exports["SCHEDULER_KAFKA_BOOTSTRAP"]}).list_topics(
        timeout=10
    )
    assert metadata.brokers


def test_a_port_in_use_is_one_clear_line_and_nothing_starts(other_stack: dict[str, str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", int(other_stack["SCHEDULER_PG_PORT"])))
        busy.listen()
        done = run("dev", "up", env=other_stack)
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1
    assert "already in use" in done.stderr and "SCHEDULER_PG_PORT" in done.stderr
    assert not (Path(other_stack["SCHEDULER_STACK_DIR"]) / "postgres" / "data").exists()


def test_missing_java_is_one_clear_line(other_stack: dict[str, str], tmp_path: Path) -> None:
    env = other_stack | {"JAVA_HOME": str(tmp_path / "no-jdk")}
    done = run("dev", "up", env=env)
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1
    assert "Java 17+ is required" in done.stderr


def test_java_too_old_is_one_clear_line(other_stack: dict[str, str], tmp_path: Path) -> None:
    # A launcher that reports Java 11, to see the version check refuse it.
    fake = tmp_path / "jdk11" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.21\" 2023-10-17' >&2\n")
    fake.chmod(0o755)
    done = run("dev", "up", env=other_stack | {"JAVA_HOME": str(fake.parent.parent)})
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1
    assert "needs Java 17+" in done.stderr and "Java 11" in done.stderr


def test_maven_failure_carries_mavens_reason(other_stack: dict[str, str], tmp_path: Path) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text(
        """<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
        <groupId>t</groupId><artifactId>t</artifactId><version>1</version><packaging>pom</packaging>
        <dependencies><dependency><groupId>org.apache.kafka</groupId>
        <artifactId>kafka_2.13</artifactId><version>0.0.0-no-such-version</version></dependency>
        </dependencies></project>"""
    )
    done = run("dev", "up", env=other_stack | {"SCHEDULER_KAFKA_POM": str(pom)})
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1
    assert "Maven could not resolve Kafka" in done.stderr
    assert "0.0.0-no-such-version" in done.stderr


def test_stale_pid_file_is_reported_and_cleared(other_stack: dict[str, str]) -> None:
    kafka_dir = Path(other_stack["SCHEDULER_STACK_DIR"]) / "kafka"
    kafka_dir.mkdir(parents=True)
    # A pid that cannot be ours: the process is long gone.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (kafka_dir / "kafka.pid").write_text(f"{dead.pid}\n")
    status = run("dev", "status", env=other_stack)
    assert "kafka     stopped" in status.stdout
    assert f"stale pid file {kafka_dir / 'kafka.pid'} (pid {dead.pid})" in status.stdout
    assert run("dev", "down", env=other_stack).returncode == 0
    assert not (kafka_dir / "kafka.pid").exists()


def processes_naming(marker: str) -> list[int]:
    """Live processes whose command line names ``marker`` (a stack folder)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if marker in text and is_alive(int(cmdline.parent.name)):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_up_is_idempotent_and_down_leaves_nothing_behind(other_stack: dict[str, str]) -> None:
    first = run("dev", "up", env=other_stack)
    assert first.returncode == 0, first.stderr
    again = run("dev", "up", env=other_stack)
    assert again.returncode == 0 and again.stdout == first.stdout, "a second up changes nothing"
    status = run("dev", "status", "--json", env=other_stack)
    parts = {p["name"]: p for p in json.loads(status.stdout)}
    assert parts["postgres"]["running"] and parts["kafka"]["running"]
    assert parts["kafka"]["port"] == int(other_stack["SCHEDULER_KAFKA_PORT"])
    pids = [parts["postgres"]["pid"], parts["kafka"]["pid"]]
    assert all(is_alive(pid) for pid in pids)

    assert run("dev", "down", env=other_stack).returncode == 0
    stack_dir = other_stack["SCHEDULER_STACK_DIR"]
    assert processes_naming(stack_dir) == []
    assert not any(is_alive(pid) for pid in pids)
    stopped = {
        p["name"]: p["running"] for p in json.loads(run("dev", "status", "--json", env=other_stack).stdout)
    }
    assert stopped == {"postgres": False, "kafka": False}
