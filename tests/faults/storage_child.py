"""Child process of test_storage_kill9: appends entries to ShardStorage until killed.

Usage: python storage_child.py ROOT SEED ROUND. Opens storage on ROOT (the configuration is
`storage_config` below, shared with the test), prints `READY`, then several tasks append to
their own ledgers (`ROUND * 100 + task`) with a few adds in flight each, printing
`ADD ledger entry` before and `ACK ledger entry` once `add_entry` returned (durable); it also
deletes ledger `(ROUND - 1) * 100` (`DELETE id`, then `DELETED id`) and compacts now and then.
Payloads are derived from (seed, ledger, entry), so the test can check every byte after a kill.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

import crc32c

from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.shard_storage import ShardStorage, StoredEntry
from bkaio.journal import open_journal
from bkaio.journal.config import JournalConfig
from bkaio.logs import configure_logging
from tests.fixtures.storage import add_entry

MASTER_KEY = b"m" * 32
TASKS = 4
BOOKIE_ID = "127.0.0.1:3181"


def storage_config(root: Path) -> StorageConfig:
    return StorageConfig(
        journal=JournalConfig(
            directories=(root / "journal",), max_file_bytes=256 * 1024, max_group_bytes=64 * 1024
        ),
        ledger_dirs=(root / "ledgers0", root / "ledgers1"),
        index_dirs=(root / "index0", root / "index1"),
        flush_interval_seconds=0.05,  # Flushes and checkpoints happen while we are killed.
        entry_log_max_bytes=64 * 1024,
        write_cache_bytes=256 * 1024,
        index_map_bytes=1 << 26,
    )


def expected_entry(seed: int, ledger_id: int, entry_id: int) -> StoredEntry:
    rng = random.Random(f"{seed}:{ledger_id}:{entry_id}")
    payload = rng.randbytes(rng.randint(1, 3000))
    return StoredEntry(
        ledger_id=ledger_id,
        entry_id=entry_id,
        lac=entry_id - 1,
        length=entry_id * 10_000 + len(payload),
        digest=crc32c.crc32c(payload),
        payload=payload,
    )


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _append_forever(storage: ShardStorage, seed: int, ledger_id: int) -> None:
    rng = random.Random(f"{seed}:{ledger_id}:batches")
    next_entry_id = 0

    async def add(entry_id: int) -> None:
        _say(f"ADD {ledger_id} {entry_id}")
        await add_entry(storage, expected_entry(seed, ledger_id, entry_id), MASTER_KEY)
        _say(f"ACK {ledger_id} {entry_id}")

    while True:
        batch = range(next_entry_id, next_entry_id + rng.randint(1, 8))
        next_entry_id = batch.stop
        await asyncio.gather(*(add(entry_id) for entry_id in batch))


async def main(root: Path, seed: int, round_number: int) -> None:
    storage = await ShardStorage.open(
        storage_config(root),
        bookie_id=BOOKIE_ID,
        shard_index=0,
        shard_count=1,
        journal_factory=open_journal,
    )
    _say("READY")
    tasks = [
        asyncio.create_task(_append_forever(storage, seed, round_number * 100 + task))
        for task in range(TASKS)
    ]
    if round_number > 0:  # Dead data for compaction: drop one ledger of the previous round.
        victim = (round_number - 1) * 100
        _say(f"DELETE {victim}")
        await storage.delete_ledger(victim)
        _say(f"DELETED {victim}")
    compactions = random.Random(f"{seed}:{round_number}")
    while True:  # Compaction runs now and then, so kills land inside it too.
        await asyncio.sleep(compactions.uniform(0.02, 0.2))
        await storage.compact()
        for task in tasks:
            if task.done():
                task.result()


if __name__ == "__main__":
    configure_logging(json=True, level="warning")
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
