"""Ledger storage of a bookie shard: write cache, entry logs, LMDB index, ledger state, cookies.

See docs/storage.md. Must not import `protocol` or `meta`.
"""

from __future__ import annotations

from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.cookie import Cookie
from bkaio.entrylog.shard_storage import ShardStorage, StorageStats
from bkaio.entrylog.types import CompactionReport, DiskUsage, LedgerState, StoredEntry

__all__ = [
    "CompactionReport",
    "Cookie",
    "DiskUsage",
    "LedgerState",
    "ShardStorage",
    "StorageConfig",
    "StorageStats",
    "StoredEntry",
]
