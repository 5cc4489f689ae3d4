"""One trace per run, from the command that created it to the reconciler that recorded its outcome.

The CLI and every component export over OTLP/HTTP to a real receiver of the test's own, as they
would to a collector; the spans are read from what it received."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.chaos_stack import free_port
from scheduler.config import Settings
from tests.e2e.health import cli, cli_json, wait_for_statuses
from tests.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from tests.support import Component, components, wait_for

pytestmark = pytest.mark.e2e

APP = "traced"


@dataclass(frozen=True)
class Traced:
    env: dict[str, str]
    receiver: Receiver
    settings: Settings
    logs: Callable[[], str]


@pytest.fixture
def traced(settings: Settings, settings_env: dict[str, str], tmp_path: Path) -> Iterator[Traced]:
    """Scanner, relay, reconciler and a worker, all exporting to the receiver, all ready."""
    with otlp_receiver() as receiver:
        env = settings_env | {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "SCHEDULER_MAX_SCAN_SLEEP": "0.2",
        }
        cli(env, "init")
        cli(env, "apps", "create", APP, "--partitions", "2")
        ports = {name: free_port() for name in ("scanner", "relay", "reconciler", "worker")}
        env_of = {name: env | {"SCHEDULER_METRICS_PORT": str(port)} for name, port in ports.items()}
        with (
            components(env_of["scanner"], tmp_path, "scanner") as scanner,
            components(env_of["relay"], tmp_path, "relay") as relay,
            components(env_of["reconciler"], tmp_path, "reconciler") as reconciler,
        ):
            worker = Component("worker", env_of["worker"], tmp_path, "--app", APP)

            def logs() -> str:
                every = [*scanner, *relay, *reconciler, worker]
                return "\n".join(f"--- {c.name}\n{c.output()[-2500:]}" for c in every)

            try:
                wait_for_statuses(ports, "/ready", 200, 120, logs)
                yield Traced(env, receiver, settings, logs)
            finally:
                code = worker.stop()
                assert code == 0, worker.output()[-3000:]


def create_now(traced: Traced, handler: str, *extra: str) -> dict[str, Any]:
    schedule: dict[str, Any] = cli_json(
        traced.env, "schedules", "create", "--app", APP, "--now", "--handler", handler, *extra
    )
    return schedule


def the_run(traced: Traced, schedule_id: str, state: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        runs: list[dict[str, Any]] = cli_json(traced.env, "runs", "list", "--schedule", schedule_id, "--json")
        return runs[0] if len(runs) == 1 and runs[0]["state"] == state else None

    run = wait_for(ended, 60, f"the run to be {state}", interval_s=0.5)
    assert run is not None
    return run


@dataclass(frozen=True)
class Chain:
    create: ReceivedSpan
    scheduling: ReceivedSpan
    execution: ReceivedSpan
    process: ReceivedSpan
    trace: list[ReceivedSpan]


def chain_in(spans: list[ReceivedSpan], outcome_topic: str) -> Chain | None:
    """The run's trace once every hop has arrived: create → scheduling → execution → the
    reconciler's processing of the outcome on ``outcome_topic`` (the first, if there are several)."""
    creates = [s for s in spans if s["name"] == "schedule.create"]
    if len(creates) != 1:
        return None
    create = creates[0]
    trace = [s for s in spans if s["trace_id"] == create["trace_id"]]

    def children(parent: ReceivedSpan | None, name: str) -> list[ReceivedSpan]:
        if parent is None:
            return []
        found = [s for s in trace if s["name"] == name and s["parent_span_id"] == parent["span_id"]]
        return sorted(found, key=lambda s: s["start_ns"])

    scheduling = next(iter(children(create, "job.scheduling")), None)
    execution = next(iter(children(scheduling, "job.execution")), None)
    process = next(iter(children(execution, f"process {outcome_topic}")), None)
    if scheduling is None or execution is None or process is None:
        return None
    return Chain(create, scheduling, execution, process, trace)


def wait_for_chain(traced: Traced, outcome_topic: str, also: str | None = None) -> Chain:
    def complete(spans: list[ReceivedSpan]) -> bool:
        chain = chain_in(spans, outcome_topic)
        return chain is not None and (also is None or any(s["name"] == also for s in chain.trace))

    try:
        spans = traced.receiver.wait_for(complete, 60)
    except AssertionError as error:
        received = "\n".join(
            json.dumps({k: v for k, v in span.items() if k not in ("resource", "events", "links")})
            for span in traced.receiver.spans()
        )
        raise AssertionError(f"{error}\n{received}\n{traced.logs()}") from None
    chain = chain_in(spans, outcome_topic)
    assert chain is not None
    for name in ("schedule.create", "job.scheduling", "job.execution"):
        assert len([s for s in chain.trace if s["name"] == name]) == 1, f"one {name} span per run"
    return chain


def check_chain(
    chain: Chain, run: dict[str, Any], handler: str, topic_prefix: str, outcome_topic: str
) -> None:
    assert chain.create["service_name"] == "scheduler-cli"
    roots = [s for s in chain.trace if s["parent_span_id"] == ""]
    assert [s["service_name"] for s in roots] == ["scheduler-cli"], "the CLI's command starts the trace"
    assert chain.scheduling["service_name"] == "scheduler-relay"
    assert chain.execution["service_name"] == "scheduler-worker"
    assert chain.process["service_name"] == "scheduler-reconciler"
    for span in (chain.scheduling, chain.execution):
        attributes = span["attributes"]
        assert attributes.get("job.id") == run["id"], span
        assert attributes.get("job.retry_count") == 0, span
    messaging = [s for s in chain.trace if s["kind"] in ("producer", "consumer")]
    assert chain.process in messaging, chain.process
    for span in messaging:
        assert span["attributes"]["messaging.system"] == "kafka", span
        assert str(span["attributes"]["messaging.destination.name"]).startswith(f"{topic_prefix}."), span
    assert chain.process["attributes"]["messaging.destination.name"] == outcome_topic
    assert chain.process["attributes"].get("scheduler.event.outcome") == "applied", chain.process
    assert all(s["end_ns"] >= s["start_ns"] > 0 for s in chain.trace)
    # The relay publishes bytes it never decodes, so only the worker's span can name the handler.
    assert chain.execution["attributes"].get("job.type") == handler, chain.execution


def test_an_immediate_noop_run_is_one_trace_from_the_cli_to_the_reconciler(traced: Traced) -> None:
    schedule = create_now(traced, "builtin:noop")
    run = the_run(traced, schedule["id"], "succeeded")
    results = traced.settings.results_topic
    chain = wait_for_chain(traced, results)
    check_chain(chain, run, "builtin:noop", traced.settings.topic_prefix, results)
    assert not [s for s in chain.trace if s["name"] == "job.failure"]
    assert chain.execution["status"] != "error"


def test_a_failing_run_adds_a_job_failure_span_to_its_trace(traced: Traced) -> None:
    schedule = create_now(traced, "builtin:fail", "--payload", '{"times": 5}', "--max-attempts", "1")
    run = the_run(traced, schedule["id"], "dead")
    # Its last attempt failed, so the worker's outcome is a dead letter.
    dead_letters = traced.settings.dlq_topic
    chain = wait_for_chain(traced, dead_letters, also="job.failure")
    check_chain(chain, run, "builtin:fail", traced.settings.topic_prefix, dead_letters)
    assert chain.execution["status"] == "error", chain.execution
    failures = [
        s
        for s in chain.trace
        if s["name"] == "job.failure" and s["parent_span_id"] == chain.execution["span_id"]
    ]
    assert len(failures) == 1, "the failed execution has one job.failure span"
    failure = failures[0]
    assert failure["service_name"] == "scheduler-worker"
    assert failure["status"] == "error" and failure["status_message"], failure
    assert failure["attributes"]["error.type"], failure
    # The handler's frames, formatted before the worker let its traceback go.
    for span in (failure, chain.execution):
        [event] = [e for e in span["events"] if e["name"] == "exception"]
        assert "scheduler/worker/handlers.py" in event["attributes"]["exception.stacktrace"], event


def attempts_in(spans: list[ReceivedSpan], trace_id: str, attempts: int) -> list[ReceivedSpan] | None:
    """The trace once each attempt's scheduling, execution and processed outcome have arrived."""
    trace = [s for s in spans if s["trace_id"] == trace_id]
    for name in ("job.scheduling", "job.execution"):
        if len([s for s in trace if s["name"] == name]) < attempts:
            return None
    processed = [s for s in trace if s["name"].startswith("process ")]
    return trace if len(processed) >= attempts else None


def wait_for_attempts(traced: Traced, trace_id: str, attempts: int) -> list[ReceivedSpan]:
    try:
        spans = traced.receiver.wait_for(lambda s: attempts_in(s, trace_id, attempts) is not None, 60)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{traced.logs()}") from None
    trace = attempts_in(spans, trace_id, attempts)
    assert trace is not None
    return trace


def check_one_tree(trace: list[ReceivedSpan], root_name: str) -> ReceivedSpan:
    """One root, named ``root_name``, and every other span's parent recorded in the trace: what a
    trace backend shows as one tree, with no "missing parent"."""
    roots = [s for s in trace if s["parent_span_id"] == ""]
    assert [s["name"] for s in roots] == [root_name], roots
    recorded = {s["span_id"] for s in trace}
    orphans = [s for s in trace if s["parent_span_id"] and s["parent_span_id"] not in recorded]
    assert not orphans, orphans
    return roots[0]


def scheduling_by_attempt(trace: list[ReceivedSpan]) -> dict[int, ReceivedSpan]:
    return {int(s["attributes"]["job.retry_count"]): s for s in trace if s["name"] == "job.scheduling"}


def test_a_retried_one_shot_run_keeps_every_attempt_in_its_creation_trace(traced: Traced) -> None:
    schedule = create_now(
        traced, "builtin:fail", "--payload", '{"times": 1}', "--max-attempts", "2", "--backoff-base", "0.1"
    )
    run = the_run(traced, schedule["id"], "succeeded")
    create, scheduling = both_attempts_in_the_creation_trace(traced, run)
    assert all(s["parent_span_id"] == create["span_id"] for s in scheduling.values())


def both_attempts_in_the_creation_trace(
    traced: Traced, run: dict[str, Any]
) -> tuple[ReceivedSpan, dict[int, ReceivedSpan]]:
    """The schedule.create span, and the job.scheduling span of each of the run's two attempts,
    all in one tree under it."""
    [create] = wait_for(
        lambda: [s for s in traced.receiver.spans() if s["name"] == "schedule.create"] or None, 30, "create"
    )
    trace = wait_for_attempts(traced, create["trace_id"], 2)
    assert check_one_tree(trace, "schedule.create") == create
    scheduling = scheduling_by_attempt(trace)
    assert sorted(scheduling) == [0, 1], "both attempts' scheduling spans are in the creation's trace"
    assert {s["attributes"].get("job.id") for s in scheduling.values()} == {run["id"]}
    return create, scheduling


def test_a_triggered_one_shot_run_keeps_every_attempt_in_its_creation_trace(traced: Traced) -> None:
    """A trigger makes the run a fire would have made: its first attempt and its retry are both in
    the trace the schedule was created in."""
    schedule = cli_json(
        traced.env, "schedules", "create", "--app", APP, "--at", "2099-01-01T00:00:00Z",
        "--handler", "builtin:fail", "--payload", '{"times": 1}', "--max-attempts", "2",
        "--backoff-base", "0.1",
    )  # fmt: skip
    cli(traced.env, "schedules", "trigger", schedule["id"])
    both_attempts_in_the_creation_trace(traced, the_run(traced, schedule["id"], "succeeded"))


def test_a_cron_run_is_a_trace_of_its_own_whose_id_is_the_run_id_with_every_attempt(traced: Traced) -> None:
    schedule = cli_json(
        traced.env, "schedules", "create", "--app", APP, "--cron", "* * * * * *",
        "--handler", "builtin:fail", "--payload", '{"times": 1}', "--max-attempts", "2",
        "--backoff-base", "0.1",
    )  # fmt: skip

    def a_run_succeeded() -> dict[str, Any] | None:
        runs = cli_json(traced.env, "runs", "list", "--schedule", schedule["id"], "--json")
        return next((r for r in runs if r["state"] == "succeeded"), None)

    run = wait_for(a_run_succeeded, 60, "a fire of the cron schedule to succeed on its second attempt", 0.5)
    cli(traced.env, "schedules", "pause", schedule["id"])
    trace = wait_for_attempts(traced, uuid.UUID(run["id"]).hex, 2)
    root = check_one_tree(trace, "job.scheduling")
    assert root["service_name"] == "scheduler-relay"
    assert root["attributes"]["job.retry_count"] == 0, "the first attempt's scheduling is the root"
    scheduling = scheduling_by_attempt(trace)
    assert sorted(scheduling) == [0, 1]
    assert scheduling[1]["parent_span_id"] == root["span_id"], "a retry hangs from the run's root"
    executions = sorted((s for s in trace if s["name"] == "job.execution"), key=lambda s: s["start_ns"])
    assert [s["status"] == "error" for s in executions] == [True, False]
