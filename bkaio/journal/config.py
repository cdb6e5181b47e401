"""The journal's configuration, defined with the write-ahead log's interface (`bkaio.wal.config`),
where ledger storage's configuration finds it without importing the journal."""

from __future__ import annotations

from bkaio.wal.config import (
    DEFAULT_MAX_GROUP_BYTES,
    MAX_ADAPTIVE_WAIT_US,
    MIN_FILE_BYTES,
    ZERO_FILL_CHUNK_BYTES,
    JournalConfig,
)

__all__ = [
    "DEFAULT_MAX_GROUP_BYTES",
    "MAX_ADAPTIVE_WAIT_US",
    "MIN_FILE_BYTES",
    "ZERO_FILL_CHUNK_BYTES",
    "JournalConfig",
]
