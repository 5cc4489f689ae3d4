"""A handler that logs its whole payload (``log.info("got %s", ctx.payload)``, a common first line of
a handler) has every value of it masked in that line: what that costs for a payload as large as
validation accepts."""

from __future__ import annotations

import json
import time

from scheduler.telemetry.redact import MASK, PayloadMask

# About 720 KB of JSON: 60,000 distinct values alike in their first four characters (order ids).
VALUES = [f"v{i:07d}" for i in range(60_000)]


def test_masking_a_line_that_quotes_a_large_payload_whole_takes_time_linear_in_the_line() -> None:
    """Defect: every candidate value is searched for through the whole line (one str.find pass each),
    so a line quoting a 1 MiB payload of 90,000 values took 55 s of CPU in a real worker (holding
    the GIL, inside the handler's timeout); PayloadMask's docstring promises time that grows with
    the text and the values it could hold."""
    payload = json.dumps(VALUES)
    line = f"got {VALUES}"
    mask = PayloadMask(payload)
    began = time.process_time()
    masked = mask.mask(line)
    spent = time.process_time() - began
    assert masked.count(MASK) == len(VALUES)
    assert "v00" not in masked
    # A single pass over 720 KB with 60,000 needles is well under a second; 4 s leaves room for a
    # busy machine (the search value by value takes over 20 s here).
    assert spent < 4.0, f"masking a {len(line):,}-character line took {spent:.1f} s of CPU"
