"""A writer's roll whose record write lost its reply, while the record changed after it.

The answer is lost in the metadata store (below StreamStore, which reads the record back): the
record then holds other bytes than the write's, a version conflict, which the writer tells from
another writer's by its new open segment."""

from __future__ import annotations

from typing import Any

import pytest

from bkaio.meta import Lease
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.stream import StreamPosition, open_namespace
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
    real_cas = SqliteMetadataStore.compare_and_swap
    armed = True

    async def lost_reply(
        self: SqliteMetadataStore,
        key: str,
        value: bytes,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> Any:
        nonlocal armed
        if not armed or key != StreamStore.stream_key("tenant", "s"):
            return await real_cas(self, key, value, expected_version=expected_version, lease=lease)
        armed = False
        await real_cas(self, key, value, expected_version=expected_version)  # Landed...
        # ...then retention removed every sealed segment, the one it sealed too...
        await ns.truncate("s", before=StreamPosition(0, 0, 4))  # The next seq: all sealed.
        raise MetadataOutcomeUnknownError("connection lost")  # ...and the reply was lost.

    monkeypatch.setattr(SqliteMetadataStore, "compare_and_swap", lost_reply)
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
