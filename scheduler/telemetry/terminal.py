"""Text from anyone (a schedule's name, a token's subject, a handler's error) as a terminal shows it.

A terminal acts on some characters instead of showing them: ESC starts the sequences that move the
cursor, clear lines and retitle the window; C1 controls do the same on terminals that read 8-bit
controls (0x9b is CSI); the bidirectional overrides and isolates show text in another order than
it is stored. The CLI's tables and error line and the human log lines show them as escapes.
"""

from __future__ import annotations

from typing import Final

# C0 controls but tab and newline, DEL, C1 controls, the bidirectional overrides and isolates.
_CONTROLS: Final = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in (
        *(c for c in range(0x20) if c not in (0x09, 0x0A)),
        *range(0x7F, 0xA0),
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    )
}
# JSON escapes C0 controls itself; the rest as \u escapes, which read back as the same text.
_JSON_CONTROLS: Final = {code: f"\\u{code:04x}" for code in _CONTROLS if code >= 0x7F}


def shown(text: str) -> str:
    """``text`` with the controls a terminal would act on written as escapes (``\\x1b``)."""
    return text.translate(_CONTROLS)


def json_shown(document: str) -> str:
    """A JSON ``document`` (written with ``ensure_ascii=False``) that reads back the same, with no
    control a terminal would act on left as it is."""
    return document.translate(_JSON_CONTROLS)
