"""The listings show the first --limit rows and say on stderr (stdout keeps only the data, --json
parseable) when more exist."""

from __future__ import annotations

import json
import subprocess

import pytest

from scheduler.schedule.service import NewSchedule, create_schedules
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect
from tests.support import SCHEDULER

pytestmark = pytest.mark.integration


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDULER, *args], env=env, capture_output=True, text=True, check=False, timeout=60
    )


def test_a_listing_cut_short_by_its_limit_says_so_on_stderr(settings_env: dict[str, str]) -> None:
    """`schedules list` showed the 1,000 oldest schedules of 1,001, and nothing said more existed."""
    assert cli(settings_env, "apps", "create", "billing", "--partitions", "1").returncode == 0
    spec = ScheduleSpec(app="billing", handler="builtin:noop", kind="cron", cron="0 3 * * *")
    with connect(settings_env["SCHEDULER_DATABASE_URL"]) as conn:
        first = create_schedules(conn, [NewSchedule(spec)] * 1000, "test")
        last = create_schedules(conn, [NewSchedule(spec)], "test")
    note = "note: showing the first 1000 schedules (oldest first); more exist: raise --limit or filter\n"
    listed = cli(settings_env, "schedules", "list", "--json")
    assert listed.returncode == 0 and listed.stderr == note, listed.stderr
    assert {s["id"] for s in json.loads(listed.stdout)} == {str(row["id"]) for row in first}
    table = cli(settings_env, "schedules", "list")
    assert table.returncode == 0 and table.stderr == note, table.stderr
    assert str(last[0]["id"]) not in table.stdout
    whole = cli(settings_env, "schedules", "list", "--limit", "1001", "--json")
    assert whole.returncode == 0 and whole.stderr == "", whole.stderr
    assert len(json.loads(whole.stdout)) == 1001
    two = cli(settings_env, "schedules", "list", "--limit", "2", "--json")
    assert two.stderr.startswith("note: showing the first 2 schedules") and len(json.loads(two.stdout)) == 2


@pytest.mark.parametrize(
    ("listing", "what"),
    [
        (("runs", "list", "--app", "billing"), "runs (newest fire first)"),
        (("audit", "list", "--app", "billing"), "audit entries (newest first)"),
    ],
)
def test_every_listing_says_when_its_limit_cut_it_short(
    settings_env: dict[str, str], listing: tuple[str, ...], what: str
) -> None:
    assert cli(settings_env, "apps", "create", "billing", "--partitions", "1").returncode == 0
    created = cli(settings_env, "schedules", "create", "--app", "billing", "--cron", "0 3 * * *",
                  "--handler", "builtin:noop")  # fmt: skip
    schedule_id = json.loads(created.stdout)["id"]
    for _ in range(3):  # three runs, and audit entries of the creation and the triggers
        assert cli(settings_env, "schedules", "trigger", schedule_id).returncode == 0
    cut = cli(settings_env, *listing, "--limit", "2", "--json")
    assert cut.returncode == 0, cut.stderr
    assert cut.stderr == f"note: showing the first 2 {what}; more exist: raise --limit or filter\n"
    assert len(json.loads(cut.stdout)) == 2
    whole = cli(settings_env, *listing, "--limit", "100", "--json")
    assert whole.returncode == 0 and whole.stderr == "", whole.stderr
    assert len(json.loads(whole.stdout)) > 2


QUARANTINED = (
    "insert into quarantine (component, reason, app, original_bytes, source_topic, source_partition,"
    " source_offset) select 'reconciler', 'refused by PostgreSQL', 'billing', 'x', 'p.results', 0, n"
    " from generate_series(1, 3) as n"
)
REJECTED = (
    "insert into ingest_rejections (code, reason, command_id, schedule_key, app, operation, original_bytes,"
    " source_topic, source_partition, source_offset) select 'not_found', 'no schedule with key', 'c-' || n,"
    " 'nightly', 'billing', 'pause', 'x', 'p.schedules', 0, n from generate_series(1, 3) as n"
)


@pytest.mark.parametrize(
    ("listing", "rows"),
    [(("quarantine", "list"), QUARANTINED), (("schedules", "rejected"), REJECTED)],
)
def test_the_quarantine_and_the_rejections_say_when_their_limit_cut_them_short(
    settings_env: dict[str, str], listing: tuple[str, ...], rows: str
) -> None:
    """`quarantine list --limit 2` and `schedules rejected --limit 2` of three rows showed two and said
    nothing on stderr, as if that were all (operations.md: a listing cut short by its --limit says so)."""
    assert cli(settings_env, "apps", "create", "billing", "--partitions", "1").returncode == 0
    with connect(settings_env["SCHEDULER_DATABASE_URL"]) as conn:
        conn.execute(rows)
    for shape in (("--json",), ()):
        cut = cli(settings_env, *listing, "--app", "billing", "--limit", "2", *shape)
        assert cut.returncode == 0, cut.stderr
        assert cut.stderr.startswith("note: showing the first 2 "), (shape, cut.stderr)
        assert cut.stderr.endswith("; more exist: raise --limit or filter\n"), (shape, cut.stderr)
    assert len(json.loads(cli(settings_env, *listing, "--limit", "2", "--json").stdout)) == 2
    whole = cli(settings_env, *listing, "--app", "billing", "--limit", "3", "--json")
    assert whole.returncode == 0 and whole.stderr == "", whole.stderr
    assert len(json.loads(whole.stdout)) == 3
