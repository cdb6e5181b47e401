"""A test ledger (`simpletest`, `bookiesanity`) is closed and deleted whatever fails half-way,
and a cleanup that fails is the command's error, naming the ledger left behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bkaio.cli.scratch_ledger import (
    LedgerLeftBehindError,
    check_read_back,
    scratch_ledger,
    scratch_payload,
)
from bkaio.errors import BKError, NoSuchEntryError, NotEnoughBookiesError


class FakeHandle:
    """The ScratchHandle protocol: a ledger handle that records its close."""

    def __init__(self, ledger_id: int, *, close_fails: bool = False) -> None:
        self._ledger_id = ledger_id
        self._closed = False
        self._close_fails = close_fails

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        if self._close_fails:
            raise NotEnoughBookiesError("fake: no bookie answers the close")
        self._closed = True


class FakeClient:
    """The ScratchClient protocol: a client that records the ledgers it deleted."""

    def __init__(self, *, delete_fails: bool = False) -> None:
        self.deleted: list[int] = []
        self._delete_fails = delete_fails

    async def delete_ledger(self, ledger_id: int) -> None:
        if self._delete_fails:
            raise BKError("fake: metadata unreachable")
        self.deleted.append(ledger_id)


async def test_a_ledger_that_worked_is_closed_and_deleted() -> None:
    client, handle = FakeClient(), FakeHandle(7)
    async with scratch_ledger(client, handle):
        pass
    assert handle.is_closed and client.deleted == [7]


async def test_a_failure_half_way_still_closes_and_deletes_and_is_raised() -> None:
    client, handle = FakeClient(), FakeHandle(7)
    with pytest.raises(NotEnoughBookiesError, match="append failed"):
        async with scratch_ledger(client, handle):
            raise NotEnoughBookiesError("append failed")
    assert handle.is_closed and client.deleted == [7]


async def test_an_interruption_still_cleans_up() -> None:
    client, handle = FakeClient(), FakeHandle(7)
    with pytest.raises(asyncio.CancelledError):
        async with scratch_ledger(client, handle):
            raise asyncio.CancelledError
    assert handle.is_closed and client.deleted == [7]


async def test_a_close_that_fails_before_a_delete_that_works_leaves_nothing_behind() -> None:
    """`bookiesanity` of a bookie that refuses our auth token: the add fails, the close fails
    for the same reason, the delete works. The error is the add's, not a ledger "left behind"
    that was deleted."""
    client, handle = FakeClient(), FakeHandle(7, close_fails=True)
    with pytest.raises(NotEnoughBookiesError, match="append failed"):
        async with scratch_ledger(client, handle):
            raise NotEnoughBookiesError("append failed")
    assert client.deleted == [7]  # The delete is tried even when the close failed.


async def test_a_close_and_a_delete_that_fail_name_the_ledger_and_both_failures() -> None:
    client, handle = FakeClient(delete_fails=True), FakeHandle(7, close_fails=True)
    with pytest.raises(LedgerLeftBehindError, match="append failed; test ledger 7") as caught:
        async with scratch_ledger(client, handle):
            raise NotEnoughBookiesError("append failed")
    assert "close: fake: no bookie" in str(caught.value)
    assert "delete: fake: metadata unreachable" in str(caught.value)
    assert isinstance(caught.value.__cause__, NotEnoughBookiesError)


async def test_a_delete_that_fails_after_success_is_the_error() -> None:
    client, handle = FakeClient(delete_fails=True), FakeHandle(7)
    with pytest.raises(LedgerLeftBehindError, match="test ledger 7 was not cleaned up"):
        async with scratch_ledger(client, handle):
            pass


class FakeEntry:
    def __init__(self, entry_id: int, payload: bytes) -> None:
        self.entry_id = entry_id
        self.payload = payload


class FakeReader:
    """The ScratchReader protocol: hands out the entries it was given, in order."""

    def __init__(self, payloads: list[bytes]) -> None:
        self._payloads = payloads

    async def read_iter(self, first_entry_id: int, last_entry_id: int) -> AsyncIterator[FakeEntry]:
        for entry_id in range(first_entry_id, min(last_entry_id + 1, len(self._payloads))):
            yield FakeEntry(entry_id, self._payloads[entry_id])


async def test_the_read_back_is_checked_entry_by_entry() -> None:
    written = [scratch_payload("simpletest", i) for i in range(5)]
    await check_read_back(FakeReader(written), "simpletest", 5, "ledger 7")
    changed = [*written[:3], b"other", written[4]]
    with pytest.raises(NoSuchEntryError, match=r"ledger 7: read-back differs .* at entry 3"):
        await check_read_back(FakeReader(changed), "simpletest", 5, "ledger 7")
    with pytest.raises(NoSuchEntryError, match="ledger 7: read back 4 of 5 entries"):
        await check_read_back(FakeReader(written[:4]), "simpletest", 5, "ledger 7")
