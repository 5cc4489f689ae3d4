"""Ctrl-C during a paced `dlq replay` (`--rate`, the README's `--limit 100 --rate 50`) ends it as
every other bad end does: one error line, and what it did. It printed click's `Aborted!` after a
blank line and exited 1, with no word of the runs it had replayed already (each chunk is committed
as it goes), so the operator could not tell a replay that did nothing from one that did half."""

from __future__ import annotations

import signal
import subprocess

import pytest

from scheduler.config import Settings
from scheduler.store import connect
from tests.integration.test_schedules_cli import Cli
from tests.support import SCHEDULER, make_dead_runs, wait_for

pytestmark = pytest.mark.integration

APP = "billing"


def pending_runs(settings: Settings) -> int:
    with connect(settings.database_url) as conn:
        rows = conn.execute("select id from runs where state = 'pending'").fetchall()
    return len(rows)


def test_ctrl_c_during_a_paced_replay_says_what_was_replayed_in_one_line(
    settings: Settings, settings_env: dict[str, str]
) -> None:
    cli = Cli(settings_env)
    assert cli("apps", "create", APP, "--partitions", "1").returncode == 0
    with connect(settings.database_url) as conn:
        make_dead_runs(conn, APP, 3, "PlannedFailure: no")
    replay = subprocess.Popen(
        [SCHEDULER, "dlq", "replay", "--app", APP, "--rate", "0.2"],  # one run, then five seconds' wait
        env=settings_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's Ctrl-C
    )
    try:
        wait_for(lambda: pending_runs(settings) > 0, 30, "the replay's first run")
        replay.send_signal(signal.SIGINT)
        out, err = replay.communicate(timeout=60)
    finally:
        if replay.poll() is None:
            replay.kill()
            replay.communicate()
    replayed = pending_runs(settings)
    assert 0 < replayed < 3, replayed
    assert "Traceback" not in err and "Aborted!" not in err, err
    assert replay.returncode == 130, (replay.returncode, out, err)  # as `produce` interrupted
    assert err.startswith("error: ") and err.count("\n") == 1, err
    said = out + err
    assert f"replayed {replayed} run" in said, said
