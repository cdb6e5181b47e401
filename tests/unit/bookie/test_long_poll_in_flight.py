"""A tail's long poll and the entries its bookie is still journaling: the LAC (from the other
bookies of the ack quorum) may pass an entry this bookie has not synced yet; the poll answers
with it at once, from memory (the ack quorum holds it durably), neither waiting for this
bookie's sync nor costing the reader a second round trip. Reads that are not long polls
still see only what is durable here."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from bkaio.bookie.read_entries import read_entries
from bkaio.bookie.server import ShardServer
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.entrylog.types import StoredEntry
from bkaio.journal import Journal, JournalConfig
from bkaio.protocol import I64_MAX, Flag, ReadEntriesRequest, ReadEntriesResponse, Status
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.records import scan_records
from tests.fixtures.shard import served_shard
from tests.fixtures.storage import add_entry
from tests.unit.entrylog.conftest import KEY
from tests.unit.journal.fakes import FakeGatedSync

LEDGER = 3
PAYLOAD = b"entry 0"
# Entry 0 as a writer sends it (its digest checked again by the reader's scan).
ENTRY_0 = StoredEntry(
    LEDGER, 0, -1, len(PAYLOAD), entry_digest(LEDGER, 0, -1, len(PAYLOAD), PAYLOAD), PAYLOAD
)


@asynccontextmanager
async def shard_with_held_sync(
    tmp_path: Path, server_options: str = ""
) -> AsyncIterator[tuple[ShardServer, ShardStorage, FakeGatedSync]]:
    """A served shard whose journal holds its first sync until released."""
    gate = FakeGatedSync()

    async def held_journal(config: JournalConfig, directory: Path) -> Journal:
        return await Journal.open(
            dataclasses.replace(config, sync=True), directory=directory, sync_function=gate
        )

    async with served_shard(tmp_path, server_options, journal_factory=held_journal) as (
        server,
        storage,
    ):
        try:
            yield server, storage, gate
        finally:
            gate.release()


async def entry_0_journaling(storage: ShardStorage, gate: FakeGatedSync) -> asyncio.Task[None]:
    """Entry 0 added with its sync held: the add's task."""
    adding = asyncio.create_task(add_entry(storage, ENTRY_0, KEY))
    assert await asyncio.to_thread(gate.entered.wait, 30)  # Entry 0's sync is held.
    return adding


async def entry_0_journaling_at_lac_0(
    storage: ShardStorage, gate: FakeGatedSync
) -> asyncio.Task[None]:
    """Entry 0 added with its sync held, and LAC 0 (the ack quorum has it): the add's task."""
    adding = await entry_0_journaling(storage, gate)
    await storage.write_lac(LEDGER, KEY, 0)
    return adding


def poll(previous_lac: int, timeout_ms: int = 10_000) -> ReadEntriesRequest:
    return ReadEntriesRequest(
        1, LEDGER, previous_lac + 1, I64_MAX, 1, 100, 1 << 20, Flag.LONG_POLL, previous_lac,
        timeout_ms,
    )  # fmt: skip


def entry_ids(answer: object) -> list[int]:
    assert isinstance(answer, ReadEntriesResponse) and answer.status is Status.OK, answer
    scan = scan_records(answer.records_bytes, LEDGER, 0, 1, I64_MAX)
    assert scan.problem is None and not scan.corrupt
    return scan.entry_ids


def plain_read(first: int, last: int) -> ReadEntriesRequest:
    return ReadEntriesRequest(2, LEDGER, first, last, 1, 100, 1 << 20, Flag.NONE, -1, 0)


async def test_a_poll_answers_with_an_entry_this_bookie_is_still_journaling(
    tmp_path: Path,
) -> None:
    async with shard_with_held_sync(tmp_path) as (server, storage, gate):
        adding = await entry_0_journaling_at_lac_0(storage, gate)
        answered = await read_entries(server, poll(previous_lac=-1))
        assert entry_ids(answered) == [0]  # Its sync still held.
        assert isinstance(answered, ReadEntriesResponse) and answered.lac == 0
        assert answered.next_entry_id == 1
        assert not adding.done()
        gate.release()
        await adding


async def test_a_poll_waiting_for_the_lac_answers_with_the_entry_it_covers(
    tmp_path: Path,
) -> None:
    async with shard_with_held_sync(tmp_path) as (server, storage, gate):
        adding = await entry_0_journaling(storage, gate)
        answer = asyncio.create_task(read_entries(server, poll(previous_lac=-1)))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not answer.done()  # No LAC covers entry 0 yet.
        await storage.write_lac(LEDGER, KEY, 0)
        server.lac_waiters.notify(LEDGER, 0)  # What the WRITE_LAC handler does.
        assert entry_ids(await answer) == [0]
        gate.release()
        await adding


async def test_reads_other_than_long_polls_see_only_what_is_durable_here(
    tmp_path: Path,
) -> None:
    async with shard_with_held_sync(tmp_path) as (server, storage, gate):
        adding = await entry_0_journaling_at_lac_0(storage, gate)
        answer = await read_entries(server, plain_read(0, 0))
        assert entry_ids(answer) == []  # Not durable here yet (a recovery may ask).
        run = await storage.read_records(LEDGER, 0, 0, 1, 10, 1 << 20)
        assert run.count == 0
        run = await storage.read_records(LEDGER, 0, 0, 1, 10, 1 << 20, journaling_up_to=0)
        assert run.count == 1
        gate.release()
        await adding
        assert entry_ids(await read_entries(server, plain_read(0, 0))) == [0]


async def test_entries_past_the_lac_are_not_taken_from_the_journal(tmp_path: Path) -> None:
    async with shard_with_held_sync(tmp_path) as (_server, storage, gate):
        adding = await entry_0_journaling_at_lac_0(storage, gate)
        run = await storage.read_records(LEDGER, 0, 5, 1, 10, 1 << 20, journaling_up_to=-1)
        assert run.count == 0
        gate.release()
        await adding
