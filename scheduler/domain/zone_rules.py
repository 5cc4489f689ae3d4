"""Which release of the IANA time zone database this process computes fires under.

Python's ``zoneinfo`` reads a zone's file from the first directory of its search path
(``PYTHONTZPATH``, else the system's: ``/usr/share/zoneinfo`` on Debian) that has it, and from the
``tzdata`` package only when no directory has it. Every copy of the database carries its release,
such as 2026f, on the first line of its ``tzdata.zi`` (``# version 2026f``); releases are ordered by
year, then letter, which tells which of two processes has the newer rules (a fingerprint of the
files would only tell that they differ). The rules are those of the first directory of the path
that exists, as ``zoneinfo`` looks there first: a directory without a ``tzdata.zi`` (a folder of a
few zone files put first in ``PYTHONTZPATH``) has no release that can be told, and its rules are
of unknown age.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import zoneinfo
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LoadedZoneRules", "ZoneRulesVersion", "loaded_zone_rules"]

_RELEASE_RE = re.compile(r"^(\d{4})([a-z]+)$")
_VERSION_LINE_RE = re.compile(r"^#\s*version\s+(\S+)\s*$")


@functools.total_ordering
@dataclass(frozen=True)
class ZoneRulesVersion:
    """A release of the IANA time zone database: 2025b comes before 2025c, which comes before 2026a
    (after 2025z would come 2025za, as IANA's own scheme has it)."""

    year: int
    letters: str

    @classmethod
    def parse(cls, text: str) -> ZoneRulesVersion:
        match = _RELEASE_RE.match(text)
        if match is None:
            raise ValueError(f"{text!r} is no IANA time zone database release (such as 2026a)")
        return cls(int(match.group(1)), match.group(2))

    def _key(self) -> tuple[int, int, str]:
        return (self.year, len(self.letters), self.letters)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ZoneRulesVersion):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        return f"{self.year}{self.letters}"


@dataclass(frozen=True)
class LoadedZoneRules:
    """The rules a process loads: their release (None when it cannot be told) and where they are."""

    version: ZoneRulesVersion | None
    source: str


@functools.cache
def loaded_zone_rules() -> LoadedZoneRules:
    """The zone rules this process computes fires under; read once, as ``zoneinfo`` reads its
    search path once."""
    for folder in zoneinfo.TZPATH:
        if Path(folder).is_dir():
            return LoadedZoneRules(_version_in(Path(folder) / "tzdata.zi"), folder)
    try:
        package = importlib.resources.files("tzdata").joinpath("zoneinfo", "tzdata.zi")
    except ModuleNotFoundError:
        return LoadedZoneRules(None, "no zone database")
    return LoadedZoneRules(_version_in(Path(str(package))), "the tzdata package")


def _version_in(path: Path) -> ZoneRulesVersion | None:
    try:
        with path.open(encoding="utf-8", errors="replace") as lines:
            first = lines.readline()
    except OSError:
        return None
    match = _VERSION_LINE_RE.match(first.strip())
    if match is None:
        return None
    try:
        return ZoneRulesVersion.parse(match.group(1))
    except ValueError:
        return None
