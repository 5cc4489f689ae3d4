"""The manifests read as a stranger would, against what the code really does with them.

The static checks (``check.py``) hold the manifests to the code's names, ports and probes, and the
podman run (``test_manifests_run.py``) starts their containers, but neither gives a container the
memory limit its manifest sets. Here a component runs as a process against the local stack, on the
load its documentation says it takes, and its peak resident memory (``VmHWM``) is held to the
limit every overlay gives its container: past it, Kubernetes kills the container (OOMKilled), and
a restarted one reads the same uncommitted batch and is killed again.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from google.protobuf import json_format

from bench.chaos_stack import free_port
from scheduler.api.service import METHODS
from scheduler.client import ScheduleClient
from scheduler.config import Settings
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect
from scheduler.v1 import scheduler_pb2_grpc
from tests.api.client import SECRET, token
from tests.deploy.manifests import K8S, OVERLAYS, main_container, named, render
from tests.support import SCHEDULER, Component, peak_rss, wait_for, watermarks

pytestmark = pytest.mark.integration

APP = "bulk"
MIB = 1024 * 1024
# A payload near the 1 MiB a schedule may carry (docs/api.md, DESIGN.md "Data model"), as the
# scanner's and relay's byte bounds were measured with (bench/README.md, "Batches bounded in bytes").
PAD_CHARS = 900_000
_QUANTITY_RE = re.compile(r"^(\d+)(Ki|Mi|Gi)?$")
_UNITS = {None: 1, "Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB}


def memory_limit(deployment: str) -> tuple[int, str]:
    """The smallest memory limit any overlay gives the main container of ``deployment``, in bytes,
    and where it is."""
    limits: list[tuple[int, str]] = []
    for overlay in OVERLAYS:
        container = main_container(named(render(K8S / "overlays" / overlay), "Deployment", deployment))
        quantity = str(container["resources"]["limits"]["memory"])
        match = _QUANTITY_RE.match(quantity)
        assert match is not None, f"{overlay}: {deployment}'s memory limit {quantity!r} is not read here"
        limits.append(
            (
                int(match[1]) * _UNITS[match[2]],
                f"k8s/overlays/{overlay}: {deployment} limits.memory {quantity}",
            )
        )
    return min(limits)


def within_limit(component: Component, done: Callable[[], bool], what: str, load: str) -> None:
    """Run ``component`` until ``done()`` (``what``), stop it (it must exit 0), and hold its peak
    resident memory to the limit every overlay gives its Deployment."""
    limit, where = memory_limit(f"scheduler-{component.name}")
    try:
        wait_for(done, 240, what, interval_s=0.5)
        peak = peak_rss(component)
    finally:
        code = component.stop()
    assert code == 0, component.output()[-3000:]
    assert peak <= limit, (
        f"the {component.name} peaked at {peak / MIB:.0f} MiB applying {load}; {where}: Kubernetes "
        "kills it (OOMKilled), and the restarted one reads the same batch again"
    )


def count(settings: Settings, table_and_filter: str) -> int:
    with connect(settings.database_url) as conn:
        row = conn.execute(f"select count(*) as n from {table_and_filter}").fetchone()
    assert row is not None and isinstance(row["n"], int)
    return row["n"]


def init_app(settings_env: dict[str, str]) -> None:
    """What the migration Job and the app's Job run: `scheduler init`, `scheduler apps create`."""
    for args in (["init"], ["apps", "create", APP, "--partitions", "6"]):
        done = subprocess.run(
            [SCHEDULER, *args], env=settings_env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr


def test_the_ingestor_applies_a_bulk_of_large_commands_within_its_containers_memory_limit(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    """A service creates 100 schedules through Kafka (docs/api.md, scheduler.client), each with a
    payload of 900 KB: 90 MB of commands, which the commands topic takes (8 MiB a message).

    The ingestor decodes the next batch while it applies the one before: when its batches were
    bounded by count only (2,000), its memory grew with the commands' bytes, to 569 MiB at its peak,
    over the 384Mi both overlays give its container. They are bounded in bytes too (16 MiB)."""
    commands = 100
    init_app(settings_env)
    payload = {"pad": "x" * PAD_CHARS}
    with ScheduleClient.from_settings(settings) as client:
        for i in range(commands):
            client.create(key=f"bulk-{i}", app=APP, cron="0 0 1 1 *", handler="builtin:noop", payload=payload)
    within_limit(
        Component("ingestor", settings_env, tmp_path),
        lambda: count(settings, "schedules") >= commands,
        "every command applied",
        f"{commands} commands of {PAD_CHARS // 1000} KB",
    )


def test_the_reconciler_applies_a_backlog_of_large_dead_letters_within_its_containers_memory_limit(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    """600 one-shot jobs with payloads of 900 KB fail for good (builtin:fail, not retryable) while
    the reconciler is down or restarting; each dead letter carries its job's bytes (architecture.md).

    Read in batches bounded by count only (2,000), with librdkafka prefetching 64 MiB a partition,
    the backlog took the reconciler to 590-740 MiB, over the 512Mi its container had; batches of
    16 MiB and a prefetch of 1 MiB a partition peak near 540 MiB, within the 768Mi it has now."""
    letters = 600
    init_app(settings_env)
    payload = {"times": 1, "retryable": False, "pad": "x" * PAD_CHARS}
    with connect(settings.database_url) as conn:
        for _ in range(letters):
            spec = ScheduleSpec(
                app=APP, handler="builtin:fail", kind="immediate", payload=payload, max_attempts=1
            )
            service.create_schedule(conn, spec, "test")
        conn.commit()
    pipeline = [
        Component("scanner", settings_env, tmp_path),
        Component("relay", settings_env, tmp_path),
        Component("worker", settings_env, tmp_path, "--app", APP),
    ]
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"{settings.topic_prefix}.t"}
    )
    try:
        partitions = (
            consumer.list_topics(settings.dlq_topic, timeout=30).topics[settings.dlq_topic].partitions
        )

        def dead_lettered() -> int:
            return sum(watermarks(consumer, TopicPartition(settings.dlq_topic, p))[1] for p in partitions)

        wait_for(lambda: dead_lettered() >= letters, 240, "every job dead-lettered", interval_s=0.5)
    finally:
        consumer.close()
        codes = {component.name: component.stop() for component in pipeline}
    assert set(codes.values()) == {0}, codes
    within_limit(
        Component("reconciler", settings_env, tmp_path),
        lambda: count(settings, "runs where state = 'dead'") >= letters,
        "every dead letter applied",
        f"{letters} dead letters of jobs of {PAD_CHARS // 1000} KB",
    )


def test_the_api_takes_concurrent_large_grpc_batches_within_its_containers_memory_limit(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    """A loader creates schedules in batches of 30 with payloads of 900 KB (27 MiB a message, under
    the 32 MiB gRPC takes), 20 at once on one channel, as docs/api.md allows an admitted caller.

    Over 4 MiB, batches are applied one at a time, and over gRPC at most four wait received, the
    others unread (docs/api.md, "Operating it"). When each waiting one was held received, the API's
    memory grew with the callers: 940-1,257 MiB at its peak, over the 768Mi its container had (set
    from eight at once over HTTP, whose bodies wait unread); it no longer does."""
    limit, where = memory_limit("scheduler-api")
    batches = 20
    init_app(settings_env)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    api = Component(
        "api", settings_env | {"SCHEDULER_JWT_SECRET": SECRET}, tmp_path,
        "--port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
    )  # fmt: skip

    def serving() -> bool:
        assert api.proc.poll() is None, api.output()[-3000:]
        try:
            return httpx.get(f"http://127.0.0.1:{http_port}/v1/health", timeout=2, trust_env=False).is_success
        except httpx.HTTPError:
            return False

    bearer = token(subject="loader")
    request = {
        "schedules": [
            {"app": APP, "handler": "builtin:noop", "cron_expression": "0 6 * * *", "name": f"bulk-{i}"}
            | {"payload": {"pad": "x" * PAD_CHARS}}
            for i in range(30)
        ]
    }
    channel = grpc.insecure_channel(
        f"127.0.0.1:{grpc_port}",
        options=[("grpc.max_send_message_length", 64 * MIB), ("grpc.max_receive_message_length", 64 * MIB)],
    )
    stub: Any = scheduler_pb2_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]

    def create(n: int) -> str:
        batch = {"schedules": [s | {"name": f"{s['name']}-{n}"} for s in request["schedules"]]}
        message = json_format.ParseDict(batch, METHODS["CreateSchedules"].request())
        try:
            stub.CreateSchedules(message, metadata=[("authorization", f"Bearer {bearer}")], timeout=240)
        except grpc.RpcError as error:
            return str(error.code())
        return "OK"

    try:
        wait_for(serving, 60, "the API to serve")
        with ThreadPoolExecutor(batches) as pool:
            outcomes = list(pool.map(create, range(batches)))
        peak = peak_rss(api)
    finally:
        channel.close()
        code = api.stop()
    assert code == 0, api.output()[-3000:]
    assert outcomes == ["OK"] * batches, outcomes
    assert peak <= limit, (
        f"the API peaked at {peak / MIB:.0f} MiB taking {batches} gRPC batches of 27 MiB at once; {where}: "
        "Kubernetes kills it (OOMKilled), failing every call in flight"
    )
