"""Ledgers a command makes only to test with (`simpletest`, `bookiesanity`): never left behind.

    async with scratch_ledger(bk, handle):
        ... append, close, read back ...

On the way out, whatever happened, the ledger is closed (if still open) and deleted. A delete
that fails is never silent: it becomes the command's error (naming the ledger left behind),
chained to the failure that was in flight, if any.

Entry i's payload is `scratch_payload(tag, i)`, made when it is sent and again when it is checked
(`check_read_back`, as the entries stream in): memory does not grow with the entry count.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from bkaio.errors import BKError, NoSuchEntryError


class LedgerLeftBehindError(BKError):
    """A test ledger could not be closed or deleted."""


class ScratchHandle(Protocol):
    """What cleaning up needs of a ledger handle (bkaio.ledger_client.LedgerHandle)."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def is_closed(self) -> bool: ...

    async def close(self) -> None: ...


class ScratchClient(Protocol):
    """What cleaning up needs of a client (bkaio.ledger_client.BookKeeper)."""

    async def delete_ledger(self, ledger_id: int) -> None: ...


class ScratchEntry(Protocol):
    @property
    def entry_id(self) -> int: ...

    @property
    def payload(self) -> bytes: ...


class ScratchReader(Protocol):
    """What checking the read-back needs of a read handle (bkaio.ledger_client.ReadHandle)."""

    def read_iter(self, first_entry_id: int, last_entry_id: int) -> AsyncIterator[ScratchEntry]: ...


def scratch_payload(tag: str, index: int) -> bytes:
    return f"{tag} entry {index}".encode()


async def check_read_back(reader: ScratchReader, tag: str, entries: int, where: str) -> None:
    """Entries 0..entries-1 read back are `scratch_payload(tag, i)`, else NoSuchEntryError."""
    expected = 0
    async for entry in reader.read_iter(0, entries - 1):
        if entry.entry_id != expected or entry.payload != scratch_payload(tag, expected):
            raise NoSuchEntryError(
                f"{where}: read-back differs from what was written at entry {expected}"
            )
        expected += 1
    if expected != entries:
        raise NoSuchEntryError(f"{where}: read back {expected} of {entries} entries")


async def discard(bk: ScratchClient, handle: ScratchHandle) -> list[str]:
    """Close (if open) and delete the ledger; what went wrong if it is left behind, else
    nothing. Only a failed delete leaves it behind: a deleted ledger is gone from metadata and
    its bookies collect its entries whether or not it was closed, so a close that failed (the
    bookie that failed the command refuses it too) is then no problem to report."""
    close_problem: list[str] = []
    if not handle.is_closed:
        try:
            await handle.close()
        except BKError as error:
            close_problem.append(f"close: {error}")
    try:
        await bk.delete_ledger(handle.ledger_id)
    except BKError as error:
        return [*close_problem, f"delete: {error}"]
    return []


@contextlib.asynccontextmanager
async def scratch_ledger(bk: ScratchClient, handle: ScratchHandle) -> AsyncIterator[None]:
    try:
        yield
    except BKError as error:
        problems = await discard(bk, handle)
        if problems:
            raise LedgerLeftBehindError(
                f"{error}; test ledger {handle.ledger_id} was left behind ({'; '.join(problems)})"
            ) from error
        raise
    except BaseException:
        await discard(bk, handle)  # Interrupted (Ctrl-C, a timeout): clean up and go on out.
        raise
    problems = await discard(bk, handle)
    if problems:
        raise LedgerLeftBehindError(
            f"test ledger {handle.ledger_id} was not cleaned up ({'; '.join(problems)})"
        )
