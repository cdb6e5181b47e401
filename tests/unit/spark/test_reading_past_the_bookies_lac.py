"""A read planned up to a stream's exact end (the last record acknowledged to its writer) while
the bookies' LAC still lags it by the entries whose LAC no add or WRITE_LAC has carried yet: a
writer that went quiet (or died) after its acks. The partition's reader must read what was
planned, not fail with 'entry N is beyond its LAC'."""

from __future__ import annotations

from bkaio.spark import catalog
from bkaio.spark.options import parse_read_options
from bkaio.spark.reading import read_entries
from bkaio.stream import open_namespace
from tests.unit.stream.conftest import ClientFactory

URI = "sqlite:///unused"


async def test_a_partition_ending_past_the_bookies_lac_reads_every_planned_record(
    make_client: ClientFactory,
) -> None:
    writer_client = await make_client(explicit_lac_interval=0)  # No WRITE_LAC: the LAC lags.
    reader_client = await make_client()
    ns = await open_namespace(writer_client, "tenant", create=True)
    writer = await ns.open_writer("live")
    for i in range(5):
        await writer.write(b"record %d" % i)
    options = parse_read_options({"metadata": URI, "stream": "tenant/live"}, streaming=False)
    (partition,) = await catalog.plan_batch(reader_client, options)
    (item,) = partition
    assert (item.first_seq, item.last_entry_id) == (0, 4)  # Planned to the exact end.
    payloads = [
        entry.payload
        async for batch in read_entries(reader_client, item, 2, True, batch_bytes=1 << 20)
        for entry in batch
    ]
    assert payloads == [b"record %d" % i for i in range(5)]
    await writer.close()
