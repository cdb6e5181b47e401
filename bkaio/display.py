"""Showing stored bytes and metadata to operators (the CLI and the admin HTTP share these).

payload_text(b"hello") == "hello"; payload_text(b"\\xff") == "hex:ff"
ledger_metadata_dict(metadata)   # plain JSON-able data; the password hash is never shown
"""

from __future__ import annotations

import string
from typing import Any

from bkaio.meta.ledger_metadata import LedgerMetadata

_PRINTABLE = frozenset(string.printable) - frozenset("\x0b\x0c")


def payload_text(payload: bytes) -> str:
    """A payload shown safely: its UTF-8 text when printable, else `hex:` and the bytes in hex."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + payload.hex()
    if all(ch in _PRINTABLE or (ch.isprintable() and not ch.isspace()) for ch in text):
        return text
    return "hex:" + payload.hex()


def ledger_metadata_dict(metadata: LedgerMetadata) -> dict[str, Any]:
    """A ledger's metadata as plain data; `password_hash` (secret-derived) is left out."""
    return {
        "ledger_id": metadata.ledger_id,
        "state": metadata.state.name,
        "ensemble_size": metadata.ensemble_size,
        "write_quorum": metadata.write_quorum,
        "ack_quorum": metadata.ack_quorum,
        "last_entry_id": metadata.last_entry_id,
        "length": metadata.length,
        "digest_type": metadata.digest_type.name,
        "ensembles": [[first, list(bookies)] for first, bookies in metadata.ensembles],
        "ctime_ms": metadata.ctime_ms,
        "custom_metadata": {k: payload_text(v) for k, v in metadata.custom_metadata.items()},
        "format_version": metadata.format_version,
        "version": metadata.version,
    }
