"""Handlers named by ``tests.unit.handler_fixtures:...`` references in the handler tests, and a job
context to call handlers with."""

from __future__ import annotations

import asyncio
import logging
import time
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


def _private(ctx: JobContext) -> str:
    return "never run: private to its module"


# --- handlers that misbehave, for the worker's robustness tests -----------------------------------


def exit_now(ctx: JobContext) -> None:
    """What ``sys:exit`` would do, from a registered handler."""
    raise SystemExit(3)


def interrupt(ctx: JobContext) -> None:
    raise KeyboardInterrupt


async def exit_async(ctx: JobContext) -> None:
    await asyncio.sleep(0)
    raise SystemExit("bye")


def stuck(ctx: JobContext) -> None:
    """A synchronous handler that ignores its timeout: it blocks its thread for ``seconds``."""
    time.sleep(float(ctx.payload.get("seconds", 60)))


def sized_result(ctx: JobContext) -> str:
    return "r" * int(ctx.payload["bytes"])


def sized_error(ctx: JobContext) -> None:
    raise ValueError("\x00" + "e" * int(ctx.payload["chars"]))


def big_result(ctx: JobContext) -> dict[str, Any]:
    """A JSON object result of about ``payload["bytes"]`` bytes: over what an outcome may carry."""
    return {"blob": "b" * int(ctx.payload["bytes"]), "end": True}


EXECUTED: list[uuid.UUID] = []
"""Run ids of the jobs :func:`record` ran, in this process (for workers run in-process by tests)."""


def record(ctx: JobContext) -> None:
    EXECUTED.append(ctx.run_id)


async def entered_at(ctx: JobContext) -> dict[str, float]:
    """The wall clock (epoch seconds) when the handler was entered, as its result."""
    return {"entered_at": time.time()}


def chatty(ctx: JobContext) -> int:
    """Calls ``ctx.heartbeat()`` ``payload["calls"]`` times in a tight loop."""
    calls = int(ctx.payload["calls"])
    for _ in range(calls):
        ctx.heartbeat()
    return calls


async def _awaited_work(ctx: JobContext) -> dict[str, Any]:
    await asyncio.sleep(0.01)
    if ctx.payload and ctx.payload.get("fail"):
        raise ValueError("the awaited work failed")
    return {"awaited": True}


def returns_coroutine(ctx: JobContext) -> Any:
    """A sync handler that hands back a coroutine (a sync wrapper of async code): its work."""
    return _awaited_work(ctx)


async def blocks_the_loop(ctx: JobContext) -> None:
    """An async handler that blocks its event loop for ``payload["seconds"]`` (a bug to survive)."""
    time.sleep(float(ctx.payload["seconds"]))


async def fail_async(ctx: JobContext) -> None:
    await asyncio.sleep(0)
    raise ValueError("failed on purpose")


def quotes_payload(ctx: JobContext) -> None:
    """A handler whose error quotes its payload, as careless ones do."""
    raise ValueError(f"card {ctx.payload['card']} declined for {ctx.payload['amount']} (try 3 of 3)")


def pops_and_quotes_payload(ctx: JobContext) -> None:
    """A handler that takes its values out of the payload it was given, then quotes them."""
    card, amount = ctx.payload.pop("card"), ctx.payload.pop("amount")
    raise ValueError(f"card {card} declined for {amount} (try 3 of 3)")


def logs_payload(ctx: JobContext) -> None:
    """A handler that logs its payload's values, in its message and as an extra, as careless ones do."""
    logging.getLogger("billing.charges").warning(
        "charging card %s for %s",
        ctx.payload["card"],
        ctx.payload["amount"],
        extra={"card": ctx.payload["card"]},
    )
