"""A writer's roll whose record write landed but lost its reply, and whose re-read failed: the
roll fails the writer, and it deleted the new ledger that the record names as the open segment.
Until a next writer sealed it, `end_seq` and every reader reaching it failed (NoSuchLedgerError,
StreamSegmentUnreadableError) on a stream with nothing wrong. The ledger is kept when the record
names it (or cannot be read), deleted only when it does not. The answer is lost in the
metadata store, below StreamStore, whose read-back fails."""

from __future__ import annotations

from typing import Any

import pytest

from bkaio.errors import BKError, MetadataError
from bkaio.meta import Lease
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.stream import open_namespace
from bkaio.stream.store import StreamStore
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_streams import take


async def test_a_roll_failing_after_its_record_landed_keeps_the_ledger_it_names(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    bk, other_client = await make_client(), await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    first = await writer.write(b"0123456789")  # Rolls: its record write loses its reply...
    real_cas, real_get = SqliteMetadataStore.compare_and_swap, SqliteMetadataStore.get
    key = StreamStore.stream_key("tenant", "s")
    lost: list[int] = []  # The landed write's version, then the failed read's mark.

    async def landed_reply_lost(
        self: SqliteMetadataStore,
        cas_key: str,
        value: bytes,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> Any:
        landed = await real_cas(
            self, cas_key, value, expected_version=expected_version, lease=lease
        )
        if lost or cas_key != key:
            return landed
        lost.append(landed)
        raise MetadataOutcomeUnknownError("connection lost")

    async def reread_fails(self: SqliteMetadataStore, get_key: str) -> Any:
        if len(lost) == 1 and get_key == key:  # ...and so does the read telling if it landed.
            lost.append(0)
            raise MetadataError("metadata store unreachable")
        return await real_get(self, get_key)

    monkeypatch.setattr(SqliteMetadataStore, "compare_and_swap", landed_reply_lost)
    monkeypatch.setattr(SqliteMetadataStore, "get", reread_fails)
    await writer.wait_for_capacity()  # The roll ended: the writer failed.
    with pytest.raises(MetadataError, match="unreachable"):
        await writer.flush()
    monkeypatch.undo()
    assert len(lost) == 2
    meta = await ns.stream_metadata("s")
    assert meta.version == lost[0]  # The write had landed.
    new_segment = meta.open_segment
    assert new_segment is not None and new_segment.first_seq == 1
    await bk.get_ledger_metadata(new_segment.ledger_id)  # NoSuchLedgerError without the fix.
    assert await ns.end_seq("s") == 1
    async with await ns.open_reader("s", long_poll_seconds=0.2) as reader:
        ns2 = await open_namespace(other_client, "tenant")
        successor = await ns2.open_writer("s")
        later = await successor.write(b"later")
        assert [r.position for r in await take(reader, 2)] == [first, later]
    await successor.close()
    with pytest.raises(BKError):
        await writer.close()
