"""delete_namespace against a writer opening (or a stream being created) at the same time.

The deletion lists the namespace's streams, removes them, then deletes the namespace record.
A stream whose record landed after that listing was left behind: a stream record, its ledger
and a live writer under a namespace that no longer exists (and that a namespace of the same
name created later would find). Each test runs the other party at a chosen step of the
deletion (the store's methods wrapped in the test) and checks that nothing outlives the
namespace: either the writer fails with NamespaceNotFoundError (NamespaceDeletingError while
the deletion runs) and its stream is gone, or the namespace and its stream are both kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from bkaio.errors import LedgerFencedError, MetadataError
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.stream import (
    InvalidStreamArgumentError,
    Namespace,
    NamespaceDeletingError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    delete_namespace,
    open_namespace,
)
from bkaio.stream import namespace as namespace_module
from bkaio.stream.model import StreamMeta, StreamPosition
from bkaio.stream.segments import remove_stream
from bkaio.stream.store import StreamStore, metadata_of
from bkaio.stream.writer import StreamWriter
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_streams import take


async def leftovers(bk: BookKeeper, name: str) -> dict[str, Any]:
    """What of namespace `name` is still in metadata: record, streams, cursors, ledgers."""
    store = StreamStore(metadata_of(bk))
    cursors = await metadata_of(bk).store.list_prefix(f"/cursors/{name}/", keys_only=True)
    return {
        "namespace": name in await store.list_namespaces(),
        "streams": await store.list_streams(name),
        "cursors": [kv.key for kv in cursors],
        "ledgers": [ledger_id async for ledger_id in bk.list_ledgers()],
    }


NOTHING = {"namespace": False, "streams": [], "cursors": [], "ledgers": []}


def before_namespace_record_goes(
    monkeypatch: pytest.MonkeyPatch, step: Callable[[], Awaitable[None]]
) -> None:
    """Run `step` once, when the deletion is about to delete the namespace record: after
    every listing of its streams."""
    real = StreamStore.delete_namespace
    ran: list[bool] = []

    async def delete_namespace_after_step(
        self: StreamStore, namespace: str, *, expected_version: int | None = None
    ) -> bool:
        if not ran:
            ran.append(True)
            await step()
        return await real(self, namespace, expected_version=expected_version)

    monkeypatch.setattr(StreamStore, "delete_namespace", delete_namespace_after_step)


@pytest.mark.parametrize("force", [True, False])
async def test_a_writer_opened_after_the_streams_were_listed_leaves_nothing_behind(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, force: bool
) -> None:
    deleter, writer_client = await make_client(), await make_client()
    ns = await open_namespace(deleter, "tenant", create=True)
    if force:  # A stream the listing sees, with a writer and a cursor.
        old = await ns.open_writer("old")
        await old.write(b"old record")
        async with await ns.open_reader("old", cursor="c") as reader:
            await reader.ack((await reader.__anext__()).position)
    other = await open_namespace(writer_client, "tenant")
    refused: list[BaseException] = []

    async def open_late_writer() -> None:
        try:
            await other.open_writer("late")
        except NamespaceNotFoundError as error:
            refused.append(error)

    before_namespace_record_goes(monkeypatch, open_late_writer)
    await delete_namespace(deleter, "tenant", force=force)
    assert await leftovers(deleter, "tenant") == NOTHING
    assert [type(error) for error in refused] == [NamespaceDeletingError]
    assert "being deleted" in str(refused[0])
    if force:
        with pytest.raises(LedgerFencedError):
            await old.write(b"after the deletion")


async def test_a_writer_whose_record_lands_after_the_deletion_removes_its_stream(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer read the namespace and found no stream before the deletion began; its
    creation lands once the namespace record is gone."""
    deleter, writer_client = await make_client(), await make_client()
    await open_namespace(deleter, "tenant", create=True)
    other = await open_namespace(writer_client, "tenant")
    real_put = StreamStore.put_stream
    about_to_create, deleted = asyncio.Event(), asyncio.Event()

    async def put_after_the_deletion(
        self: StreamStore, namespace: str, stream: str, meta: StreamMeta
    ) -> StreamMeta:
        if meta.version == 0 and not deleted.is_set():
            about_to_create.set()
            await deleted.wait()
        return await real_put(self, namespace, stream, meta)

    monkeypatch.setattr(StreamStore, "put_stream", put_after_the_deletion)
    opening = asyncio.create_task(other.open_writer("late"))
    await about_to_create.wait()
    await delete_namespace(deleter, "tenant")
    deleted.set()
    with pytest.raises(NamespaceNotFoundError, match="does not exist"):
        await opening
    assert await leftovers(deleter, "tenant") == NOTHING


async def test_a_stream_created_after_the_streams_were_listed_is_removed(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    deleter, creator = await make_client(), await make_client()
    await open_namespace(deleter, "tenant", create=True)
    other = await open_namespace(creator, "tenant")
    refused: list[BaseException] = []

    async def create_late_stream() -> None:
        try:
            await other.create_stream("late")
        except NamespaceDeletingError as error:
            refused.append(error)

    before_namespace_record_goes(monkeypatch, create_late_stream)
    await delete_namespace(deleter, "tenant", force=True)
    assert await leftovers(deleter, "tenant") == NOTHING
    assert len(refused) == 1


async def test_a_refused_deletion_leaves_the_namespace_usable(make_client: ClientFactory) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("kept")
    with pytest.raises(NamespaceNotEmptyError):
        await delete_namespace(bk, "tenant")
    assert not (await ns.refresh()).deleting
    writer = await ns.open_writer("kept")
    await writer.write(b"still writable")
    await writer.close()


async def test_a_stream_created_between_the_first_listing_and_the_mark_refuses_the_deletion(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without force, a stream that appears after the emptiness check keeps the namespace."""
    deleter, creator = await make_client(), await make_client()
    ns = await open_namespace(deleter, "tenant", create=True)
    other = await open_namespace(creator, "tenant")
    real_put = StreamStore.put_namespace
    created: list[StreamMeta] = []

    async def create_before_marking(self: StreamStore, namespace: str, settings: Any) -> int:
        if not created:
            created.append(await other.create_stream("sneaky"))
        return await real_put(self, namespace, settings)

    monkeypatch.setattr(StreamStore, "put_namespace", create_before_marking)
    with pytest.raises(NamespaceNotEmptyError, match="sneaky"):
        await delete_namespace(deleter, "tenant")
    assert not (await ns.refresh()).deleting
    assert await ns.list_streams() == ["sneaky"]


async def test_a_forced_deletion_that_failed_part_way_refuses_writers_and_finishes_later(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    await writer.write(b"record")

    async def failing_remove(*args: Any) -> StreamMeta | None:
        raise MetadataError("metadata store unavailable")

    monkeypatch.setattr(namespace_module, "remove_stream", failing_remove)
    with pytest.raises(MetadataError):
        await delete_namespace(bk, "tenant", force=True)
    with pytest.raises(NamespaceDeletingError, match="tenant"):
        await ns.open_writer("another")
    with pytest.raises(NamespaceDeletingError):
        await ns.create_stream("another")
    monkeypatch.setattr(namespace_module, "remove_stream", remove_stream)
    await delete_namespace(bk, "tenant", force=True)
    assert await leftovers(bk, "tenant") == NOTHING


async def test_deleting_is_not_a_setting_a_caller_gives(make_client: ClientFactory) -> None:
    bk = await make_client()
    with pytest.raises(InvalidStreamArgumentError, match="'deleting' is not a setting"):
        await open_namespace(bk, "tenant", create=True, deleting=True)
    ns: Namespace = await open_namespace(bk, "tenant", create=True)
    with pytest.raises(InvalidStreamArgumentError, match="'deleting' is not a setting"):
        await ns.update_settings(deleting=True)
    assert not (await ns.refresh()).deleting


async def test_a_creation_whose_reply_was_lost_after_the_deletion_leaves_nothing(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """create_stream raises a lost reply, but its record landed after the deletion finished."""
    deleter, creator = await make_client(), await make_client()
    await open_namespace(deleter, "tenant", create=True)
    other = await open_namespace(creator, "tenant")
    real_put = StreamStore.put_stream

    async def deleted_then_landed_reply_lost(
        self: StreamStore, namespace: str, stream: str, meta: StreamMeta
    ) -> StreamMeta:
        await delete_namespace(deleter, "tenant")
        await real_put(self, namespace, stream, meta)
        raise MetadataOutcomeUnknownError("connection lost")

    monkeypatch.setattr(StreamStore, "put_stream", deleted_then_landed_reply_lost)
    with pytest.raises(NamespaceNotFoundError, match="does not exist"):
        await other.create_stream("late")
    assert await leftovers(deleter, "tenant") == NOTHING


async def test_a_mark_cleared_before_the_record_goes_sends_the_deletion_back_to_listing(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deletion without force that marked the namespace first and found a stream clears the
    mark, possibly after a forced deletion's last (empty) listing: a writer then opens in the
    unmarked namespace, and the forced deletion deleted the record under it."""
    deleter, writer_client = await make_client(), await make_client()
    await open_namespace(deleter, "tenant", create=True)
    other = await open_namespace(writer_client, "tenant")
    store = StreamStore(metadata_of(deleter))
    opened: list[StreamWriter] = []

    async def unmarked_then_opened() -> None:
        current = await store.get_namespace("tenant")
        await store.put_namespace("tenant", replace(current, deleting=False))
        opened.append(await other.open_writer("late"))

    before_namespace_record_goes(monkeypatch, unmarked_then_opened)
    await delete_namespace(deleter, "tenant", force=True)
    assert await leftovers(deleter, "tenant") == NOTHING
    with pytest.raises(LedgerFencedError):
        await opened[0].write(b"after the deletion")


async def test_a_writer_taking_over_a_stream_does_not_delete_its_records_for_a_deletion(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without force: a stream created (and written) just before the namespace was marked,
    then a second writer, which passed the namespace check before the mark, taking it over
    after. That writer removed the whole stream, records and all, and the deletion then found
    the namespace empty and deleted it. The stream is the deletion's to judge: it is kept,
    and the deletion refused."""
    deleter, first_client, second_client = [await make_client() for _ in range(3)]
    await open_namespace(deleter, "tenant", create=True)
    first = await open_namespace(first_client, "tenant")
    second = await open_namespace(second_client, "tenant")
    real_put_stream, real_put_namespace = StreamStore.put_stream, StreamStore.put_namespace
    taking_over, marked = asyncio.Event(), asyncio.Event()
    takeover: list[asyncio.Task[StreamWriter]] = []
    written: list[StreamPosition] = []

    async def takeover_waits_for_the_mark(
        self: StreamStore, namespace: str, stream: str, meta: StreamMeta
    ) -> StreamMeta:
        if meta.epoch == 2 and not marked.is_set():
            taking_over.set()
            await marked.wait()
        return await real_put_stream(self, namespace, stream, meta)

    async def writers_around_the_mark(self: StreamStore, namespace: str, settings: Any) -> int:
        if not takeover:
            writer = await first.open_writer("s")  # After the deletion's first listing.
            written.append(await writer.write(b"acknowledged"))
            takeover.append(asyncio.create_task(second.open_writer("s")))
            await taking_over.wait()
        version = await real_put_namespace(self, namespace, settings)
        if not marked.is_set():
            marked.set()
            await asyncio.wait(takeover)
        return version

    monkeypatch.setattr(StreamStore, "put_stream", takeover_waits_for_the_mark)
    monkeypatch.setattr(StreamStore, "put_namespace", writers_around_the_mark)
    with pytest.raises(NamespaceNotEmptyError, match=r"1 streams \(s\)"):
        await delete_namespace(deleter, "tenant")
    monkeypatch.undo()
    successor = await takeover[0]
    await successor.close()
    ns = await open_namespace(deleter, "tenant")
    assert not ns.settings.deleting
    async with await ns.open_reader("s") as reader:
        [record] = await take(reader, 1)
    assert (record.position, record.payload) == (written[0], b"acknowledged")
