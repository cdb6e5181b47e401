"""Offsets given as a ledger position, {"ledgerId": L, "entryId": E}: an entry past the end of
a sealed segment names no record of it, and is refused naming the option, rather than counted
on into the next segments (a read starting or ending records away from where it was asked)."""

from __future__ import annotations

import pytest

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.spark import catalog
from bkaio.spark.errors import SparkOptionError
from bkaio.spark.options import parse_read_options
from bkaio.spark.planner import ReadRange
from bkaio.stream import open_namespace
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.stream.conftest import ClientFactory

URI = "sqlite:///unused"


async def two_segments(bk: BookKeeper) -> list[int]:
    """tenant/s: seqs 0..2 in one ledger, 3..5 in the next; the two ledger ids."""
    ns = await open_namespace(bk, "tenant", create=True)
    for first in (0, 3):
        writer = await ns.open_writer("s")
        for i in range(first, first + 3):
            await writer.write(b"%d" % i)
        await writer.close()
    meta = await StreamStore(metadata_of(bk)).get_stream("tenant", "s")
    return [s.ledger_id for s in meta.segments if s.record_count > 0]


def seq_bounds(partitions: list[tuple[ReadRange, ...]]) -> tuple[int, int]:
    """The first and last seq a batch plan reads."""
    ranges = [r for p in partitions for r in p]
    last = ranges[-1]
    return ranges[0].first_seq, last.first_seq + last.last_entry_id - last.first_entry_id


@pytest.mark.parametrize("key", ["startingOffsets", "endingOffsets"])
async def test_an_entry_past_the_end_of_a_sealed_segment_is_refused(
    make_client: ClientFactory, key: str
) -> None:
    bk = await make_client()
    first_ledger, _ = await two_segments(bk)
    position = f'{{"tenant/s": {{"ledgerId": {first_ledger}, "entryId": 4}}}}'
    options = parse_read_options(
        {"metadata": URI, "stream": "tenant/s", key: position}, streaming=False
    )
    with pytest.raises(SparkOptionError, match=f"option {key}: entry 4 of ledger {first_ledger}"):
        await catalog.plan_batch(bk, options)


async def test_positions_within_a_segment_and_just_past_it_still_apply(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    first_ledger, second_ledger = await two_segments(bk)
    options = parse_read_options(
        {
            "metadata": URI,
            "stream": "tenant/s",
            "startingOffsets": f'{{"tenant/s": {{"ledgerId": {first_ledger}, "entryId": 1}}}}',
            # Exclusive: just past the first segment's last entry, so up to seq 2.
            "endingOffsets": f'{{"tenant/s": {{"ledgerId": {first_ledger}, "entryId": 3}}}}',
        },
        streaming=False,
    )
    assert seq_bounds(await catalog.plan_batch(bk, options)) == (1, 2)
    options = parse_read_options(
        {
            "metadata": URI,
            "stream": "tenant/s",
            "startingOffsets": f'{{"tenant/s": {{"ledgerId": {second_ledger}, "entryId": 2}}}}',
        },
        streaming=False,
    )
    assert seq_bounds(await catalog.plan_batch(bk, options)) == (5, 5)
