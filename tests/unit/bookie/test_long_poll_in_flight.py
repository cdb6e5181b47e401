"""A tail's long poll and the entries its bookie is still journaling: the LAC (from the other
bookies of the ack quorum) may pass an entry this bookie has not synced yet; the poll waits for
it (bounded by `server.long_poll_in_flight_wait_seconds`) and answers with it, instead of
answering without it and costing the reader a second round trip."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bkaio.bookie.read_entries import read_entries
from bkaio.bookie.server import ShardServer
from bkaio.config import build_bookie_config
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.entrylog.types import StoredEntry
from bkaio.errors import ConfigError
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


async def entry_0_journaling_at_lac_0(
    storage: ShardStorage, gate: FakeGatedSync
) -> asyncio.Task[None]:
    """Entry 0 added with its sync held, and LAC 0 (the ack quorum has it): the add's task."""
    adding = asyncio.create_task(add_entry(storage, ENTRY_0, KEY))
    assert await asyncio.to_thread(gate.entered.wait, 30)  # Entry 0's sync is held.
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


async def test_a_poll_answers_with_an_entry_once_this_bookie_journaled_it(
    tmp_path: Path,
) -> None:
    # The longest wait allowed: nothing but the released sync may end it in this test.
    options = "long_poll_in_flight_wait_seconds = 1.0\n"
    async with shard_with_held_sync(tmp_path, options) as (server, storage, gate):
        adding = await entry_0_journaling_at_lac_0(storage, gate)
        answer = asyncio.create_task(read_entries(server, poll(previous_lac=-1)))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not answer.done()  # Waiting for entry 0, not answering without it.
        gate.release()
        await adding
        answered = await answer
        assert entry_ids(answered) == [0]
        assert isinstance(answered, ReadEntriesResponse) and answered.lac == 0


async def test_the_wait_is_bounded_and_then_the_answer_goes_without_the_entry(
    tmp_path: Path,
) -> None:
    options = "long_poll_in_flight_wait_seconds = 0.01\n"
    async with shard_with_held_sync(tmp_path, options) as (server, storage, gate):
        adding = await entry_0_journaling_at_lac_0(storage, gate)
        answer = await read_entries(server, poll(previous_lac=-1))
        assert entry_ids(answer) == [] and isinstance(answer, ReadEntriesResponse)
        assert answer.lac == 0 and answer.next_entry_id == 1  # The reader reads it elsewhere.
        gate.release()
        await adding


@pytest.mark.parametrize("seconds", [-0.1, 1.5])
def test_a_wait_out_of_range_is_refused(seconds: float) -> None:
    with pytest.raises(ConfigError, match="long_poll_in_flight_wait_seconds"):
        build_bookie_config(
            {"bookie": {"shards": 1}, "server": {"long_poll_in_flight_wait_seconds": seconds}},
            env={},
        )
