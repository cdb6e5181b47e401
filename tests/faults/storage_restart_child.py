"""Child process of test_storage_kill9_restarts: ShardStorage on two journals, killed either
while it works or in the middle of its start.

Usage: python storage_restart_child.py ROOT SEED ROUND PHASE CACHE_BYTES. Opens storage on
ROOT (`restart_config`, shared with the test) with a write cache of CACHE_BYTES.

PHASE `work`: prints `READY`, then, as storage_child.py does, appends to ledgers
`ROUND * 100 + task` (`ADD`/`ACK` lines); besides, it creates ledger `ROUND * 100 + 51` (an odd
id: the second journal's), adds to it and deletes it (`DELETE`/`DELETED`), fences ledger
`ROUND * 100 + 52` once it holds entries (`FENCE`, then `FENCED` once durable) and pushes
explicit LACs to ledger `ROUND * 100 + 53` (`LACPUSH ledger lac`, printed before the push).

PHASE `stall`: the start stops when it comes to replaying the second journal: `REPLAY 1` is
printed and the process waits there to be killed. The first journal's replay came before, and
with a small CACHE_BYTES it flushed and checkpointed as it went.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.errors import LedgerFencedError
from bkaio.journal import open_journal
from bkaio.journal.config import JournalConfig
from bkaio.logs import configure_logging
from bkaio.wal import JournalLike, ReplayReader
from bkaio.wal.records import JournalMark
from tests.faults.storage_child import BOOKIE_ID, MASTER_KEY, TASKS, expected_entry
from tests.fixtures.storage import add_entry

VICTIM, FENCED, LAC = 51, 52, 53  # Ledger ids ROUND * 100 + these.


def restart_config(root: Path, cache_bytes: int) -> StorageConfig:
    return StorageConfig(
        journal=JournalConfig(
            directories=(root / "journal0", root / "journal1"), max_group_bytes=64 * 1024
        ),
        ledger_dirs=(root / "ledgers0", root / "ledgers1"),
        index_dirs=(root / "index0", root / "index1"),
        flush_interval_seconds=3600.0,  # Flushes come from a full cache: a long journal tail.
        entry_log_max_bytes=256 * 1024,
        write_cache_bytes=cache_bytes,
        index_map_bytes=1 << 26,
    )


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class _StallingJournal:
    """The second journal of a `stall` start: its replay never begins (the process is killed)."""

    def __init__(self, journal: JournalLike) -> None:
        self._journal = journal

    def iter_replay(self, after: JournalMark | None) -> ReplayReader:
        _say("REPLAY 1")
        time.sleep(60)  # Blocks the loop on purpose: the test kills the process here.
        raise AssertionError("not killed")

    def __getattr__(self, name: str) -> object:
        return getattr(self._journal, name)


async def _open(root: Path, cache_bytes: int, stall: bool) -> ShardStorage:
    config = restart_config(root, cache_bytes)

    async def journals(journal_config: JournalConfig, directory: Path) -> JournalLike:
        journal = await open_journal(journal_config, directory)
        if stall and directory == config.journal.directories[1]:
            return _StallingJournal(journal)  # type: ignore[return-value]
        return journal

    return await ShardStorage.open(
        config, bookie_id=BOOKIE_ID, shard_index=0, shard_count=1, journal_factory=journals
    )


async def _add(storage: ShardStorage, seed: int, ledger_id: int, entry_id: int) -> None:
    _say(f"ADD {ledger_id} {entry_id}")
    await add_entry(storage, expected_entry(seed, ledger_id, entry_id), MASTER_KEY)
    _say(f"ACK {ledger_id} {entry_id}")


async def _append_forever(storage: ShardStorage, seed: int, ledger_id: int) -> None:
    """Until killed; for the ledger that gets fenced, until the fence refuses its adds."""
    rng = random.Random(f"{seed}:{ledger_id}:batches")
    next_entry_id = 0
    while True:
        batch = range(next_entry_id, next_entry_id + rng.randint(1, 8))
        next_entry_id = batch.stop
        try:
            await asyncio.gather(*(_add(storage, seed, ledger_id, e) for e in batch))
        except LedgerFencedError:
            if ledger_id % 100 == FENCED:
                return
            raise
        if ledger_id % 100 == LAC:
            _say(f"LACPUSH {ledger_id} {batch.stop - 1}")
            await storage.write_lac(ledger_id, MASTER_KEY, batch.stop - 1)


async def _work(storage: ShardStorage, seed: int, round_number: int) -> None:
    base = round_number * 100
    victim, fenced = base + VICTIM, base + FENCED
    await asyncio.gather(*(_add(storage, seed, victim, e) for e in range(5)))
    _say(f"DELETE {victim}")
    await storage.delete_ledger(victim)
    _say(f"DELETED {victim}")
    appenders = asyncio.gather(
        *(_append_forever(storage, seed, base + task) for task in (*range(TASKS), FENCED, LAC))
    )
    await asyncio.sleep(0.05)
    _say(f"FENCE {fenced}")
    await storage.fence(fenced, MASTER_KEY)
    _say(f"FENCED {fenced}")
    await appenders  # Never returns: the others append until killed.


async def main(root: Path, seed: int, round_number: int, phase: str, cache_bytes: int) -> None:
    storage = await _open(root, cache_bytes, stall=phase == "stall")
    _say("READY")
    await _work(storage, seed, round_number)


if __name__ == "__main__":
    configure_logging(json=True, level="warning")
    asyncio.run(
        main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    )
