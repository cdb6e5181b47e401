"""A writer's roll whose record write lost its reply, while the record changed after it."""

from __future__ import annotations

from typing import Any

import pytest

from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.stream import StreamPosition, open_namespace
from bkaio.stream.model import StreamMeta
from bkaio.stream.store import StreamStore
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_streams import take


@pytest.mark.parametrize("closing", [False, True], ids=["roll", "close"])
async def test_a_landed_write_with_a_lost_reply_then_a_truncation_is_not_a_fence(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, closing: bool
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    for i in range(3):
        await writer.write(b"%010d" % i)  # Each write fills a segment: three rolls.
    await writer.wait_for_capacity()
    real_put = StreamStore.put_stream
    armed = True

    async def lost_reply(self: StreamStore, namespace: str, stream: str, meta: StreamMeta) -> Any:
        nonlocal armed
        if not armed:
            return await real_put(self, namespace, stream, meta)
        armed = False
        await real_put(self, namespace, stream, meta)  # Landed...
        # ...then retention removed every sealed segment, the one it sealed too...
        await ns.truncate("s", before=StreamPosition(0, 0, 1000))
        raise MetadataOutcomeUnknownError("connection lost")  # ...and the reply was lost.

    monkeypatch.setattr(StreamStore, "put_stream", lost_reply)
    if closing:
        await writer.write(b"last")
        await writer.close()
    else:
        await writer.write(b"0123456789")  # Rolls: its record write loses its reply.
        await writer.wait_for_capacity()
        await writer.write(b"after the roll")
        await writer.close()
    assert not armed
    meta = await ns.stream_metadata("s")
    assert meta.open_segment is None and meta.first_seq == 4
    if closing:
        assert meta.segments == () and meta.end_seq_if_closed == 4
        return
    async with await ns.open_reader("s") as reader:
        [record] = await take(reader, 1)
    assert record.position.seq == 4 and record.payload == b"after the roll"
