"""Stream ends counted in delivered records, the exact end, and the supervised background jobs."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from bkaio.errors import BKError
from bkaio.stream import open_namespace
from bkaio.stream.writer import StreamWriter
from tests.unit.stream.conftest import ClientFactory


async def test_next_seq_counts_delivered_records_not_read_ahead_ones(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    await asyncio.gather(*(writer.write(b"%d" % i) for i in range(100)))
    await writer.close()
    async with await ns.open_reader("s", batch_entries=64) as reader:
        first = await reader.__anext__()  # A whole batch was read ahead.
        assert first.position.seq == 0 and reader.next_seq == 1
        assert await reader.acknowledged_end() == 100
        seqs = [first.position.seq]
        while reader.next_seq < 100:
            seqs.append((await reader.__anext__()).position.seq)
        assert seqs == list(range(100))


async def test_latest_and_the_end_count_records_past_the_bookies_lac(
    make_client: ClientFactory,
) -> None:
    writer_bk = await make_client(explicit_lac_interval=0)  # The bookies' LAC lags.
    ns = await open_namespace(writer_bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    await asyncio.gather(*(writer.write(b"old-%d" % i) for i in range(10)))
    reader_ns = await open_namespace(await make_client(), "tenant")
    assert await reader_ns.end_seq("s") == 10
    async with await reader_ns.open_reader("s", start="latest") as reader:
        assert reader.next_seq == 10
    async with await reader_ns.open_reader("s", start="earliest") as reader:
        end = await reader.acknowledged_end()
        records = [await asyncio.wait_for(reader.__anext__(), 10) for _ in range(end)]
        assert [r.payload for r in records] == [b"old-%d" % i for i in range(10)]
    await writer.close()


async def test_a_broken_roll_fails_the_writer_and_is_reported(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: StreamWriter) -> None:
        raise RuntimeError("a bug in rolling")

    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    monkeypatch.setattr(StreamWriter, "_create_ledger", broken)
    with capture_logs() as logs:
        await writer.write(b"0123456789")  # Reaches roll_bytes: the roll starts.
        held = writer.write(b"held behind the roll")
        with pytest.raises(BKError, match="roll failed"):
            await asyncio.wait_for(held, 10)
    assert [e["task"] for e in logs if e["event"] == "task_failed"] == ["stream-tenant/s-roll"]
    with pytest.raises(BKError, match="roll failed"):
        await writer.close()
