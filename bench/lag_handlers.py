"""The handler of the lag benchmark (``python -m bench.lag``): when it was entered, as its result.

A run's ``started_at`` is when its worker began the attempt, which comes before its handler runs
(the start must be on Kafka first); the peers' lag is measured inside their task. So the lag
benchmark's fires run :func:`stamp`, and their lag is also read from the result it stores: the
wall clock (epoch seconds) at the handler's first instruction. Registered with
``SCHEDULER_HANDLERS=bench.lag_handlers``; the imports are private names, so only ``stamp`` is a
handler.
"""

from __future__ import annotations

import time as _time

from scheduler.worker.handlers import JobContext as _JobContext


async def stamp(ctx: _JobContext) -> dict[str, float]:
    """On the job loop itself (async), as a user's async handler runs: no thread hop to measure."""
    return {"entered_at": _time.time()}
