"""Reads of entries whose entry log is damaged: a clear error, never a wrong or missing answer.

An index location past the end of its log (a log cut short), and a log that is gone (deleted
or lost with its disk's files while the index still points into it), through both read paths:
`read_range` (entries) and `read_records` (READ_ENTRIES, records as on disk)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bkaio.entrylog.entry_log import log_file_name
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.errors import BookieIOError
from tests.fixtures.storage import add_entry, read_entry
from tests.unit.entrylog.conftest import KEY, OpenStorage, make_config, make_entry

LEDGER = 3
ENTRIES = 10


async def _stored(open_storage: OpenStorage, tmp_path: Path) -> tuple[ShardStorage, Path]:
    """Storage on one disk with ENTRIES entries of LEDGER flushed to entry log 0; its path."""
    storage = await open_storage(make_config(tmp_path, disks=1))
    for entry_id in range(ENTRIES):
        await add_entry(storage, make_entry(LEDGER, entry_id), KEY)
    await storage.checkpoint()
    return storage, tmp_path / "ledgers0" / "logs" / log_file_name(0)


async def _read_records(storage: ShardStorage) -> object:
    return await storage.read_records(LEDGER, 0, ENTRIES - 1, 1, ENTRIES, 1 << 20)


@pytest.mark.parametrize("reopen", [False, True])
async def test_an_index_location_past_the_end_of_its_log_is_a_clear_error(
    open_storage: OpenStorage, tmp_path: Path, reopen: bool
) -> None:
    storage, log = await _stored(open_storage, tmp_path)
    size = log.stat().st_size
    os.truncate(log, size - 50)  # The last entry's record is cut.
    if reopen:
        await storage.close()
        storage = await open_storage(make_config(tmp_path, disks=1))
    assert await read_entry(storage, LEDGER, ENTRIES - 2) == make_entry(LEDGER, ENTRIES - 2)
    with pytest.raises(BookieIOError, match="short read"):
        await read_entry(storage, LEDGER, ENTRIES - 1)
    with pytest.raises(BookieIOError, match="short read"):
        await _read_records(storage)


@pytest.mark.parametrize("reopen", [False, True])
async def test_an_entry_log_that_is_gone_is_named_as_missing(
    open_storage: OpenStorage, tmp_path: Path, reopen: bool
) -> None:
    """Not taken for a log compaction removed (which repoints the index first): the error
    says the log is missing, at once."""
    storage, log = await _stored(open_storage, tmp_path)
    # With `reopen` it is gone before a start, and is not the newest log: a start makes its
    # new log after the newest there, and would take log 0's id again.
    if reopen:
        await storage.close()
        await (await open_storage(make_config(tmp_path, disks=1))).close()
    log.unlink()
    if reopen:
        storage = await open_storage(make_config(tmp_path, disks=1))
    with pytest.raises(BookieIOError, match=f"{log.name}: entry log missing"):
        await read_entry(storage, LEDGER, 0)
    with pytest.raises(BookieIOError, match=f"entry log in {log.parent} .* is missing"):
        await _read_records(storage)
