"""Secrets in protocol messages (the auth token, master keys) stay out of their reprs, which
assertion messages and logs show."""

from __future__ import annotations

from bkaio.protocol.messages import (
    PROTOCOL_VERSION,
    AddEntriesRequest,
    AddEntryRequest,
    Flag,
    HelloRequest,
    ReadEntryRequest,
    ReadLacRequest,
    ReadRangeRequest,
    WriteLacRequest,
)

TOKEN = "tok-0123456789"
KEY = b"key-0123456789"


def test_reprs_hold_no_token_and_no_master_key() -> None:
    messages = [
        HelloRequest(1, PROTOCOL_VERSION, "client", TOKEN),
        AddEntryRequest(2, 3, 0, Flag.NONE, KEY, -1, 1, 0, b"x"),
        AddEntriesRequest(4, 3, Flag.NONE, KEY, ()),
        ReadEntryRequest(5, 3, 0, Flag.FENCE, KEY),
        ReadRangeRequest(6, 3, 0, 1, 100, Flag.FENCE, KEY),
        ReadLacRequest(7, 3, Flag.FENCE, KEY, -1, 0),
        WriteLacRequest(8, 3, KEY, 0),
    ]
    for message in messages:
        shown = repr(message)
        assert TOKEN not in shown and repr(KEY) not in shown, shown
        assert "request_id=" in shown  # Still says which request it is.
