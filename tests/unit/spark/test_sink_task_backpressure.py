"""A sink task appends its rows in chunks of batchEntries; a chunk larger than the client's
room for adds (max_outstanding_adds in flight plus max_queued_adds held back) waits for
acknowledgements instead of failing every task with TooManyRequestsError."""

from __future__ import annotations

import asyncio
import gc

import pytest

from bkaio.errors import BKError
from bkaio.spark import sink
from bkaio.spark.options import WriteOptions
from bkaio.stream.segments import STREAM_PASSWORD
from tests.unit.ledger_client.fakes import FakeBookieOps
from tests.unit.stream.conftest import BOOKIE_IDS, ClientFactory

QUORUMS = sink.Quorums(ensemble_size=3, write_quorum=3, ack_quorum=2)


async def test_a_chunk_larger_than_the_clients_add_queue_is_written_whole(
    make_client: ClientFactory,
) -> None:
    executor = await make_client(max_outstanding_adds=2, max_queued_adds=3)
    options = WriteOptions(metadata="unused", namespace="tenant", stream="out", batch_entries=50)
    task = sink.TaskLedgerWriter(executor, options, QUORUMS, "job-1")
    rows = [b"row %d" % i for i in range(50)]
    await task.append(rows)
    written = await task.finish()
    assert written is not None and written.last_entry_id == 49
    handle = await executor.open_ledger(written.ledger_id, password=STREAM_PASSWORD)
    assert [e.payload for e in await handle.read(0, 49)] == rows


async def test_a_ledger_failing_mid_chunk_leaves_no_acknowledgement_unretrieved(
    make_client: ClientFactory, fake_bookies: FakeBookieOps
) -> None:
    """The bookies fail while the task waits for room: append raises the ledger's failure, and
    the acknowledgements already asked for, failed with it, are not left for the event loop's
    handler to report ('Future exception was never retrieved')."""
    executor = await make_client(max_outstanding_adds=2, add_timeout=0.2)
    options = WriteOptions(metadata="unused", namespace="tenant", stream="out", batch_entries=50)
    task = sink.TaskLedgerWriter(executor, options, QUORUMS, "job-1")
    await task.append([b"first"])  # The ledger exists; its ensemble is every bookie.
    fake_bookies.down.update(BOOKIE_IDS[1:])  # Two of three: no ack quorum, no replacement.
    with pytest.raises(BKError):
        await task.append([b"row %d" % i for i in range(50)])
    await task.discard()
    gc.collect()  # An unretrieved exception is reported when its future is collected.
    await asyncio.sleep(0)
