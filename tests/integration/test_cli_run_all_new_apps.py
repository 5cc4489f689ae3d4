"""`scheduler run all` without `--app` runs workers for an app created while it runs, as for those
it found at start: it got none until it was restarted, and the app's jobs waited on Kafka for ever.
The app is created with the CLI, as a user would in another terminal; its worker's line keeps the
table's columns, and a job of the app runs."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from bench.chaos_stack import free_port_range
from tests.e2e.health import Supervised, cli, cli_json
from tests.support import wait_for

pytestmark = pytest.mark.integration

PIPELINE = ("scanner", "relay", "reconciler", "ingestor")
TABLE_LINE = "health and metrics on port"


def test_an_app_created_while_run_all_runs_gets_its_worker_and_its_jobs_run(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in settings_env.items() if k not in ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_JWKS")}
    first, new = f"first-{uuid.uuid4().hex[:8]}", f"new-{uuid.uuid4().hex[:8]}"
    cli(env, "init")  # the pipeline's topics under the test's prefix
    cli(env, "apps", "create", first, "--partitions", "1")
    base = free_port_range(len(PIPELINE) + 2)
    supervised = Supervised(env, tmp_path, "--metrics-port", str(base))
    try:
        supervised.table(len(PIPELINE) + 1, timeout_s=30)
        cli(env, "apps", "create", new, "--partitions", "1")
        table = supervised.table(len(PIPELINE) + 2, timeout_s=30)  # asked every 5 s
        children = [*PIPELINE, f"worker-{first}", f"worker-{new}"]
        assert [(c.name, c.port) for c in table] == [(name, base + i) for i, name in enumerate(children)]
        lines = [line for line in supervised.stdout().splitlines() if TABLE_LINE in line]
        assert len({line.index(" pid ") for line in lines}) == 1, lines
        assert len({line.index(TABLE_LINE) for line in lines}) == 1, lines
        assert f"new app {new}: starting its workers" in supervised.messages()

        schedule = cli_json(env, "schedules", "create", "--app", new, "--now", "--handler", "builtin:noop")

        def states() -> list[str]:
            runs = cli_json(env, "runs", "list", "--schedule", schedule["id"], "--json")
            return [run["state"] for run in runs]

        try:
            wait_for(lambda: states() == ["succeeded"], 40, f"the job of {new} to succeed", 0.5)
        except AssertionError as error:
            raise AssertionError(f"{error}: runs {states()}\n{supervised.stderr()[-6000:]}") from None
        again = [line for line in supervised.stdout().splitlines() if TABLE_LINE in line]
        assert again == lines, "one worker per app: none started twice"
        assert supervised.stop() == 0, supervised.stderr()[-4000:]
        assert "Traceback" not in supervised.stderr()
    finally:
        supervised.kill_leftovers()


def test_a_new_app_whose_workers_port_is_taken_is_said_and_the_pipeline_runs_on(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    """At start a taken port stops `run all` (exit 2); for an app created later it stopped every
    app's jobs for that one app. Now the app's workers are not started, with one error line, and
    the rest runs on."""
    env = {k: v for k, v in settings_env.items() if k not in ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_JWKS")}
    first, new = f"first-{uuid.uuid4().hex[:8]}", f"new-{uuid.uuid4().hex[:8]}"
    cli(env, "init")
    cli(env, "apps", "create", first, "--partitions", "1")
    base = free_port_range(len(PIPELINE) + 2)
    taken = base + len(PIPELINE) + 1  # the new app's worker's
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", taken))
        holder.listen()
        supervised = Supervised(env, tmp_path, "--metrics-port", str(base))
        try:
            supervised.table(len(PIPELINE) + 1, timeout_s=30)
            cli(env, "apps", "create", new, "--partitions", "1")
            said = (
                f"new app {new}: port {taken} is in use by another process (set --metrics-port): "
                "its workers are not started (restart run all to run them)"
            )
            wait_for(lambda: said in supervised.messages(), 30, "the new app's refusal")
            assert supervised.proc.poll() is None, "the pipeline runs on"
            started = [line for line in supervised.stdout().splitlines() if TABLE_LINE in line]
            assert len(started) == len(PIPELINE) + 1, started
            assert supervised.stop() == 0, supervised.stderr()[-4000:]
        finally:
            supervised.kill_leftovers()
