"""What a client can read of the guard's answers to a resume: the fields of its cursors, its
control event (`event: mcp-resume`) and its `Mcp-Resume` header."""
from __future__ import annotations

import base64

from .client import Event


def cursor_fields(cursor: str) -> tuple[int, int] | None:
    """(incarnation, seq) of a guard cursor; the layout is the guard's own (core/src/cursor.rs)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (ValueError, TypeError):
        return None
    if len(raw) < 19 + 2 + 16:
        return None
    inc = int.from_bytes(raw[10:18], "big")
    seq, shift, i = 0, 0, 19
    while i < len(raw):
        b = raw[i]
        seq |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return inc, seq
        shift += 7
    return None


def control_reason(ev: Event | None) -> str | None:
    """The reason of a control event, None for any other event."""
    if ev is not None and ev.event == "mcp-resume":
        try:
            return ev.json().get("reason", "?")
        except ValueError:
            return "?"
    return None


def header_reason(value: str | None) -> str | None:
    """The reason of an `Mcp-Resume` header value, None without one."""
    if not value:
        return None
    for part in value.split(";"):
        k, _, v = part.strip().partition("=")
        if k == "reason":
            return v
    return "?"
