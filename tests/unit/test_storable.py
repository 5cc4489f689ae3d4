"""Handler text is made storable: NUL and lone surrogates escaped, long text cut with a marker."""

from __future__ import annotations

import json

from scheduler.domain.storable import capped_result, capped_text, storable_json, storable_text


def test_nul_and_lone_surrogates_are_escaped_visibly() -> None:
    assert storable_text("a\x00b") == "a\\u0000b"
    assert storable_text(b"caf\xff".decode("utf-8", "surrogateescape")) == "caf\\udcff"
    assert storable_text("plain café ✓") == "plain café ✓"


def test_long_text_is_cut_with_a_marker_within_the_limit() -> None:
    text = capped_text("x" * 10_000, limit=100)
    assert len(text) == 100
    assert text.endswith("[truncated 9900 characters]")
    assert capped_text("short", limit=100) == "short"


def test_json_strings_and_keys_are_made_storable() -> None:
    assert storable_json({"k\x00": ["v\x00", 1, None, {"n": True}]}) == {
        "k\\u0000": ["v\\u0000", 1, None, {"n": True}]
    }


def test_an_oversized_result_stays_json_and_says_it_was_cut() -> None:
    big = json.dumps({"data": "é" * 200_000})
    capped = capped_result(big, limit=1000)
    assert len(capped.encode()) < 2000
    cut = json.loads(capped)
    assert cut["truncated"] is True and cut["size_bytes"] == len(big.encode()) and cut["limit_bytes"] == 1000
    assert capped_result('{"ok": 1}') == '{"ok": 1}'
