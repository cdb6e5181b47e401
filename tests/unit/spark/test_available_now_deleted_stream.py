"""Trigger.AvailableNow on a query restarted from its checkpoint, one of whose named streams was
deleted: `prepareForTriggerAvailableNow` (which Spark calls before any offset, so with nothing
known) fixes the end of each stream there is, and leaves the deleted one to `latestOffset`
(DataLossError, or skipped with failOnDataLoss=false) instead of failing the query on it with
StreamNotFoundError whatever failOnDataLoss says.

Stream records of sealed segments alone (SQLite metadata, no bookie): offsets need no read."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkaio.meta import initialise_cluster_at, open_metadata
from bkaio.spark import runtime
from bkaio.spark.errors import DataLossError
from bkaio.spark.options import parse_read_options
from bkaio.spark.source import BkaioStreamReader
from bkaio.stream.model import Segment, SegmentState, StreamMeta
from bkaio.stream.store import StreamStore


@pytest.fixture
def uri(tmp_path: Path) -> Iterator[str]:
    """tenant/a and tenant/b (seqs 0..49 each); then tenant/b deleted."""
    uri = f"sqlite://{tmp_path / 'meta.db'}"

    async def setup() -> None:
        await initialise_cluster_at(uri)
        metadata = await open_metadata(uri)
        store = StreamStore(metadata)
        for ledger_id, name in ((7, "a"), (8, "b")):
            segment = Segment(ledger_id, 0, 49, SegmentState.CLOSED, 1, 1, 5000)
            meta = await store.put_stream("tenant", name, StreamMeta(segments=(segment,)))
        await store.delete_stream("tenant", "b", version=meta.version)
        await metadata.close()

    asyncio.run(setup())
    try:
        yield uri
    finally:
        runtime.shutdown()


def reader(uri: str, fail_on_data_loss: str) -> BkaioStreamReader:
    options = {
        "metadata": uri,
        "streams": "tenant/a,tenant/b",
        "failOnDataLoss": fail_on_data_loss,
    }
    return BkaioStreamReader(parse_read_options(options, streaming=True))


def test_available_now_goes_on_without_a_deleted_stream_when_loss_is_allowed(uri: str) -> None:
    restarted = reader(uri, "false")
    restarted.prepareForTriggerAvailableNow()  # Was StreamNotFoundError.
    checkpoint = {"tenant/a": 10, "tenant/b": 20}
    assert restarted.latestOffset(checkpoint, None) == {"tenant/a": 50, "tenant/b": 20}


def test_available_now_fails_on_a_deleted_stream_as_data_loss(uri: str) -> None:
    restarted = reader(uri, "true")
    restarted.prepareForTriggerAvailableNow()
    with pytest.raises(DataLossError, match="stream tenant/b was deleted"):
        restarted.latestOffset({"tenant/a": 10, "tenant/b": 20}, None)
