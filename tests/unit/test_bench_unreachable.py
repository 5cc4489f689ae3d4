"""A benchmark pointed at a stack that is not there says so in one line, as the CLI does, rather
than with a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NOWHERE = {
    "SCHEDULER_DATABASE_URL": "postgresql://bench@127.0.0.1:1/none",
    "SCHEDULER_KAFKA_BOOTSTRAP": "127.0.0.1:1",
}


@pytest.mark.parametrize("module", ["bench.e2e", "bench.lag", "bench.ingest"])
def test_an_unreachable_postgresql_is_one_line(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module],
        env=os.environ | NOWHERE,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "PostgreSQL" in lines[0] and "127.0.0.1" in lines[0], done.stderr
