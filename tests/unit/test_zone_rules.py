"""The zone database release a process loads, and how releases are ordered."""

from __future__ import annotations

import importlib
import zoneinfo
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.domain.zone_rules import ZoneRulesVersion, loaded_zone_rules


def test_releases_are_ordered_by_year_then_letter() -> None:
    releases = ["2026a", "2025b", "2025za", "2025z", "2024c", "2025c"]
    ordered = sorted(ZoneRulesVersion.parse(r) for r in releases)
    assert [str(r) for r in ordered] == ["2024c", "2025b", "2025c", "2025z", "2025za", "2026a"]
    assert ZoneRulesVersion.parse("2025b") == ZoneRulesVersion.parse("2025b")


@pytest.mark.parametrize("text", ["", "2025", "2025B", "25b", "2025.1", "2025b "])
def test_what_is_no_release_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="no IANA time zone database release"):
        ZoneRulesVersion.parse(text)


@pytest.fixture
def search_path() -> Iterator[None]:
    """zoneinfo's search path is the process's: set by a test, it is put back after it."""
    before = zoneinfo.TZPATH
    yield
    zoneinfo.reset_tzpath(before)
    loaded_zone_rules.cache_clear()


@pytest.mark.usefixtures("search_path")
def test_the_rules_are_those_of_the_first_folder_of_the_search_path_that_exists(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, release in ((first, "2031c"), (second, "2030a")):
        folder.mkdir()
        (folder / "tzdata.zi").write_text(f"# version {release}\n# ddeps\n")
    zoneinfo.reset_tzpath([str(tmp_path / "absent"), str(first), str(second)])
    loaded_zone_rules.cache_clear()
    assert loaded_zone_rules().version == ZoneRulesVersion(2031, "c")
    assert loaded_zone_rules().source == str(first)


@pytest.mark.usefixtures("search_path")
def test_a_folder_without_a_release_has_rules_of_unknown_age(tmp_path: Path) -> None:
    (tmp_path / "Europe").mkdir()
    zoneinfo.reset_tzpath([str(tmp_path)])
    loaded_zone_rules.cache_clear()
    assert loaded_zone_rules().version is None


@pytest.mark.usefixtures("search_path")
def test_without_a_folder_the_rules_are_the_tzdata_packages(tmp_path: Path) -> None:
    tzdata = importlib.import_module("tzdata")  # no type hints of its own
    zoneinfo.reset_tzpath([str(tmp_path / "absent")])
    loaded_zone_rules.cache_clear()
    assert loaded_zone_rules().version == ZoneRulesVersion.parse(tzdata.IANA_VERSION)
    assert loaded_zone_rules().source == "the tzdata package"
