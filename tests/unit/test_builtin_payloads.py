"""A built-in handler's payload is refused when its schedule is made, for the reason its handler
would give at every fire, and in words that never quote the payload's values."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.schedule.spec import InvalidSchedule, ScheduleSpec, validate
from scheduler.worker.handlers import NonRetryableError
from scheduler.worker.http_handler import HttpRequest

SECRET = "s3cr3t-V4LUE"

REFUSED: list[tuple[str, Any]] = [
    ("builtin:sleep", {}),
    ("builtin:sleep", {"seconds": "abc"}),
    ("builtin:sleep", {"seconds": SECRET}),
    ("builtin:sleep", {"seconds": -7.25}),
    ("builtin:sleep", {"seconds": True}),
    ("builtin:sleep", [SECRET]),
    ("builtin:fail", {"times": "x"}),
    ("builtin:fail", {"times": -725}),
    ("builtin:fail", {"times": 1, "retryable": SECRET}),
    ("builtin:fail", [SECRET]),
    ("builtin:http", {}),
    ("builtin:http", SECRET),
    ("builtin:http", {"url": 5, "token": SECRET}),
    ("builtin:http", {"url": f"ftp://{SECRET}.test/file"}),
    ("builtin:http", {"url": "file:///etc/passwd"}),
    ("builtin:http", {"url": "http:///no-host"}),
    ("builtin:http", {"url": f"https://[{SECRET}]/"}),
    ("builtin:http", {"url": f"https://example.test:{SECRET}/"}),
    ("builtin:http", {"url": "https://example.test", "method": f"GET {SECRET}"}),
    ("builtin:http", {"url": "https://example.test", "headers": "str"}),
    ("builtin:http", {"url": "https://example.test", "headers": {"X-Token": f"{SECRET}\r\nInjected: 1"}}),
    ("builtin:http", {"url": "https://example.test", "headers": {f"Bad {SECRET}": "x"}}),
    ("builtin:http", {"url": "https://example.test", "headers": {"X-Number": 725}}),
    ("builtin:http", {"url": "https://example.test", "timeout": SECRET}),
    ("builtin:http", {"url": "https://example.test", "timeout": 0}),
]

TAKEN: list[tuple[str, Any]] = [
    ("builtin:noop", {"anything": [SECRET]}),
    ("builtin:sleep", {"seconds": 0}),
    ("builtin:sleep", {"seconds": 1.5, "note": "x"}),
    ("builtin:fail", {}),
    ("builtin:fail", {"times": 2, "retryable": False}),
    ("builtin:http", {"url": "https://example.test/hook?token=x"}),
    ("builtin:http", {"url": "HTTP://Example.test:8443/", "method": "post", "headers": {"X-A": "b"}}),
    ("builtin:http", {"url": "http://example.test", "body": {"k": 1}, "timeout": 2.5}),
    ("payments.jobs:charge", {"seconds": "not a builtin's business"}),
]


def spec(handler: str, payload: Any) -> ScheduleSpec:
    return ScheduleSpec(app="billing", handler=handler, kind="immediate", payload=payload)


@pytest.mark.parametrize(("handler", "payload"), REFUSED)
def test_a_payload_its_builtin_handler_would_refuse_is_refused_at_creation(
    handler: str, payload: Any
) -> None:
    with pytest.raises(InvalidSchedule) as refused:
        validate(spec(handler, payload))
    message = str(refused.value)
    assert message.startswith(handler), message
    assert SECRET not in message and "725" not in message and "7.25" not in message, message
    assert "\n" not in message


@pytest.mark.parametrize(("handler", "payload"), [case for case in REFUSED if case[0] == "builtin:http"])
def test_the_worker_refuses_the_same_http_payloads_with_the_same_reason(handler: str, payload: Any) -> None:
    with pytest.raises(InvalidSchedule) as at_creation:
        validate(spec(handler, payload))
    with pytest.raises(NonRetryableError) as at_run:
        HttpRequest.from_payload(payload)
    assert str(at_run.value) == str(at_creation.value)


@pytest.mark.parametrize(("handler", "payload"), TAKEN)
def test_a_payload_its_handler_takes_is_taken(handler: str, payload: Any) -> None:
    assert validate(spec(handler, payload)).payload == payload
