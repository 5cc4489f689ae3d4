"""`scheduler run all` says what it will not run (no apps, so no workers; no JWT key, so no API) in
its log, a JSON line under SCHEDULER_LOG_FORMAT=json like every other line of its stderr and its
children's; stdout keeps the table of the children it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support import SCHEDULER, json_log_lines, wait_for

pytestmark = pytest.mark.integration

PIPELINE = ("scanner", "relay", "reconciler", "ingestor")


def test_run_all_warns_in_json_lines_that_it_runs_no_workers_and_no_api(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in settings_env.items() if k not in ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_JWKS")}
    env["SCHEDULER_LOG_FORMAT"] = "json"
    out, err = tmp_path / "run-all.out", tmp_path / "run-all.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [SCHEDULER, "run", "all"], env=env, stdout=stdout, stderr=stderr, start_new_session=True
        )
    try:

        def every_component_started() -> bool:
            assert proc.poll() is None, err.read_text()[-3000:]
            started = {r["component"] for r in json_log_lines(err.read_text()) if r["message"] == "started"}
            return started >= set(PIPELINE)

        wait_for(every_component_started, 60, "every component's start")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, err.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever a failed test left running
        proc.wait(10)
    records = json_log_lines(err.read_text())
    warned = [r["message"] for r in records if r["component"] == "supervisor" and r["level"] == "WARNING"]
    assert warned == [
        "no apps yet, so no workers (create one with `scheduler apps create NAME`)",
        "no API (set SCHEDULER_JWT_SECRET or SCHEDULER_JWT_JWKS to serve it)",
    ], records
    assert [line.split()[0] for line in out.read_text().splitlines()] == list(PIPELINE)
