"""Handlers named by ``tests.unit.handler_fixtures:...`` references in the handler tests, and a job
context to call handlers with."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.worker.handlers import JobContext, NonRetryableError

NOT_CALLABLE = 42


def job_context(
    payload: Any = None,
    *,
    attempt: int = 1,
    max_attempts: int = 3,
    heartbeat: Callable[[], None] = lambda: None,
) -> JobContext:
    now = datetime.now(UTC)
    return JobContext(
        run_id=uuid.uuid4(),
        schedule_id=uuid.uuid4(),
        app="demo",
        attempt=attempt,
        max_attempts=max_attempts,
        idempotency_key=f"key-{attempt}",
        scheduled_for=now,
        deadline=now + timedelta(minutes=5),
        payload=payload,
        heartbeat=heartbeat,
    )


def echo(ctx: JobContext) -> dict[str, Any]:
    return {"payload": ctx.payload, "attempt": ctx.attempt, "key": ctx.idempotency_key}


async def echo_async(ctx: JobContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"payload": ctx.payload, "async": True}


def refuse(ctx: JobContext) -> None:
    raise NonRetryableError("the customer does not exist", error_class="UnknownCustomer")


class Greeter:
    @staticmethod
    def greet(ctx: JobContext) -> str:
        return f"hello {ctx.payload}"


class AsyncCallable:
    async def __call__(self, ctx: JobContext) -> str:
        return "called"


async_callable = AsyncCallable()
