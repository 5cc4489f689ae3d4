"""The worker alone: N ready job messages on the topic, W worker processes, time to all outcomes.

Separates the worker's own cost from the scanner, relay and reconciler's, for profiling:

    python -m bench.worker_only --jobs 20000 --workers 1
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime, timedelta

from confluent_kafka import Consumer, TopicPartition

from bench.common import (
    RESULTS,
    component_env,
    isolated_settings,
    positive_int,
    run_main,
    running,
    wait_until,
)
from bench.cost import ComponentCpu
from scheduler.kafka.messages import ATTEMPT_HEADER, RUN_ID_HEADER, JobMessage, RetryPolicy
from scheduler.kafka.tracing import HEADER
from scheduler.kafka.transport import OutgoingMessage
from scheduler.telemetry.tracing import new_traceparent
from scheduler.wiring import Wiring


def results_count(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-count"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in range(partitions)
        )
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=positive_int, default=20_000)
    parser.add_argument("--workers", type=positive_int, default=1)
    parser.add_argument("--concurrency", type=positive_int, default=64)
    args = parser.parse_args()
    with isolated_settings("worker") as settings:
        wiring = Wiring(settings)
        topic = settings.jobs_topic("bench")
        wiring.admin.ensure_topics([topic], partitions=12)
        codec = wiring.codec
        now = datetime.now(UTC)
        messages = []
        for _ in range(args.jobs):
            run_id = uuid.uuid4()
            job = JobMessage(
                run_id=run_id, schedule_id=uuid.uuid4(), app="bench", attempt=1, idempotency_key=str(run_id),
                scheduled_for=now, handler="builtin:noop", payload="{}", timeout_ms=60_000,
                deadline=now + timedelta(hours=1), retry=RetryPolicy(max_attempts=3, backoff_base_ms=1000,
                backoff_max_ms=60_000),
            )  # fmt: skip
            # The headers the scanner and the relay give a job: its trace, its run and its attempt.
            headers: list[tuple[str, str | bytes | None]] = [
                (HEADER, new_traceparent()), (RUN_ID_HEADER, str(run_id)), (ATTEMPT_HEADER, "1")
            ]  # fmt: skip
            messages.append(OutgoingMessage(topic, codec.encode(job), run_id.bytes, headers))
        wiring.producer("bench").send(messages)
        commands = [["worker", "--app", "bench", "--concurrency", str(args.concurrency)]] * args.workers

        def events() -> int:
            return results_count(settings.kafka_bootstrap, settings.results_topic, 6)

        with running(commands, component_env(settings), RESULTS / "logs" / "worker_only") as procs:
            started = time.monotonic()
            # The CPU from the first outcome on: the interpreter's start and imports are not the jobs'.
            wait_until(lambda: events() > 0, 120, 0.1)
            cpu = ComponentCpu({"workers": [p.pid for p in procs]})
            cpu.start()
            counted_from = events()
            # Two events per job on .results: its start (which gives the run its lease) and its success.
            done = wait_until(lambda: events() >= 2 * args.jobs, 600, 0.2)
            # The workers' own user + system CPU (all their threads) per job they ran meanwhile.
            cpu_s = cpu.spent()["workers"]
        cpu_ms_per_job = cpu_s * 1000 / max(1.0, args.jobs - counted_from / 2)
        elapsed = done - started
        rate = args.jobs / elapsed
        print(
            f"{args.jobs} jobs, {args.workers} worker(s) x {args.concurrency}: {rate:.0f} jobs/s, "
            f"{cpu_ms_per_job:.3f} ms of worker CPU per job"
        )


if __name__ == "__main__":
    run_main(main)
