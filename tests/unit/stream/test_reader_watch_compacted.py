"""A reader whose record watch fell behind the store's compaction (cut off from the store for
longer than it keeps changes): WatchCompactedError failed the reader for good, a tailing
consumer stopping on a stream with nothing wrong. It reads the record again and watches from
after that read, as the error says, and goes on across the changes it missed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bkaio.meta.errors import WatchCompactedError
from bkaio.stream import StreamNotFoundError, open_namespace
from bkaio.stream.model import StreamMeta
from bkaio.stream.store import StreamStore
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_streams import take


def compacted_first_watch(monkeypatch: pytest.MonkeyPatch, go: asyncio.Event) -> list[int]:
    """The first watch fails with WatchCompactedError once `go` is set; the start revision
    of every watch is recorded."""
    real_watch = StreamStore.watch_stream
    starts: list[int] = []

    async def watch(
        self: StreamStore, namespace: str, stream: str, start_revision: int
    ) -> AsyncIterator[StreamMeta | None]:
        starts.append(start_revision)
        if len(starts) == 1:
            await go.wait()
            raise WatchCompactedError("changes after the watch's revision were compacted")
        async for meta in real_watch(self, namespace, stream, start_revision):
            yield meta

    monkeypatch.setattr(StreamStore, "watch_stream", watch)
    return starts


async def test_a_reader_goes_on_across_a_roll_its_compacted_watch_missed(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    go = asyncio.Event()
    starts = compacted_first_watch(monkeypatch, go)
    reader = await ns.open_reader("s", long_poll_seconds=0.2)
    first = await writer.write(b"0123456789")  # Rolls: the watch would bring the new segment.
    await writer.wait_for_capacity()
    after = await writer.write(b"after the roll")
    assert after.ledger_id != first.ledger_id
    go.set()
    assert [r.position for r in await take(reader, 2)] == [first, after]
    assert len(starts) == 2 and starts[1] > starts[0]
    await reader.close()
    await writer.close()


async def test_a_stream_deleted_while_the_watch_was_cut_off_fails_the_reader(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    first = await writer.write(b"first")
    await writer.close()
    go = asyncio.Event()
    compacted_first_watch(monkeypatch, go)
    reader = await ns.open_reader("s", long_poll_seconds=0.2)
    assert [r.position for r in await take(reader, 1)] == [first]
    await ns.delete_stream("s")
    recreated = await ns.open_writer("s")  # Another stream of the name.
    await recreated.write(b"another stream")
    go.set()
    with pytest.raises(StreamNotFoundError, match="was deleted"):
        await take(reader, 1)
    await reader.close()
    await recreated.close()


async def test_a_refresh_does_not_adopt_another_stream_of_the_name(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream deleted and created again before the reader's watch told it: a refresh
    (acknowledged_end) adopted the new stream's record when its version was as high, and the
    reader went on delivering the new stream's records as if they followed the old ones."""
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    first = await writer.write(b"old stream")
    await writer.close()
    go = asyncio.Event()
    compacted_first_watch(monkeypatch, go)  # Stalls until `go`: the deletion goes unseen.
    reader = await ns.open_reader("s", long_poll_seconds=0.2)
    assert [r.position for r in await take(reader, 1)] == [first]
    old_version = (await reader.refresh()).version
    await ns.delete_stream("s")
    writer = await ns.open_writer("s", roll_bytes=10)
    while (await ns.stream_metadata("s")).version < old_version:
        await writer.write(b"0123456789")  # Each one rolls: the record's version grows.
        await writer.wait_for_capacity()
    await writer.write(b"new stream, its first record")
    await writer.write(b"new stream, its second record")
    with pytest.raises(StreamNotFoundError, match="a new stream of that name exists"):
        await reader.acknowledged_end()
    go.set()
    await reader.close()
    await writer.close()
