"""A durable cursor does not outlive its stream: a new stream of the name starts afresh."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.stream import InvalidStreamArgumentError, StreamNotFoundError, open_namespace
from bkaio.stream.model import CursorState, StreamMeta
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_streams import take


async def test_an_ack_after_the_stream_was_deleted_leaves_no_cursor(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    for i in range(5):
        await writer.write(b"old-%d" % i)
    await writer.close()
    reader = await ns.open_reader("s", cursor="c")
    records = await take(reader, 5)
    await ns.delete_stream("s")
    with pytest.raises(StreamNotFoundError):
        await take(reader, 1)  # The reader learns of the deletion.
    with pytest.raises(StreamNotFoundError):
        await reader.ack(records[-1].position)
    await reader.close()
    writer = await ns.open_writer("s")  # A new stream of the same name.
    first = await writer.write(b"new-0")
    await writer.close()
    async with await ns.open_reader("s", cursor="c") as fresh:
        assert (await take(fresh, 1))[0].position == first


async def test_a_cursor_past_the_end_of_the_stream_is_refused(make_client: ClientFactory) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    for i in range(5):
        await writer.write(b"old-%d" % i)
    await writer.close()
    async with await ns.open_reader("s", cursor="c") as reader:
        records = await take(reader, 5)
    await ns.delete_stream("s")
    # What a reader that died between its cursor write and its check of the stream leaves
    # behind (or a build that did not check): a cursor outliving its stream.
    store = StreamStore(metadata_of(bk))
    await store.put_cursor("tenant", "s", "c", CursorState(records[-1].position, 0))
    writer = await ns.open_writer("s")
    await writer.write(b"new-0")
    await writer.close()
    with pytest.raises(InvalidStreamArgumentError, match=r"cursor 'c' .* past the end"):
        await ns.open_reader("s", cursor="c")
    await ns.delete_cursor("s", "c")
    async with await ns.open_reader("s", cursor="c") as reader:
        assert (await take(reader, 1))[0].payload == b"new-0"


async def test_an_ack_racing_the_deletion_removes_the_cursor_it_wrote(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def lagging(*args: object) -> AsyncIterator[StreamMeta | None]:
        await asyncio.Event().wait()  # The deletion has not reached this reader's watch yet.
        yield None

    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    for i in range(5):
        await writer.write(b"old-%d" % i)
    await writer.close()
    monkeypatch.setattr(StreamStore, "watch_stream", lagging)
    reader = await ns.open_reader("s", cursor="c")
    records = await take(reader, 5)
    await ns.delete_stream("s")  # Record, ledgers, cursors; then the ack's write lands.
    with pytest.raises(StreamNotFoundError, match="cursor 'c' was not kept"):
        await reader.ack(records[-1].position)
    await reader.close()
    assert await StreamStore(metadata_of(bk)).list_cursors("tenant", "s") == {}


async def test_a_cursor_write_whose_reply_was_lost_after_the_deletion_leaves_no_cursor(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write landed after delete_stream removed the cursors, and its reply was lost: the
    ack failed without checking the stream, and the cursor outlived it."""
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    for i in range(5):
        await writer.write(b"old-%d" % i)
    await writer.close()
    reader = await ns.open_reader("s", cursor="c")
    records = await take(reader, 5)
    real_put = StreamStore.put_cursor

    async def deleted_then_landed_reply_lost(
        self: StreamStore, namespace: str, stream: str, cursor: str, state: CursorState
    ) -> None:
        await ns.delete_stream("s")
        await real_put(self, namespace, stream, cursor, state)
        raise MetadataOutcomeUnknownError("connection lost")

    monkeypatch.setattr(StreamStore, "put_cursor", deleted_then_landed_reply_lost)
    with pytest.raises(StreamNotFoundError, match="cursor 'c' was not kept"):
        await reader.ack(records[2].position)
    monkeypatch.undo()
    await reader.close()
    assert await StreamStore(metadata_of(bk)).list_cursors("tenant", "s") == {}
