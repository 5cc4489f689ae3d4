"""Structured logs: the fields an operator filters on, the redaction, and the configuration errors."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg_pool
import pytest
from opentelemetry.sdk.trace import TracerProvider

from scheduler.telemetry import redact
from scheduler.telemetry.logs import (
    JOB_OUTCOMES_LOGGER,
    configure_logging,
    job_outcomes,
    log_context,
)
from scheduler.telemetry.redact import MASK, Redactor
from tests.support import wait_for

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ENV = ("SCHEDULER_LOG_FORMAT", "SCHEDULER_LOG_LEVEL", "SCHEDULER_LOG_JOB_OUTCOMES", "SCHEDULER_REDACT_KEYS")
TOUCHED = ("", JOB_OUTCOMES_LOGGER, "httpx", "httpcore", "urllib3")

log = logging.getLogger("scheduler.worker.test")


@pytest.fixture(autouse=True)
def clean_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    handlers = list(root.handlers)
    levels = {name: logging.getLogger(name).level for name in TOUCHED}
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    redact.install(Redactor())


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def configured(**kwargs: Any) -> io.StringIO:
    stream = io.StringIO()
    configure_logging("worker", stream=stream, **kwargs)
    return stream


def test_a_json_line_has_the_fields_operators_filter_on() -> None:
    stream = configured()
    log.info("run %s finished", "r1")
    (line,) = json_lines(stream)
    assert TIMESTAMP.match(line["timestamp"])
    assert line["level"] == "INFO"
    assert line["component"] == "worker"
    assert line["logger"] == "scheduler.worker.test"
    assert line["message"] == "run r1 finished"
    # Outside a span and a job there is nothing to tie the line to.
    for absent in ("trace_id", "span_id", "app", "schedule_id", "run_id", "attempt", "error"):
        assert absent not in line


def test_the_trace_and_span_ids_are_those_of_the_current_span() -> None:
    stream = configured()
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("job.execution") as span:
        log.info("inside")
        context = span.get_span_context()
    log.info("outside")
    inside, outside = json_lines(stream)
    assert inside["trace_id"] == format(context.trace_id, "032x")
    assert inside["span_id"] == format(context.span_id, "016x")
    assert re.fullmatch(r"[0-9a-f]{32}", inside["trace_id"]) and re.fullmatch(
        r"[0-9a-f]{16}", inside["span_id"]
    )
    assert "trace_id" not in outside


def test_the_job_ids_come_from_the_context_and_an_explicit_extra_wins() -> None:
    stream = configured()
    schedule_id, run_id = uuid.uuid4(), uuid.uuid4()
    with log_context(app="billing", schedule_id=schedule_id, run_id=run_id), log_context(attempt=2):
        job_outcomes.info("succeeded")
        job_outcomes.info("succeeded", extra={"attempt": 3})
    log.info("after")
    first, explicit, after = json_lines(stream)
    assert first["app"] == "billing"
    assert first["schedule_id"] == str(schedule_id)
    assert first["run_id"] == str(run_id)
    assert first["attempt"] == 2
    assert first["logger"] == JOB_OUTCOMES_LOGGER
    assert explicit["attempt"] == 3
    assert "app" not in after and "run_id" not in after


def test_the_context_follows_asyncio_tasks_and_copied_threads_and_does_not_leak_back() -> None:
    stream = configured()

    async def job(attempt: int) -> None:
        with log_context(attempt=attempt):
            await asyncio.sleep(0)
            log.info("in task")

    async def main() -> None:
        with log_context(app="billing", run_id="r-1"):
            await asyncio.gather(asyncio.create_task(job(1)), asyncio.create_task(job(2)))
            log.info("in parent")

    asyncio.run(main())
    with log_context(app="mail"):
        thread = threading.Thread(target=contextvars.copy_context().run, args=(log.info, "in thread"))
    thread.start()
    thread.join()

    *tasks, parent, in_thread = json_lines(stream)
    assert sorted(line["attempt"] for line in tasks) == [1, 2]
    assert all(line["app"] == "billing" and line["run_id"] == "r-1" for line in tasks)
    assert parent["app"] == "billing" and "attempt" not in parent
    assert in_thread["app"] == "mail" and "run_id" not in in_thread


def test_an_exception_is_rendered_as_error_fields_with_its_secrets_redacted() -> None:
    stream = configured()
    try:
        raise ConnectionError("cannot reach postgresql://app:hunter2@db:5432/sched")
    except ConnectionError:
        log.exception("store unavailable, token=abc123")
    raw = stream.getvalue()
    assert "hunter2" not in raw and "abc123" not in raw
    (line,) = json_lines(stream)
    assert line["level"] == "ERROR"
    assert line["message"] == f"store unavailable, token={MASK}"
    assert line["error"]["type"] == "ConnectionError"
    assert line["error"]["message"] == f"cannot reach postgresql://app:{MASK}@db:5432/sched"
    assert line["error"]["stack_trace"].startswith("Traceback (most recent call last):")
    assert f"postgresql://app:{MASK}@db" in line["error"]["stack_trace"]


def test_extras_are_redacted_and_payloads_described_never_shown() -> None:
    stream = configured()

    class Target:
        def __str__(self) -> str:
            return "https://hooks.example.com/x?sig=deadbeef"

    log.info(
        "dispatched",
        extra={
            "outcome": "succeeded",
            "duration_seconds": 0.25,
            "options": {"endpoint": "https://u:pw1@example.com/", "auth": {"api_key": "k-1"}},
            "client_secret": "s3",
            "dsn": "postgresql://app:pw2@db/sched",
            "payload": '{"card": "4111111111111111", "amount": 5}',
            "target": Target(),
        },
    )
    raw = stream.getvalue()
    for secret in ("pw1", "k-1", "s3", "pw2", "4111111111111111", "deadbeef"):
        assert secret not in raw
    (line,) = json_lines(stream)
    assert line["outcome"] == "succeeded" and line["duration_seconds"] == 0.25
    assert line["options"] == {"endpoint": f"https://u:{MASK}@example.com/", "auth": {"api_key": MASK}}
    assert line["client_secret"] == MASK
    assert line["dsn"] == f"postgresql://app:{MASK}@db/sched"
    assert line["payload"].startswith("JSON object with 2 keys [amount, card]")
    assert line["target"] == f"https://hooks.example.com/x?sig={MASK}"


def test_the_configured_sensitive_keys_reach_the_log_and_the_exported_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCHEDULER_REDACT_KEYS", "iban")
    stream = configured()
    log.info("refund iban=DE89370400440532013000", extra={"customer_iban": "DE89"})
    (line,) = json_lines(stream)
    assert line["message"] == f"refund iban={MASK}"
    assert line["customer_iban"] == MASK
    assert redact.redact_text("iban: DE89") == f"iban: {MASK}"


def test_human_format_is_one_readable_line_with_the_context_and_a_redacted_traceback() -> None:
    stream = configured(fmt="human")
    with log_context(app="billing", run_id="r-1"):
        try:
            raise RuntimeError("sasl.password=hunter2 rejected")
        except RuntimeError:
            log.exception("produce failed")
    text = stream.getvalue()
    first, *rest = text.splitlines()
    with pytest.raises(json.JSONDecodeError):
        json.loads(first)
    assert re.match(
        r"^\S+Z ERROR +worker scheduler\.worker\.test: produce failed +app=billing run_id=r-1$", first
    )
    assert rest[0] == "Traceback (most recent call last):"
    assert "hunter2" not in text and f"sasl.password={MASK}" in text


def test_a_human_line_shows_terminal_controls_in_what_it_quotes_as_escapes() -> None:
    """A schedule's name or a handler's error in a line on an operator's terminal cannot clear the
    screen, rewrite the lines above or reverse the text; the JSON lines keep the text as it is."""
    name = "n\x1b[2J\x1b[1A\u202eb\x9bc"
    stream = configured(fmt="human")
    log.warning("schedule %s is in error", name, extra={"reason": name})
    text = stream.getvalue()
    assert not {"\x1b", "\x9b", "\u202e"} & set(text)
    assert "schedule n\\x1b[2J\\x1b[1A\\u202eb\\x9bc is in error" in text
    stream = configured()
    log.warning("schedule %s is in error", name)
    assert json_lines(stream)[0]["message"] == f"schedule {name} is in error"


@pytest.mark.parametrize("fmt", ["json", "human"])
def test_a_pool_that_cannot_reach_postgresql_warns_in_one_line_with_its_reason(fmt: str) -> None:
    """While PostgreSQL is down the API's pool warns of every connection it fails to make, quoting
    libpq's error, which spans two lines: the human line went on over a second, and the message
    carried the line break, in both formats."""
    stream = configured(fmt=fmt)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection to it is refused
        port = closed.getsockname()[1]
        pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
            f"postgresql://scheduler@127.0.0.1:{port}/scheduler", min_size=1, name="api", open=False
        )
        pool.open(wait=False)
        try:
            wait_for(lambda: "psycopg.pool" in stream.getvalue(), 10, "the pool's warning")
        finally:
            pool.close()
    lines = [line for line in stream.getvalue().splitlines() if line]
    if fmt == "json":
        records = [json.loads(line) for line in lines]
        messages = [record["message"] for record in records if record["logger"] == "psycopg.pool"]
    else:  # every line is a record's first
        assert all(re.match(r"^\S+Z [A-Z]+ +worker \S+: ", line) for line in lines), lines
        messages = [line for line in lines if " psycopg.pool: " in line]
    assert messages and all("\n" not in message and "\t" not in message for message in messages)
    assert all(
        "Connection refused; Is the server running on that host and accepting TCP/IP connections?" in message
        for message in messages
    ), messages


def test_auto_is_human_on_a_terminal_and_json_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    configure_logging("worker", stream=terminal)
    log.info("hello")
    assert terminal.getvalue().split()[1:4] == ["INFO", "worker", "scheduler.worker.test:"]

    monkeypatch.setenv("SCHEDULER_LOG_FORMAT", "json")
    terminal = Terminal()
    configure_logging("worker", stream=terminal)
    log.info("hello")
    assert json.loads(terminal.getvalue())["message"] == "hello"

    monkeypatch.setenv("SCHEDULER_LOG_FORMAT", "human")
    assert " INFO " in _one_line(configured())
    # An explicit argument overrides the environment.
    assert json.loads(_one_line(configured(fmt="json")))["level"] == "INFO"


def _one_line(stream: io.StringIO) -> str:
    log.info("hello")
    return stream.getvalue()


def test_configuring_again_replaces_the_handler() -> None:
    first = configured()
    second = configured()
    log.info("once")
    assert first.getvalue() == ""
    assert [line["message"] for line in json_lines(second)] == ["once"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SCHEDULER_LOG_FORMAT", "xml"),
        ("SCHEDULER_LOG_LEVEL", "loud"),
        ("SCHEDULER_LOG_JOB_OUTCOMES", "verbose\nplease"),
        ("SCHEDULER_REDACT_KEYS", "ok,(unclosed"),
        ("SCHEDULER_REDACT_KEYS", "(?i)token"),  # compiles alone, not inside the combined pattern
    ],
)
def test_a_bad_environment_value_is_one_line_naming_the_variable_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    before = configured()
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable) as caught:
        configured()
    assert "\n" not in str(caught.value)
    log.info("still here")
    assert json_lines(before)[0]["message"] == "still here"


def test_bad_arguments_are_value_errors_naming_them() -> None:
    with pytest.raises(ValueError, match=r"^fmt must be one of json, human, auto"):
        configured(fmt="yaml")
    with pytest.raises(ValueError, match=r"^level must be one of DEBUG"):
        configured(level="chatty")
    with pytest.raises(ValueError, match="component"):
        configure_logging("")


def test_levels_names_are_case_insensitive_and_an_empty_value_is_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCHEDULER_LOG_LEVEL", "debug")
    monkeypatch.setenv("SCHEDULER_LOG_FORMAT", "")
    stream = configured()
    log.debug("detail")
    assert json_lines(stream)[0]["level"] == "DEBUG"


def test_job_outcomes_have_their_own_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_LOG_LEVEL", "WARNING")
    stream = configured()
    log.info("component chatter")
    job_outcomes.info("run succeeded")
    assert [line["message"] for line in json_lines(stream)] == ["run succeeded"]

    monkeypatch.setenv("SCHEDULER_LOG_JOB_OUTCOMES", "WARNING")
    stream = configured()
    job_outcomes.info("run succeeded")
    job_outcomes.warning("run failed")
    assert [line["message"] for line in json_lines(stream)] == ["run failed"]


def test_http_client_chatter_is_quiet() -> None:
    stream = configured(level="DEBUG")
    logging.getLogger("httpx").info("HTTP Request: GET https://example.com 200")
    logging.getLogger("httpx").warning("retrying")
    assert [line["message"] for line in json_lines(stream)] == ["retrying"]


def test_a_handlers_lines_inside_its_job_mask_its_payload_and_never_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    configure_logging("worker", fmt="json", stream=stream)
    # Ours alone, as in a component: pytest's capturing handler fails a test on a bad format itself.
    root = logging.getLogger()
    ours = [h for h in root.handlers if type(h).__module__ == "scheduler.telemetry.logs"]
    monkeypatch.setattr(root, "handlers", ours)
    payload = json.dumps(
        {"card": "5500005555555559", "items": [{"sku": f"SKU-{n:06d}"} for n in range(20_000)]}
    )
    handler_log = logging.getLogger("billing.charges")

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    with log_context(app="billing", run_id="r1", attempt=1, payload=payload):
        handler_log.warning(
            "charging %s for %s", "5500005555555559", "SKU-000042", extra={"sku": "SKU-019999"}
        )
        handler_log.warning("charging %d", "not a number")  # a bad format fails no job
        handler_log.warning(Unprintable())
        logging.getLogger("scheduler.worker").info("topic billing-SKU-000042 assigned")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["message"] == "charging *** for ***" and lines[0]["sku"] == "***"
    assert lines[1]["message"] == "charging %d (its arguments could not be formatted)"
    assert lines[2]["message"] == "(a message that could not be formatted)"
    assert lines[3]["message"] == "topic billing-SKU-000042 assigned", "the scheduler's own lines are left"
    assert all(line["run_id"] == "r1" for line in lines)


@pytest.mark.parametrize("fmt", ["json", "human"])
def test_an_exception_a_handler_logs_inside_its_job_has_its_payload_masked(
    monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    stream = io.StringIO()
    configure_logging("worker", fmt=fmt, stream=stream)
    root = logging.getLogger()
    ours = [h for h in root.handlers if type(h).__module__ == "scheduler.telemetry.logs"]
    monkeypatch.setattr(root, "handlers", ours)
    card = "5500005555555559"
    with log_context(app="billing", run_id="r1", attempt=1, payload=json.dumps({"card": card})):
        try:
            try:
                raise KeyError(card)
            except KeyError as exc:
                raise ValueError(f"card {card} declined") from exc
        except ValueError:
            logging.getLogger("billing.charges").exception("charge failed")
    logging.getLogger("billing.charges").error("outside a job", exc_info=ValueError(f"card {card} declined"))
    out = stream.getvalue()
    job_line, other_line = out.split("outside a job")
    assert card not in job_line, job_line
    assert "card *** declined" in job_line and "ValueError" in job_line and "KeyError" in job_line
    assert card in other_line, "outside a job there is no payload to mask"
    if fmt == "json":
        error = json.loads(job_line.splitlines()[0])["error"]
        assert error["type"] == "ValueError" and error["message"] == "card *** declined"
        assert error["stack_trace"].endswith("ValueError: card *** declined")
