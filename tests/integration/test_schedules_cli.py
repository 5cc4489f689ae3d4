"""`scheduler apps` and `scheduler schedules` as a user runs them: JSON out, one-line errors, exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from psycopg.pq import TransactionStatus

from scheduler.cli.common import known_app
from scheduler.config import Settings
from scheduler.domain.cron import CronSchedule
from scheduler.kafka.transport import TopicAdmin
from scheduler.store import connect
from scheduler.wiring import Wiring
from tests.support import SCHEDULER

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"

pytestmark = pytest.mark.integration


class Cli:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str | bytes) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SCHEDULER, *args],
            env=self.env,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
            timeout=60,
        )

    def json(self, *args: str | bytes) -> Any:
        done = self(*args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def refused(self, *args: str | bytes, code: int = 2) -> str:
        """The one line a refused command prints (stderr, exit ``code``, nothing on stdout)."""
        done = self(*args)
        assert done.returncode == code, done
        assert done.stdout == "", done.stdout
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
        return done.stderr.rstrip("\n")


def parse(instant: str) -> datetime:
    return datetime.fromisoformat(instant)


@pytest.fixture
def cli(settings_env: dict[str, str]) -> Cli:
    return Cli(settings_env)


@pytest.fixture
def app(cli: Cli) -> str:
    assert cli("apps", "create", "billing", "--partitions", "3").returncode == 0
    return "billing"


def test_apps_create_makes_the_topic_and_lists_it(cli: Cli, settings: Settings) -> None:
    created = cli.json("apps", "create", "billing", "--partitions", "4", "--json")
    assert created["name"] == "billing" and created["topic"] == settings.jobs_topic("billing")
    assert TopicAdmin(settings.kafka_bootstrap).partitions(settings.jobs_topic("billing")) == 4
    again = cli("apps", "create", "billing")
    assert again.returncode == 0, "creating an existing app is harmless"
    assert cli("apps", "create", "billing", "--partitions", "4").returncode == 0
    # Other partitions are refused, not silently ignored: the topic keeps its 4.
    other = cli("apps", "create", "billing", "--partitions", "5")
    assert other.returncode == 1 and "exists with 4 partitions" in other.stderr, other.stderr
    assert TopicAdmin(settings.kafka_bootstrap).partitions(settings.jobs_topic("billing")) == 4
    assert [a["name"] for a in cli.json("apps", "list", "--json")] == ["billing"]


def test_schedule_lifecycle_is_versioned_and_audited(cli: Cli, app: str, settings: Settings) -> None:
    created = cli.json(
        "schedules", "create", "--app", app, "--name", "nightly", "--cron", "30 2 * * *",
        "--tz", "Europe/Berlin", "--handler", "builtin:noop", "--payload", '{"a": 1}',
    )  # fmt: skip
    fields = ("app", "name", "kind", "cron", "tz", "handler", "payload", "state", "version")
    assert {k: created[k] for k in fields} == {
        "app": "billing", "name": "nightly", "kind": "cron", "cron": "30 2 * * *", "tz": "Europe/Berlin",
        "handler": "builtin:noop", "payload": {"a": 1}, "state": "active", "version": 1,
    }  # fmt: skip
    assert created["next_fire_at"].endswith("+00:00")
    sid = created["id"]
    assert cli.json("schedules", "get", sid) == created

    paused = cli.json("schedules", "pause", sid)
    assert (paused["state"], paused["version"]) == ("paused", 2)
    stale = cli("schedules", "resume", sid, "--expect-version", "1")
    assert stale.returncode != 0 and "version" in stale.stderr and stale.stderr.count("\n") == 1
    resumed = cli.json("schedules", "resume", sid, "--expect-version", "2")
    assert (resumed["state"], resumed["version"]) == ("active", 3)
    assert resumed["next_fire_at"] == created["next_fire_at"]

    triggered = cli.json("schedules", "trigger", sid)
    assert triggered["schedule_id"] == sid
    run = cli.json("runs", "get", triggered["run_id"])
    assert run["state"] == "pending" and run["attempt"] == 1

    cancelled = cli.json("schedules", "cancel", sid)
    assert cancelled["state"] == "cancelled" and cancelled["next_fire_at"] is None
    assert cli("schedules", "resume", sid).returncode != 0

    listed = cli.json("schedules", "list", "--app", app, "--json")
    assert [s["id"] for s in listed] == [sid]
    with connect(settings.database_url) as conn:
        actions = [
            r["action"]
            for r in conn.execute("select action from audit_log where entity = 'schedule' order by id")
        ]
    assert actions == ["create", "pause", "resume", "trigger", "cancel"]


def test_immediate_and_delayed_schedules(cli: Cli, app: str) -> None:
    now = cli.json("schedules", "create", "--app", app, "--now", "--handler", "builtin:noop")
    assert now["kind"] == "immediate" and now["next_fire_at"]
    later = cli.json(
        "schedules", "create", "--app", app, "--at", "2030-01-01T09:00:00Z", "--handler", "pkg.mod:fn"
    )
    assert later["kind"] == "delayed" and later["run_at"] == "2030-01-01T09:00:00+00:00"
    assert later["next_fire_at"] == later["run_at"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--app", "nope", "--now", "--handler", "builtin:noop"], "unknown app 'nope'"),
        (
            ["--app", "billing", "--cron", "61 * * * *", "--handler", "builtin:noop"],
            "invalid cron expression",
        ),
        (
            ["--app", "billing", "--cron", "* * * * *", "--tz", "Mars/Olympus", "--handler", "builtin:noop"],
            "unknown time zone",
        ),
        (["--app", "billing", "--now", "--handler", "not a handler"], "handler 'not a handler'"),
        (
            ["--app", "billing", "--now", "--handler", "builtin:noop", "--name", "x" * 201],
            "name must be 1 to 200",
        ),
        (["--app", "billing", "--now", "--handler", "builtin:noop", "--payload", "{bad"], "not JSON"),
        (
            ["--app", "billing", "--now", "--at", "2030-01-01T00:00:00Z", "--handler", "builtin:noop"],
            "exactly one of",
        ),
        (["--app", "billing", "--at", "yesterday", "--handler", "builtin:noop"], "not an ISO 8601 time"),
        (
            ["--app", "billing", "--at", "2027-02-29T00:00:00Z", "--handler", "builtin:noop"],
            "day is out of range for month",
        ),
        (
            ["--app", "billing", "--now", "--handler", "builtin:noop", "--misfire", "bogus"],
            "'bogus' is not one",
        ),
        (["--app", "billing", "--now", "--handler", "builtin:noop", "--no-such-option"], "No such option"),
        # 02:30 where? Read as UTC, a reader of the schedule would take it for 02:30 in New York.
        (
            [
                "--app",
                "billing",
                "--at",
                "2027-03-14T02:30:00",
                "--tz",
                "America/New_York",
                "--handler",
                "x:y",
            ],
            # 02:30 is skipped that day (the clocks go from 02:00 to 03:00): the example is the
            # first instant after the gap, where a cron schedule would fire.
            "has no offset, and the schedule's zone is America/New_York, where the clocks skip 02:30 "
            "that day (its first instant after the gap is 2027-03-14T03:00:00-04:00): give one "
            "(e.g. 2027-03-14T03:00:00-04:00, or 2027-03-14T02:30:00Z for UTC)",
        ),
        (
            ["--app", "billing", "--at", "2027-01-01T09:00:00", "--tz", "Asia/Kolkata", "--handler", "x:y"],
            "(e.g. 2027-01-01T09:00:00+05:30, or 2027-01-01T09:00:00Z for UTC)",
        ),
        (
            ["--app", "billing", "--at", "2027-01-01T09:00:00", "--tz", "Nope/Zone", "--handler", "x:y"],
            "unknown time zone 'Nope/Zone'",
        ),
        (
            ["--app", "billing", "--now", "--handler", "builtin:noop", "--payload", "@"],
            "--payload: @ takes a file name",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli: Cli, app: str, args: list[str], message: str) -> None:
    done = cli("schedules", "create", *args)
    assert done.returncode == 2, done
    assert message in done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.strip().count("\n") == 0, done.stderr
    assert cli.json("schedules", "list", "--json") == [], "nothing was stored"


def test_a_payload_over_one_mebibyte_is_refused(cli: Cli, app: str, tmp_path: Any) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blob": "x" * (1024 * 1024)}))
    done = cli(
        "schedules", "create", "--app", app, "--now", "--handler", "builtin:noop", "--payload", f"@{big}"
    )
    assert done.returncode == 2
    assert "the limit is 1048576 (1 MiB)" in done.stderr


def test_commands_fail_clearly_when_the_database_is_unreachable(settings_env: dict[str, str]) -> None:
    env = settings_env | {"SCHEDULER_DATABASE_URL": "postgresql://scheduler@127.0.0.1:1/none"}
    done = subprocess.run(
        [SCHEDULER, "schedules", "list"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: cannot reach PostgreSQL") and done.stderr.count("\n") == 1


def test_commands_name_the_url_when_postgresql_refuses_it(settings_env: dict[str, str]) -> None:
    """A database that does not exist is no server to start: the line points at the setting."""
    url = settings_env["SCHEDULER_DATABASE_URL"].rsplit("/", 1)[0] + "/no_such_database"
    done = subprocess.run(
        [SCHEDULER, "schedules", "list"],
        env=settings_env | {"SCHEDULER_DATABASE_URL": url},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert 'database "no_such_database" does not exist' in done.stderr
    assert "check SCHEDULER_DATABASE_URL" in done.stderr and "dev up" not in done.stderr


def test_retry_backoff_and_jitter_are_set_by_create_and_changed_by_update(cli: Cli, app: str) -> None:
    created = cli.json(
        "schedules", "create", "--app", app, "--cron", "0 3 * * *", "--handler", "builtin:noop",
        "--backoff-base", "0.5", "--backoff-max", "60", "--jitter", "30",
    )  # fmt: skip
    assert (created["backoff_base_ms"], created["backoff_max_ms"], created["jitter_ms"]) == (
        500,
        60_000,
        30_000,
    )
    sid = created["id"]
    updated = cli.json(
        "schedules", "update", sid, "--jitter", "0", "--cron", "15 4 * * *", "--expect-version", "1"
    )
    assert (updated["cron"], updated["jitter_ms"], updated["backoff_base_ms"], updated["version"]) == (
        "15 4 * * *",
        0,
        500,
        2,
    ), "what update does not name stays"
    assert updated["next_fire_at"] != created["next_fire_at"]
    stale = cli("schedules", "update", sid, "--jitter", "1", "--expect-version", "1")
    assert stale.returncode == 1 and "is at version 2, not 1" in stale.stderr
    for args, message in (
        (["--backoff-base", "10", "--backoff-max", "5"], "backoff must satisfy 0 <= base <= max"),
        (["--jitter", "-1"], "Invalid value for '--jitter': -1.0 is not in the range 0<=x<=86400"),
        (["--backoff-max", "100000"], "Invalid value for '--backoff-max'"),
    ):
        done = cli("schedules", "update", sid, *args)
        assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert cli.json("schedules", "get", sid)["version"] == 2, "nothing was stored"


def test_a_schedule_in_error_is_listed_with_its_reason_and_fixed_by_update(
    cli: Cli, app: str, settings: Settings
) -> None:
    good = cli.json("schedules", "create", "--app", app, "--cron", "* * * * *", "--handler", "builtin:noop")
    bad = cli.json(
        "schedules",
        "create",
        "--app",
        app,
        "--cron",
        "* * * * *",
        "--handler",
        "builtin:noop",
        "--name",
        "mars",
    )
    with connect(settings.database_url) as conn:
        conn.execute("update schedules set tz = 'Mars/Olympus' where id = %s", (bad["id"],))
        Wiring(settings).scanner().scan_once(conn, now=parse(bad["next_fire_at"]))
    [listed] = cli.json("schedules", "list", "--state", "error", "--json")
    assert listed["id"] == bad["id"] and "unknown time zone 'Mars/Olympus'" in listed["error"]
    assert listed["errored_at"] and [
        s["id"] for s in cli.json("schedules", "list", "--state", "active", "--json")
    ] == [good["id"]]
    wide = Cli(cli.env | {"COLUMNS": "400"})  # the tables wrap to the terminal's width
    table = wide("schedules", "list").stdout
    assert "unknown time zone 'Mars/Olympus'" in next(
        line for line in table.splitlines() if bad["id"] in line
    )
    apps_table = wide("apps", "list").stdout.splitlines()
    assert "│ 1 " in next(line for line in apps_table if "billing" in line), "one schedule in error"

    refused = cli("schedules", "resume", bad["id"])
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "still cannot be computed" in refused.stderr and "schedules update" in refused.stderr
    fixed = cli.json("schedules", "update", bad["id"], "--tz", "Europe/Berlin")
    assert (fixed["state"], fixed["error"], fixed["tz"]) == ("active", None, "Europe/Berlin")
    assert cli.json("schedules", "list", "--state", "error", "--json") == []


def test_an_app_that_declares_its_handlers_refuses_any_other(cli: Cli, settings: Settings) -> None:
    created = cli.json(
        "apps", "create", "payments", "--handler", "builtin:noop", "--handler", "payments.jobs", "--json"
    )
    assert created["handlers"] == ["builtin:noop", "payments.jobs"]
    assert (
        cli(
            "apps", "create", "payments", "--handler", "builtin:noop", "--handler", "payments.jobs"
        ).returncode
        == 0
    )
    other = cli("apps", "create", "payments", "--handler", "builtin")
    assert other.returncode == 1 and "declares builtin:noop, payments.jobs" in other.stderr
    [listed] = cli.json("apps", "list", "--json")
    assert listed["handlers"] == ["builtin:noop", "payments.jobs"]

    def create(handler: str) -> subprocess.CompletedProcess[str]:
        # builtin:http is refused without a URL to call, whatever the app declares.
        payload = ["--payload", '{"url": "https://example.test"}'] if handler == "builtin:http" else []
        return cli("schedules", "create", "--app", "payments", "--now", "--handler", handler, *payload)

    assert create("builtin:noop").returncode == 0
    assert create("payments.jobs:charge").returncode == 0, "a function of a declared module"
    assert create("payments.jobs:Charges.run").returncode == 0, "a method of a class it defines"
    for handler in (
        "builtin:http", "sys:exit", "payments.jobs.sub:charge", "payments.jobs:_private", "payments.jobs:Charges._run"
    ):  # fmt: skip
        done = create(handler)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert f"handler '{handler}' is not declared by app 'payments'" in done.stderr
    sid = json.loads(create("builtin:noop").stdout)["id"]
    assert cli("schedules", "update", sid, "--handler", "os:system").returncode == 2

    assert cli.json("apps", "handlers", "payments", "builtin", "--json")["handlers"] == ["builtin"]
    assert create("builtin:http").returncode == 0, "builtin declares every builtin"
    assert create("payments.jobs:charge").returncode == 2
    assert cli.json("apps", "handlers", "payments", "--none", "--json")["handlers"] is None
    assert create("sys:exit").returncode == 0, "undeclared: the workers' registration decides"
    for args, message in (
        ([], "give the handlers to declare, or --none"),
        (["builtin:nope"], "handler 'builtin:nope' must be builtin"),
        (["not a module"], "must be builtin"),
    ):
        done = cli("apps", "handlers", "payments", *args)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    assert cli("apps", "handlers", "nope", "builtin").returncode == 2
    with connect(settings.database_url) as conn:
        actions = [
            r["action"] for r in conn.execute("select action from audit_log where entity = 'app' order by id")
        ]
    assert actions == ["create", "handlers", "handlers"]


def test_a_cron_with_jenkins_h_is_created_and_hashed_by_its_own_id(cli: Cli, app: str) -> None:
    created = cli.json(
        "schedules", "create", "--app", app, "--cron", "H H(0-5) * * *", "--handler", "builtin:noop"
    )
    expected = CronSchedule.of("H H(0-5) * * *", "UTC", schedule_id=created["id"]).next_fire_after(
        parse(created["created_at"])
    )
    assert parse(created["next_fire_at"]) == expected and expected.hour <= 5
    # Updated to another H expression, it is hashed by the same id.
    updated = cli.json("schedules", "update", created["id"], "--cron", "H/15 * * * *")
    assert parse(updated["next_fire_at"]) == CronSchedule.of(
        "H/15 * * * *", "UTC", schedule_id=created["id"]
    ).next_fire_after(parse(updated["updated_at"]))
    bad = cli("schedules", "create", "--app", app, "--cron", "H(70-80) * * * *", "--handler", "builtin:noop")
    assert bad.returncode != 0 and "H(a-b) needs 0 <= a <= b <= 59" in bad.stderr


def test_json_is_accepted_by_the_commands_that_always_print_it(cli: Cli, app: str) -> None:
    created = cli.json(
        "schedules", "create", "--app", app, "--cron", "0 3 * * *", "--handler", "builtin:noop", "--json"
    )
    assert cli.json("schedules", "get", created["id"], "--json") == created
    paused = cli.json("schedules", "pause", created["id"], "--json")
    assert paused["state"] == "paused" and paused["version"] == created["version"] + 1
    triggered = cli.json("schedules", "trigger", created["id"], "--json")
    assert triggered["schedule_id"] == created["id"]
    assert cli.json("runs", "get", triggered["run_id"], "--json")["id"] == triggered["run_id"]
    assert cli.json("schedules", "update", created["id"], "--name", "nightly", "--json")["name"] == "nightly"
    assert cli.json("init", "--json")["migrations_applied"] == []


def test_a_key_an_ended_schedule_holds_is_said_so_when_it_is_taken_again(cli: Cli, app: str) -> None:
    first = cli.json(
        "schedules", "create", "--app", app, "--cron", "0 3 * * *", "--handler", "builtin:noop", "--key", "k"
    )
    assert cli("schedules", "cancel", first["id"]).returncode == 0
    again = cli(
        "schedules", "create", "--app", app, "--cron", "0 4 * * *", "--handler", "builtin:noop", "--key", "k"
    )
    assert again.returncode == 1 and again.stderr.count("\n") == 1, again.stderr
    assert (
        f"(schedule {first['id']}, cancelled: an ended schedule keeps its key until the history"
        in again.stderr
    )


def test_every_schedule_has_a_key_by_which_it_is_found(cli: Cli, app: str) -> None:
    keyed = cli.json(
        "schedules", "create", "--app", app, "--now", "--handler", "builtin:noop", "--key", "invoice-7"
    )
    assert keyed["schedule_key"] == "invoice-7"
    assert cli.json("schedules", "get", f"{app}/invoice-7")["id"] == keyed["id"]
    assert cli.json("schedules", "get", keyed["id"])["schedule_key"] == "invoice-7"
    # Without --key, the id is the key.
    plain = cli.json("schedules", "create", "--app", app, "--cron", "0 3 * * *", "--handler", "builtin:noop")
    assert plain["schedule_key"] == plain["id"]
    assert cli.json("schedules", "get", f"{app}/{plain['id']}")["id"] == plain["id"]
    # A key is its app's once; nothing is created the second time.
    again = cli(
        "schedules", "create", "--app", app, "--now", "--handler", "builtin:noop", "--key", "invoice-7"
    )
    assert again.returncode == 1 and again.stderr.count("\n") == 1, again.stderr
    assert again.stderr.startswith(
        f"error: app '{app}' already has a schedule with key 'invoice-7' (schedule {keyed['id']}, "
    ), again.stderr
    assert len(cli.json("schedules", "list", "--app", app, "--json")) == 2
    refused = cli(
        "schedules", "create", "--app", app, "--now", "--handler", "builtin:noop", "--key", "x" * 201
    )
    assert refused.returncode == 2 and "1 to 200 characters" in refused.stderr
    # A key no schedule has is a usage error, as in every command that takes one.
    assert cli.refused("schedules", "get", f"{app}/no-such-key") == (
        f"error: unknown schedule '{app}/no-such-key': app '{app}' has no schedule with that key "
        f"(`scheduler schedules list --app {app}` shows its schedules)"
    )
    assert cli("schedules", "get", "not-an-id").returncode == 2


def test_audit_list_shows_who_changed_what_and_a_description_round_trips(cli: Cli, app: str) -> None:
    created = cli(
        "schedules", "create", "--app", app, "--cron", "0 9 * * *", "--handler", "builtin:noop",
        "--description", "the morning report", "--json",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    schedule = json.loads(created.stdout)
    assert schedule["description"] == "the morning report"
    updated = cli("schedules", "update", schedule["id"], "--description", "the report at nine", "--json")
    assert updated.returncode == 0 and json.loads(updated.stdout)["description"] == "the report at nine"

    listed = cli("audit", "list", "--entity", "schedule", "--id", schedule["id"], "--json")
    assert listed.returncode == 0, listed.stderr
    entries = json.loads(listed.stdout)
    assert [e["action"] for e in entries] == ["update", "create"]  # newest first
    assert all(e["actor"].startswith("cli:") and e["app"] == app for e in entries)
    assert entries[0]["old_value"]["description"] == "the morning report"
    assert entries[0]["new_value"]["description"] == "the report at nine"
    by_app = json.loads(cli("audit", "list", "--app", app, "--json").stdout)
    assert {e["entity_id"] for e in by_app} >= {schedule["id"], app}
    refused = cli.refused("audit", "list", "--app", "no-such-app", "--json")
    assert refused == "error: unknown app 'no-such-app' (`scheduler apps list` shows the apps)"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SCHEDULER_LOG_LEVEL", "LOUD"),
        ("SCHEDULER_LOG_FORMAT", "xml"),
        ("SCHEDULER_REDACT_KEYS", "(unclosed"),
    ],
)
@pytest.mark.parametrize("command", [("apps", "list"), ("schedules", "list"), ("runs", "list")])
def test_a_bad_logging_variable_stops_every_command_with_one_line(
    cli: Cli, app: str, variable: str, value: str, command: tuple[str, ...]
) -> None:
    done = Cli(cli.env | {variable: value})(*command)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and variable in done.stderr, done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    "command",
    [
        ("run", "scanner"),
        ("run", "reconciler"),
        ("run", "ingestor"),
        ("run", "worker", "--app", "billing"),
        ("run", "all"),
        ("dlq", "replay", "--dry-run"),
        ("produce",),
        ("apps", "list"),
    ],
)
def test_a_schemas_dir_without_the_schemas_stops_a_command_with_one_line(
    cli: Cli, app: str, tmp_path: Path, command: tuple[str, ...]
) -> None:
    """Not a traceback, nor (for a dir that lacks the job's schema) a scanner that sets every due
    schedule aside in state error because it cannot encode its fire."""
    custom = Cli(cli.env | {"SCHEDULER_SCHEMAS_DIR": str(tmp_path)})
    assert custom.refused(*command) == f"error: no *.avsc files in {tmp_path} (set SCHEDULER_SCHEMAS_DIR?)"
    shutil.copy(SCHEMAS / "ScheduleCommand.avsc", tmp_path)
    assert custom.refused(*command) == (
        f"error: SCHEDULER_SCHEMAS_DIR: {tmp_path} has no JobMessage.avsc, JobResult.avsc, JobRetry.avsc, "
        "JobDeadLetter.avsc, ScheduleCommandRejected.avsc"
    )
    (tmp_path / "JobMessage.avsc").write_text("{not json")
    assert custom.refused(*command).startswith(
        f"error: {tmp_path / 'JobMessage.avsc'}: not a valid Avro schema"
    )
    for schema in SCHEMAS.glob("*.avsc"):
        shutil.copy(schema, tmp_path)
    assert custom("apps", "list", "--json").returncode == 0


@pytest.mark.parametrize(
    "command",
    [
        ("schedules", "list"),
        ("runs", "list"),
        ("runs", "redispatch", "--dispatched-before", "2020-01-01T00:00:00Z", "--dry-run"),
        ("dlq", "list"),
        ("dlq", "replay", "--dry-run"),
        ("dlq", "replay"),
        ("audit", "list"),
    ],
)
def test_a_filter_on_an_app_that_does_not_exist_is_refused_not_answered_empty(
    cli: Cli, app: str, command: tuple[str, ...]
) -> None:
    done = cli(*command, "--app", "bilinng")
    assert done.returncode == 2, done
    assert done.stderr == "error: unknown app 'bilinng' (`scheduler apps list` shows the apps)\n"
    assert cli(*command, "--app", app).returncode == 0


@pytest.mark.parametrize(
    ("command", "value"),
    [
        (("dlq", "replay", "--rate"), "inf"),
        (("dlq", "replay", "--rate"), "nan"),
        (("dlq", "replay", "--rate"), "0"),
        (("migrations", "wait", "--timeout"), "nan"),
    ],
)
def test_a_number_out_of_range_is_one_line_and_exit_2(cli: Cli, command: tuple[str, ...], value: str) -> None:
    done = cli(*command, value)
    assert done.returncode == 2, done
    assert (
        done.stderr.startswith(f"error: Invalid value for '{command[-1]}'") and done.stderr.count("\n") == 1
    )


@pytest.mark.parametrize("command", [("dlq", "list"), ("dlq", "replay", "--dry-run"), ("dlq", "replay")])
def test_a_dead_letter_filter_that_can_match_nothing_is_refused(cli: Cli, command: tuple[str, ...]) -> None:
    """An unknown schedule, or --since not before --until, answered `replayed 0 runs`, exit 0."""
    missing = "0190c6d2-0000-7000-8000-000000000000"
    done = cli(*command, "--schedule", missing)
    assert done.returncode == 2, done
    assert (
        done.stderr == f"error: unknown schedule {missing} (`scheduler schedules list` shows the schedules)\n"
    )
    done = cli(*command, "--since", "2027-01-02T00:00:00Z", "--until", "2027-01-01T00:00:00Z")
    assert done.returncode == 2 and "is not before --until" in done.stderr and done.stderr.count("\n") == 1


def test_runs_of_an_unknown_schedule_are_refused_not_an_empty_list(cli: Cli) -> None:
    """A mistyped schedule id printed an empty table, exit 0, as if it had never fired."""
    missing = "0190c6d2-0000-7000-8000-000000000000"
    done = cli("runs", "list", "--schedule", missing)
    assert done.returncode == 2, done
    assert (
        done.stderr == f"error: unknown schedule {missing} (`scheduler schedules list` shows the schedules)\n"
    )


def test_an_unknown_run_is_one_line_and_exit_2(cli: Cli) -> None:
    """`runs get` said `error: no run ID`, exit 1, where `dlq replay --run` refuses it with exit 2."""
    missing = "0190c6d2-0000-7000-8000-000000000000"
    done = cli("runs", "get", missing)
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == (
        f"error: unknown run {missing}: no run has that id (`scheduler runs list` lists the runs)\n"
    )


def test_version_is_a_command_too(cli: Cli) -> None:
    done = cli("version")
    assert done.returncode == 0 and done.stdout == cli("--version").stdout


def test_checking_an_app_leaves_no_transaction_open(settings: Settings, app: str) -> None:
    # Else a replay's or redispatch's chunks would nest in it as savepoints and commit only at the end.
    with Wiring(settings).database.connect() as conn:
        known_app(conn, app)
        assert conn.info.transaction_status == TransactionStatus.IDLE


def test_an_update_that_changes_nothing_is_refused_and_keeps_the_version(cli: Cli, app: str) -> None:
    """It would still be a new version, and a concurrent --expect-version would fail for nothing."""
    sid = cli.json("schedules", "create", "--app", app, "--cron", "0 9 * * *", "--handler", "builtin:noop")[
        "id"
    ]
    for args in ([], ["--expect-version", "1"], ["--json"]):
        line = cli.refused("schedules", "update", sid, *args)
        assert line.startswith("error: nothing to change: give the settings to change"), line
    assert cli.json("schedules", "get", sid)["version"] == 1
    renamed = cli.json("schedules", "update", sid, "--name", "morning", "--expect-version", "1")
    assert (renamed["name"], renamed["version"]) == ("morning", 2)


def test_update_changes_a_schedules_kind_both_ways(cli: Cli, app: str) -> None:
    """--at makes a cron schedule a one-shot, --cron a one-shot a cron schedule, with nothing left of
    the old kind (no cron on a one-shot, no run_at on a cron schedule)."""
    created = cli.json(
        "schedules", "create", "--app", app, "--cron", "0 9 * * *", "--handler", "builtin:noop"
    )
    one_shot = cli.json("schedules", "update", created["id"], "--at", "2027-07-01T00:00:00Z")
    assert (one_shot["kind"], one_shot["cron"]) == ("delayed", None)
    assert parse(one_shot["run_at"]) == parse("2027-07-01T00:00:00+00:00")
    assert parse(one_shot["next_fire_at"]) == parse("2027-07-01T00:00:00+00:00")
    again = cli.json("schedules", "update", created["id"], "--cron", "30 2 * * *")
    assert (again["kind"], again["cron"], again["run_at"]) == ("cron", "30 2 * * *", None)
    assert parse(again["next_fire_at"]).time().isoformat() == "02:30:00"


def test_an_empty_start_or_end_removes_the_bound(cli: Cli, app: str) -> None:
    bounded = cli.json(
        "schedules", "create", "--app", app, "--cron", "30 2 * * *", "--handler", "builtin:noop",
        "--start", "2027-01-01T00:00:00Z", "--end", "2027-12-31T00:00:00Z",
    )  # fmt: skip
    unended = cli.json("schedules", "update", bounded["id"], "--end", "")
    assert (unended["end_at"], unended["version"]) == (None, bounded["version"] + 1)
    assert parse(unended["start_at"]) == parse("2027-01-01T00:00:00+00:00")
    unbounded = cli.json("schedules", "update", bounded["id"], "--start", "", "--name", "nightly")
    assert (unbounded["start_at"], unbounded["end_at"], unbounded["name"]) == (None, None, "nightly")


def test_a_time_without_an_offset_is_utc_only_for_a_schedule_in_utc(cli: Cli, app: str) -> None:
    in_utc = cli.json(
        "schedules", "create", "--app", app, "--at", "2027-03-14T02:30:00", "--handler", "builtin:noop"
    )
    assert parse(in_utc["run_at"]) == parse("2027-03-14T02:30:00+00:00")
    zoned = cli.json(
        "schedules", "create", "--app", app, "--cron", "30 2 * * *", "--tz", "America/New_York",
        "--handler", "builtin:noop",
    )  # fmt: skip
    refused = cli("schedules", "update", zoned["id"], "--end", "2027-12-31T00:00:00")
    assert refused.returncode == 2 and "zone is America/New_York" in refused.stderr, refused.stderr
    ended = cli.json("schedules", "update", zoned["id"], "--end", "2027-12-31T00:00:00-05:00")
    assert parse(ended["end_at"]) == parse("2027-12-31T05:00:00+00:00")
    # UTC by another of its names, or by an empty zone (UTC, as over the API).
    for zone in ("Etc/GMT", ""):
        made = cli.json(
            "schedules",
            "create",
            "--app",
            app,
            "--at",
            "2027-03-14T02:30:00",
            "--tz",
            zone,
            "--handler",
            "builtin:noop",
        )
        assert parse(made["run_at"]) == parse("2027-03-14T02:30:00+00:00")
        assert made["tz"] == (zone or "UTC")
    assert cli.json("schedules", "update", zoned["id"], "--tz", "")["tz"] == "UTC"
