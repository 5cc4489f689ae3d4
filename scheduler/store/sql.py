"""Named SQL blocks from ``store/queries/*.sql``, loaded once.

A block starts with ``-- name: NAME`` and runs to the next one; its comment lines say why the query
is shaped as it is. Only the store modules know query names; the rest of the code calls them.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import LiteralString, cast

QUERIES_DIR = Path(__file__).parent / "queries"
_NAME_RE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def parse_blocks(text: str) -> dict[str, LiteralString]:
    parts = _NAME_RE.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        # SQL files are part of the source tree, never built from input: LiteralString holds.
        queries[name] = cast(LiteralString, body.strip().rstrip(";"))
    return queries


@cache
def queries() -> dict[str, LiteralString]:
    loaded: dict[str, LiteralString] = {}
    for path in sorted(QUERIES_DIR.glob("*.sql")):
        for name, sql in parse_blocks(path.read_text()).items():
            if name in loaded:
                raise ValueError(f"query {name!r} is defined twice ({path.name})")
            loaded[name] = sql
    return loaded


def query(name: str) -> LiteralString:
    return queries()[name]
