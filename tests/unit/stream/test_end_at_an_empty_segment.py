"""The end of a stream whose last segment is empty (just rolled, or sealed with nothing in it)
is that segment's first seq: the next record gets it, the last one written is just before it
(docs/streams.md, "The end of a stream is exact"). Not the previous segment's start, not -1."""

from __future__ import annotations

import pytest

from bkaio.stream import InvalidStreamArgumentError, StreamPosition, open_namespace
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_streams import take


async def test_the_end_floors_at_an_empty_open_or_sealed_last_segment(
    make_client: ClientFactory,
) -> None:
    bk, other_client = await make_client(), await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    written = [await writer.write(b"%010d" % i) for i in range(3)]  # Each one rolls.
    await writer.wait_for_capacity()  # The last roll is done: an empty open segment.
    empty = (await ns.stream_metadata("s")).open_segment
    assert empty is not None and empty.first_seq == 3
    assert empty.ledger_id not in {p.ledger_id for p in written}

    assert await ns.end_seq("s") == 3
    async with await ns.open_reader("s", cursor="c") as reader:
        await reader.ack((await reader.__anext__()).position)
    assert [c.lag for c in await ns.cursors("s")] == [2]  # Seqs 1 and 2 after seq 0.
    latest = await ns.open_reader("s", "latest", long_poll_seconds=0.2)
    assert latest.next_seq == 3
    assert await latest.acknowledged_end() == 3
    at_end = await ns.open_reader("s", StreamPosition(empty.ledger_id, 0, 3))
    await at_end.close()
    with pytest.raises(InvalidStreamArgumentError, match="next seq 3"):
        await ns.open_reader("s", StreamPosition(empty.ledger_id, 1, 4))

    next_position = await writer.write(b"0123456789")  # Rolls again.
    assert next_position == StreamPosition(empty.ledger_id, 0, 3)
    assert [r.position for r in await take(latest, 1)] == [next_position]
    await latest.close()

    # Sealed empty: by a roll right after that record, then by the writer's close.
    await writer.wait_for_capacity()
    await writer.close()
    meta = await ns.stream_metadata("s")
    assert meta.open_segment is None
    assert meta.segments[-1].first_seq == 4 and meta.segments[-1].last_seq == 3
    assert await ns.end_seq("s") == 4
    latest = await ns.open_reader("s", "latest")
    assert latest.next_seq == 4
    assert await latest.acknowledged_end() == 4
    await latest.close()

    # Opened again by another client: the empty sealed segment stays, the new one starts at 4.
    ns2 = await open_namespace(other_client, "tenant")
    reopened = await ns2.open_writer("s")
    assert await ns.end_seq("s") == 4
    assert (await reopened.write(b"after")).seq == 4
    await reopened.close()
