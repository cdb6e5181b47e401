"""ShardStorage.add_entry_nowait: the bookie's add fast path takes only the plain case."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkaio.errors import LedgerFencedError, UnauthorizedError
from tests.unit.entrylog.conftest import KEY, OTHER_KEY, OpenStorage, make_config, make_entry


async def test_known_ledger_next_entry_is_journaled_and_applied(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    await storage.add_entry(make_entry(7, 0), KEY)
    future = storage.add_entry_nowait(make_entry(7, 1), KEY)
    assert future is not None
    await future
    assert await storage.read_entry(7, 1) == make_entry(7, 1)
    state = storage.ledger_state(7)
    assert state is not None and state.last_entry_id == 1


async def test_cases_left_to_the_async_path(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    assert storage.add_entry_nowait(make_entry(8, 0), KEY) is None  # Unknown ledger.
    assert storage.ledger_state(8) is None  # ... and nothing changed.
    await storage.add_entry(make_entry(8, 0), KEY)
    assert storage.add_entry_nowait(make_entry(8, 0), KEY) is None  # At the last entry.
    first = storage.add_entry_nowait(make_entry(8, 1), KEY)
    assert first is not None
    assert storage.add_entry_nowait(make_entry(8, 1), KEY) is None  # Same entry in flight.
    await first
    await storage.add_entry(make_entry(8, 1), KEY)  # The async path accepts the duplicate.


async def test_wrong_key_and_fenced_ledger_raise(open_storage: OpenStorage) -> None:
    storage = await open_storage()
    await storage.add_entry(make_entry(9, 0), KEY)
    with pytest.raises(UnauthorizedError):
        storage.add_entry_nowait(make_entry(9, 1), OTHER_KEY)
    await storage.fence(9, KEY)
    with pytest.raises(LedgerFencedError):
        storage.add_entry_nowait(make_entry(9, 1), KEY)
    future = storage.add_entry_nowait(make_entry(9, 1), KEY, recovery=True)
    assert future is not None
    await future


async def test_a_full_write_cache_is_left_to_the_async_path(
    open_storage: OpenStorage, tmp_path: Path
) -> None:
    storage = await open_storage(make_config(tmp_path, write_cache_bytes=4096))
    await storage.add_entry(make_entry(10, 0), KEY)
    big = make_entry(10, 1, payload=b"x" * 8192)
    assert storage.add_entry_nowait(big, KEY) is None
