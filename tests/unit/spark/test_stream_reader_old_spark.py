"""The streaming reader on Spark 4.0/4.1, whose engine calls `latestOffset()` without the start
offset: the reader must not take the start from a fresh `initialOffset()` when Spark did not
ask for one (a query restarted from its checkpoint). A rate limit counted from there gave an
end behind the checkpoint's start, and the next micro-batch read those records again.

A stream record of sealed segments alone (SQLite metadata, no bookie): offsets need no read."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkaio.meta import initialise_cluster_at, open_metadata
from bkaio.spark import runtime
from bkaio.spark.options import parse_read_options
from bkaio.spark.source import BkaioStreamReader
from bkaio.stream.model import Segment, SegmentState, StreamMeta
from bkaio.stream.store import StreamStore

NAME = "tenant/s"


@pytest.fixture
def uri(tmp_path: Path) -> Iterator[str]:
    """Metadata holding tenant/s: seqs 0..99 in two sealed segments."""
    uri = f"sqlite://{tmp_path / 'meta.db'}"

    async def setup() -> None:
        await initialise_cluster_at(uri)
        metadata = await open_metadata(uri)
        segments = (
            Segment(7, 0, 49, SegmentState.CLOSED, 1, 1, 5000),
            Segment(8, 50, 99, SegmentState.CLOSED, 1, 1, 5000),
        )
        await StreamStore(metadata).put_stream("tenant", "s", StreamMeta(segments=segments))
        await metadata.close()

    asyncio.run(setup())
    try:
        yield uri
    finally:
        runtime.shutdown()


def reader(uri: str) -> BkaioStreamReader:
    options = {"metadata": uri, "stream": NAME, "maxEntriesPerTrigger": "10"}
    return BkaioStreamReader(parse_read_options(options, streaming=True))


def test_a_new_query_is_rate_limited_from_its_initial_offset(uri: str) -> None:
    fresh = reader(uri)
    assert fresh.initialOffset() == {NAME: 0}
    assert fresh.latestOffset() == {NAME: 10}
    assert fresh.latestOffset() == {NAME: 20}


def test_a_restarted_query_never_ends_a_batch_before_its_checkpoint(uri: str) -> None:
    # Restarted with the checkpoint at seq 50: Spark asks for no initial offset.
    restarted = reader(uri)
    end = restarted.latestOffset()
    assert end[NAME] >= 50  # Was 10: seqs 10..49 read a second time in the next batch.
    assert restarted.latestOffset()[NAME] <= end[NAME] + 10  # Limited again from there.


def test_a_replayed_batch_gives_the_start_of_the_next(uri: str) -> None:
    # Restarted with batch 40..50 planned and not committed: Spark replays it first.
    restarted = reader(uri)
    restarted.partitions({NAME: 40}, {NAME: 50})
    assert restarted.latestOffset() == {NAME: 60}
