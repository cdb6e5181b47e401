"""delete_stream whose record deletion lost its reply still deletes the stream's ledgers."""

from __future__ import annotations

import pytest

from bkaio.errors import MetadataError, NoSuchLedgerError
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.stream import StreamNotFoundError, open_namespace
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.stream.conftest import ClientFactory


async def test_a_deletion_whose_reply_was_lost_still_drops_ledgers_and_cursors(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    positions = [await writer.write(b"%010d" % i) for i in range(3)]
    await writer.close()
    async with await ns.open_reader("s", cursor="c") as reader:
        await reader.ack((await reader.__anext__()).position)
    real_delete = StreamStore.delete_stream

    async def lost_reply(self: StreamStore, namespace: str, stream: str, *, version: int) -> bool:
        await real_delete(self, namespace, stream, version=version)  # Landed; the reply lost.
        raise MetadataOutcomeUnknownError("connection lost")

    monkeypatch.setattr(StreamStore, "delete_stream", lost_reply)
    await ns.delete_stream("s")
    for position in positions:
        with pytest.raises(NoSuchLedgerError):
            await bk.get_ledger_metadata(position.ledger_id)
    assert await StreamStore(metadata_of(bk)).list_cursors("tenant", "s") == {}
    with pytest.raises(StreamNotFoundError):
        await ns.delete_stream("s")


async def test_a_ledger_that_cannot_be_deleted_leaves_the_others_and_the_cursors_deleted(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the record is gone nothing names the stream's ledgers: the first ledger deletion
    that failed stopped the rest (and the cursors') for good, a second call finding no stream."""
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    positions = [await writer.write(b"%010d" % i) for i in range(3)]
    await writer.close()
    async with await ns.open_reader("s", cursor="c") as reader:
        await reader.ack((await reader.__anext__()).position)
    stuck = positions[0].ledger_id
    real_delete = BookKeeper.delete_ledger

    async def first_one_fails(self: BookKeeper, ledger_id: int) -> None:
        if ledger_id == stuck:
            raise MetadataError("metadata store unreachable")
        await real_delete(self, ledger_id)

    monkeypatch.setattr(BookKeeper, "delete_ledger", first_one_fails)
    with pytest.raises(MetadataError, match=rf"could not be deleted: {stuck} \(ledger {stuck}: "):
        await ns.delete_stream("s")
    monkeypatch.undo()
    await bk.get_ledger_metadata(stuck)  # Left, and named in the error.
    for position in positions[1:]:
        with pytest.raises(NoSuchLedgerError):
            await bk.get_ledger_metadata(position.ledger_id)
    assert await StreamStore(metadata_of(bk)).list_cursors("tenant", "s") == {}


async def test_a_truncation_whose_ledger_cannot_be_deleted_deletes_the_others(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The truncation drops the segments from the record first: a failing ledger deletion
    stopped the rest, which nothing named any more."""
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    positions = [await writer.write(b"%010d" % i) for i in range(4)]
    await writer.wait_for_capacity()
    stuck = positions[0].ledger_id
    real_delete = BookKeeper.delete_ledger

    async def first_one_fails(self: BookKeeper, ledger_id: int) -> None:
        if ledger_id == stuck:
            raise MetadataError("metadata store unreachable")
        await real_delete(self, ledger_id)

    monkeypatch.setattr(BookKeeper, "delete_ledger", first_one_fails)
    with pytest.raises(MetadataError, match=rf"truncated, but 1 of its ledgers .*: {stuck} "):
        await ns.truncate("s", before=positions[3])
    monkeypatch.undo()
    await bk.get_ledger_metadata(stuck)
    for position in positions[1:3]:
        with pytest.raises(NoSuchLedgerError):
            await bk.get_ledger_metadata(position.ledger_id)
    assert (await ns.stream_metadata("s")).first_seq == 3
    await writer.close()
