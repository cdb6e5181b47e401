"""delete_stream whose record deletion lost its reply still deletes the stream's ledgers."""

from __future__ import annotations

import pytest

from bkaio.errors import NoSuchLedgerError
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
