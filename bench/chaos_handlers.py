"""The handlers of the chaos run (``python -m bench.chaos``): each one records its execution first.

Every execution appends one line to a file of its own process (``executions-<pid>.jsonl`` in
``$CHAOS_EXECUTIONS_DIR``) when it starts and one when it ends, each with a single ``os.write`` on
an ``O_APPEND`` descriptor: the kernel has the line as soon as the call returns, so it survives a
``kill -9`` of the worker a moment later and does not depend on PostgreSQL or Kafka being up. The
idempotency key is the effect: the report counts the executions per key and attempt, and compares
them with what ``attempts`` recorded.

What a job does is in its payload: ``kind`` (``ok``, ``poison``, ``transient``, ``nul_result``,
``nul_error``, ``big_payload``, ``big_result``) and ``sleep`` (seconds). Registered with
``SCHEDULER_HANDLERS=bench.chaos_handlers``, which makes every public callable of this module a
handler: the imports are private names, so only :func:`run` and :func:`run_async` are.
"""

from __future__ import annotations

import asyncio as _asyncio
import json as _json
import os as _os
import random as _random
import string as _string
import threading as _threading
import time as _time
from typing import Any as _Any

from scheduler.wiring import instance_name as _instance_name
from scheduler.worker.handlers import JobContext as _JobContext
from scheduler.worker.handlers import NonRetryableError as _NonRetryableError

EXECUTIONS_DIR_ENV = "CHAOS_EXECUTIONS_DIR"
# Just under what a result may be before the worker caps it: far over every outcome limit.
BIG_RESULT_CHARS = 1024 * 1024 - 128

_lock = _threading.Lock()
_fd: int | None = None
_fd_pid: int | None = None


def _descriptor() -> int:
    global _fd, _fd_pid
    with _lock:
        if _fd is None or _fd_pid != _os.getpid():
            folder = _os.environ.get(EXECUTIONS_DIR_ENV) or "."
            path = _os.path.join(folder, f"executions-{_os.getpid()}.jsonl")
            _fd = _os.open(path, _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o644)
            _fd_pid = _os.getpid()
        return _fd


def _record(ctx: _JobContext, event: str, kind: str, **extra: _Any) -> None:
    line = {
        "e": event,
        "key": ctx.idempotency_key,
        "run": str(ctx.run_id),
        "attempt": ctx.attempt,
        "pid": _os.getpid(),
        # The name this worker reports in its outcome events, so executions can be matched to them.
        "worker": _instance_name("worker"),
        "t": _time.time(),
        "kind": kind,
    } | extra
    _os.write(_descriptor(), (_json.dumps(line) + "\n").encode())


def _plan(ctx: _JobContext) -> tuple[str, float]:
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    return str(payload.get("kind", "ok")), float(payload.get("sleep", 0.0))


def _finish(ctx: _JobContext, kind: str) -> _Any:
    """The outcome of a job that has slept: its result, or the exception its kind asks for."""
    if kind == "poison":
        _record(ctx, "end", kind, outcome="dead")
        raise _NonRetryableError("poison job: fails the same way on every attempt")
    if kind == "nul_error":
        _record(ctx, "end", kind, outcome="dead")
        raise _NonRetryableError("an error with a NUL \x00 byte in the middle")
    if kind == "transient" and ctx.attempt == 1:
        _record(ctx, "end", kind, outcome="retry")
        raise RuntimeError("transient failure: the first attempt always fails")
    _record(ctx, "end", kind, outcome="succeeded")
    if kind == "nul_result":
        return {"text": "a result with a NUL \x00 byte in the middle"}
    if kind == "big_result":
        # Random letters: the worker's producer compresses, and a repeated one would shrink to nothing.
        alphabet = _string.ascii_letters + _string.digits
        return {"text": "".join(_random.Random(ctx.idempotency_key).choices(alphabet, k=BIG_RESULT_CHARS))}
    return {"kind": kind, "attempt": ctx.attempt}


def run(ctx: _JobContext) -> _Any:
    """A synchronous job (run in the worker's thread pool)."""
    kind, seconds = _plan(ctx)
    _record(ctx, "start", kind, mode="sync")
    _time.sleep(seconds)
    return _finish(ctx, kind)


async def run_async(ctx: _JobContext) -> _Any:
    """The same job, asynchronous (run on the worker's event loop)."""
    kind, seconds = _plan(ctx)
    _record(ctx, "start", kind, mode="async")
    await _asyncio.sleep(seconds)
    return _finish(ctx, kind)
