"""`SCHEDULER_PG_BIN` names the PostgreSQL binaries `dev up` uses: a wrong one is an error, not a
quiet fall back to whichever server is found next."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.devstack.postgres import find_bin_dir
from scheduler.devstack.process import StackError


def test_a_folder_without_the_server_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SCHEDULER_PG_BIN", str(tmp_path))
    with pytest.raises(StackError, match=r"SCHEDULER_PG_BIN='.*' has no postgres and initdb"):
        find_bin_dir()


def test_a_folder_with_the_server_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDULER_PG_BIN", raising=False)
    found = find_bin_dir()  # the wheel's or Debian's, as `dev up` finds them
    monkeypatch.setenv("SCHEDULER_PG_BIN", str(found))
    assert find_bin_dir() == found
