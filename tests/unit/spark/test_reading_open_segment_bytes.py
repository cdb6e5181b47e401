"""An open segment's range is read in client batches of about read_batch_bytes, not batchEntries
entries whatever their size: its size is not known when planned, so `read_entries` asked the
client for batches of batchEntries (4096) entries, and a batch of 1 MiB records was 4 GiB in the
executor's memory before it was cut into record batches (b1dfc7a bounded the record batches
only). Now a first batch of one entry, then runs of batches sized by the entries read before."""

from __future__ import annotations

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.spark import reading
from bkaio.spark.planner import ReadRange
from bkaio.stream import StreamWriter, open_namespace
from bkaio.stream.segments import STREAM_PASSWORD
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.stream.conftest import ClientFactory

BOUND = 4000
PAYLOADS = [bytes([i]) * 1000 for i in range(50)]


async def live_stream(bk: BookKeeper) -> tuple[StreamWriter, ReadRange]:
    """tenant/live with PAYLOADS, its writer left open; the open segment's whole range."""
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("live")
    for payload in PAYLOADS:
        await writer.write(payload)
    stream = await StreamStore(metadata_of(bk)).get_stream("tenant", "live")
    segment = stream.open_segment
    assert segment is not None
    last = len(PAYLOADS) - 1
    return writer, ReadRange("tenant/live", segment.ledger_id, 0, last, 0, 0, STREAM_PASSWORD)


async def test_an_open_segment_is_read_in_batches_of_about_read_batch_bytes(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    writer, item = await live_stream(bk)
    batches = [
        batch async for batch in reading.read_entries(bk, item, 4096, True, batch_bytes=BOUND)
    ]
    sizes = [sum(len(entry.payload) for entry in batch) for batch in batches]
    assert max(sizes) <= BOUND, sizes  # Was 50,000: every entry in one batch.
    assert [entry.payload for batch in batches for entry in batch] == PAYLOADS
    assert [entry.entry_id for batch in batches for entry in batch] == list(range(len(PAYLOADS)))
    await writer.close()
