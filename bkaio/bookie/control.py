"""The control channel between the bookie parent and a shard worker: JSON lines over pipes.

The parent writes commands to the worker's stdin; the worker writes events and replies to a
private copy of its stdout (fd 1 itself is pointed at stderr, so a stray print cannot corrupt
the channel). EOF on stdin means the parent is gone: the worker stops.

    worker -> parent   {"event": "ready", "port": 3181}
                       {"event": "read_only", "read_only": true}
                       {"reply": 7, "result": {...}}
    parent -> worker   {"id": 7, "method": "metrics" | "info" | "set_forced_read_only", ...}
                       {"method": "stop"}
Pure helpers: encoding and decoding lines; no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from bkaio.errors import ProtocolError

MAX_LINE_BYTES = 64 * 1024 * 1024  # A metrics snapshot of a busy shard stays far below this.


def encode_message(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode_message(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError as error:
        raise ProtocolError(f"control channel: line is not JSON: {line[:80]!r}") from error
    if not isinstance(message, dict):
        raise ProtocolError(f"control channel: line is not an object: {line[:80]!r}")
    return message
