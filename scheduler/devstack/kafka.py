"""The local Apache Kafka: one KRaft process that is both broker and controller.

Its jars are resolved by Maven from ``stack/pom.xml`` into ``.stack/kafka-libs`` the first time
(and whenever that folder is incomplete); the broker runs on the machine's Java 17+ with a
single-node configuration whose internal topics all have replication factor 1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

from scheduler.devstack.process import (
    ProcessStatus,
    StackError,
    owned_pid,
    require_free_port,
    stale_pid,
    terminate,
    wait_until,
)
from scheduler.kafka.transport import KafkaUnavailable, TopicAdmin

MIN_JAVA = 17
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
DEFAULT_POM = Path(__file__).resolve().parents[2] / "stack" / "pom.xml"

SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=12
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.heartbeat.interval.ms=500
log.retention.hours=24
log.segment.bytes=67108864
"""

LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


def java_command() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise StackError(f"Java {MIN_JAVA}+ is required to run Kafka: no 'java' on PATH (or set JAVA_HOME)")
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if proc.returncode != 0 or match is None:
        raise StackError(f"cannot tell the version of {java}: {(proc.stderr or proc.stdout).strip()[:200]}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0" style
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise StackError(f"Kafka 4 needs Java {MIN_JAVA}+, but {java} is Java {major} (set JAVA_HOME)")
    return java


class LocalKafka:
    def __init__(self, stack_dir: Path, port: int, controller_port: int) -> None:
        self.root = stack_dir / "kafka"
        self.libs = stack_dir / "kafka-libs"
        self.data = self.root / "data"
        self.config = self.root / "server.properties"
        self.log4j = self.root / "log4j2.properties"
        self.log = self.root / "kafka.log"
        self.pid_file = self.root / "kafka.pid"
        self.port = port
        self.controller_port = controller_port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        # The broker's command line names our config file, which lies inside this stack's folder.
        return owned_pid(self.pid_file, str(self.config))

    def answers(self) -> bool:
        # Quiet: a broker that is not up yet is the expected answer here, not worth a log line.
        try:
            TopicAdmin(self.bootstrap, quiet=True).ping(timeout_s=2)
        except KafkaUnavailable:
            return False
        return True

    def preflight(self) -> str | None:
        """Check what start-up needs before anything starts; returns the java to use, or None if up."""
        if self.pid() is not None:
            return None
        java = java_command()
        require_free_port(self.port, "Kafka", "SCHEDULER_KAFKA_PORT")
        require_free_port(self.controller_port, "Kafka's controller", "SCHEDULER_KAFKA_CONTROLLER_PORT")
        self.resolve_jars()
        return java

    def resolve_jars(self) -> None:
        """Copy Kafka and its dependencies from Maven Central, once."""
        pom = Path(os.environ.get("SCHEDULER_KAFKA_POM") or DEFAULT_POM)
        marker = self.libs / ".resolved"
        if marker.exists() and marker.read_text() == pom.read_text():
            return
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StackError("Maven ('mvn') is required to resolve Kafka's jars from Maven Central")
        if self.libs.exists():
            shutil.rmtree(self.libs)
        proc = subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                "-Dstyle.color=never",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={self.libs}",
                "-DincludeScope=runtime",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            output = _ANSI_RE.sub("", proc.stdout + "\n" + proc.stderr)
            errors = [
                line.removeprefix("[ERROR]").strip()
                for line in output.splitlines()
                if line.startswith("[ERROR]") and line.removeprefix("[ERROR]").strip()
            ]
            reason = errors[0] if errors else (output.strip().splitlines() or ["no output"])[-1]
            raise StackError(f"Maven could not resolve Kafka from {pom}: {reason[:400]}")
        marker.write_text(pom.read_text())

    def _java(self, java: str, jvm_options: list[str], main: str, *args: str) -> list[str]:
        return [
            java,
            *jvm_options,
            f"-Dlog4j2.configurationFile={self.log4j}",
            "-cp",
            f"{self.libs}/*",
            main,
            *args,
        ]

    def remove_stale_pid_file(self) -> int | None:
        """Forget a pid file whose process is gone; returns that pid (-1 if unreadable)."""
        stale = stale_pid(self.pid_file, str(self.config))
        if stale is not None:
            self.pid_file.unlink()
        return stale

    def up(self, java: str | None) -> None:
        """Start the broker (``java`` from :meth:`preflight`) and wait until it answers."""
        if java is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            self.config.write_text(
                SERVER_PROPERTIES.format(port=self.port, controller_port=self.controller_port, data=self.data)
            )
            self.log4j.write_text(LOG4J2_PROPERTIES)
            if not (self.data / "meta.properties").exists():
                fmt = subprocess.run(
                    self._java(
                        java,
                        ["-Xmx256m"],
                        "kafka.tools.StorageTool",
                        "format",
                        "-t",
                        str(uuid.uuid4()),
                        "-c",
                        str(self.config),
                        "--ignore-formatted",
                    ),
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if fmt.returncode != 0:
                    reason = (fmt.stderr.strip() or fmt.stdout.strip() or "no output").splitlines()[-1]
                    raise StackError(f"formatting Kafka's storage failed: {reason}")
            with self.log.open("ab") as log:
                proc = subprocess.Popen(
                    self._java(
                        java,
                        ["-Xmx1g", "-Xms256m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"],
                        "kafka.Kafka",
                        str(self.config),
                    ),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.pid_file.write_text(f"{proc.pid}\n")
        wait_until(self.answers, 90, "Kafka", alive=lambda: self.pid() is not None, log=self.log)

    def down(self) -> None:
        pid = self.pid()
        if pid is not None:
            terminate(pid, timeout_s=30)
        self.pid_file.unlink(missing_ok=True)

    def status(self) -> ProcessStatus:
        pid = self.pid()
        stale = stale_pid(self.pid_file, str(self.config))
        if stale is not None:
            return ProcessStatus(
                "kafka", False, None, self.port, f"stale pid file {self.pid_file} (pid {stale})"
            )
        running = pid is not None and self.answers()
        return ProcessStatus("kafka", running, pid, self.port, self.bootstrap if running else "")
