"""Storage fixtures: a ShardStorage over 2-3 tmp disks with the real journal (sync off: speed)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import crc32c
import pytest

from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.shard_storage import ShardStorage, StoredEntry
from bkaio.journal import open_journal
from bkaio.journal.config import JournalConfig

KEY = b"k" * 32
OTHER_KEY = b"x" * 32
BOOKIE_ID = "127.0.0.1:3181"


def make_config(
    root: Path, *, disks: int = 2, journals: int = 1, **overrides: Any
) -> StorageConfig:
    journal_dirs = (root / "journal", *(root / f"journal{i}" for i in range(1, journals)))
    base = StorageConfig(
        journal=JournalConfig(directories=journal_dirs, sync=False),
        ledger_dirs=tuple(root / f"ledgers{i}" for i in range(disks)),
        index_dirs=tuple(root / f"index{i}" for i in range(disks)),
        flush_interval_seconds=3600.0,  # Tests flush explicitly unless they say otherwise.
        index_map_bytes=1 << 26,
    )
    return dataclasses.replace(base, **overrides)


def payload_of(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    seed = f"{ledger_id}:{entry_id}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def make_entry(
    ledger_id: int, entry_id: int, *, lac: int | None = None, payload: bytes | None = None
) -> StoredEntry:
    data = payload if payload is not None else payload_of(ledger_id, entry_id)
    return StoredEntry(
        ledger_id=ledger_id,
        entry_id=entry_id,
        lac=entry_id - 1 if lac is None else lac,
        length=(entry_id + 1) * len(data),
        digest=crc32c.crc32c(data),
        payload=data,
    )


OpenStorage = Callable[..., Awaitable[ShardStorage]]


@pytest.fixture
async def open_storage(tmp_path: Path) -> AsyncIterator[OpenStorage]:
    """Opens storage on tmp_path (same dirs each call); closes whatever is still open."""
    opened: list[ShardStorage] = []

    async def opener(config: StorageConfig | None = None, **kwargs: Any) -> ShardStorage:
        storage = await ShardStorage.open(
            config if config is not None else make_config(tmp_path),
            bookie_id=kwargs.pop("bookie_id", BOOKIE_ID),
            shard_index=kwargs.pop("shard_index", 0),
            shard_count=kwargs.pop("shard_count", 1),
            journal_factory=kwargs.pop("journal_factory", open_journal),
            **kwargs,
        )
        opened.append(storage)
        return storage

    yield opener
    for storage in opened:
        await storage.close()
