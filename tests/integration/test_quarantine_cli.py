"""`scheduler quarantine list`: what a component set aside, with its reason and, asked for, its bytes."""

from __future__ import annotations

import base64
import json
import subprocess
import uuid

import psycopg
import pytest

from scheduler.config import Settings
from tests.support import SCHEDULER

pytestmark = pytest.mark.integration


def test_quarantined_items_are_listed_newest_first_with_their_reason(
    settings: Settings, settings_env: dict[str, str]
) -> None:
    run_id = uuid.uuid4()
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(
            "insert into quarantine (component, reason, run_id, app, original_bytes, source_topic,"
            " source_partition, source_offset, quarantined_at)"
            " values ('relay', 'RelayRefused: message too large', %s, 'billing', %s, 'p.jobs.billing', 3, 41,"
            " now() - interval '1 minute'),"
            " ('reconciler', 'DataError: unsupported Unicode escape', null, null, 'x', 'p.results', 0, 7,"
            " now())",
            (run_id, b"\x00" * 10),
        )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SCHEDULER, "quarantine", "list", *args],
            env=settings_env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = json.loads(cli("--json").stdout)
    assert [row["component"] for row in listed] == ["reconciler", "relay"]
    assert "original_bytes_base64" not in listed[0]
    relay = json.loads(cli("--json", "--component", "relay", "--bytes").stdout)
    assert len(relay) == 1
    assert relay[0]["run_id"] == str(run_id) and relay[0]["size_bytes"] == 10
    assert relay[0]["reason"] == "RelayRefused: message too large"
    assert base64.b64decode(relay[0]["original_bytes_base64"]) == b"\x00" * 10
    table = subprocess.run(
        [SCHEDULER, "quarantine", "list"],
        env=settings_env | {"COLUMNS": "250"},
        capture_output=True,
        text=True,
    )
    assert table.returncode == 0 and "RelayRefused: message too large" in table.stdout
    bad = cli("--since", "yesterday")
    assert bad.returncode != 0 and "is not an ISO 8601 time" in bad.stderr
