"""Writers, readers, fencing, quota, truncation and cursors over fake bookies + SQLite metadata."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.errors import LedgerFencedError, NoSuchLedgerError, QuotaExceededError
from bkaio.stream import (
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    StreamPosition,
    StreamRecord,
    StreamTruncatedError,
    TooManyStreamsError,
    delete_namespace,
    list_namespaces,
    open_namespace,
)
from bkaio.stream.reader import StreamReader
from tests.unit.stream.conftest import ClientFactory


async def take(reader: StreamReader, count: int, timeout: float = 10.0) -> list[StreamRecord]:  # noqa: ASYNC109
    records: list[StreamRecord] = []
    async with asyncio.timeout(timeout):
        async for record in reader:
            records.append(record)
            if len(records) == count:
                break
    return records


async def test_records_cross_rolls_and_read_back_once_in_order(make_client: ClientFactory) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("orders", roll_bytes=300)
    payloads = [b"record-%04d" % i for i in range(600)]
    positions = await asyncio.gather(*(writer.write(p) for p in payloads))
    await writer.close()
    assert [p.seq for p in positions] == list(range(600))
    meta = await ns.stream_metadata("orders")
    assert len(meta.segments) > 10  # Forced rolls.
    assert sum(s.bytes for s in meta.segments) == sum(map(len, payloads))
    async with await ns.open_reader("orders") as reader:
        records = await take(reader, 600)
    assert [r.payload for r in records] == payloads
    assert [r.position for r in records] == positions
    async with await ns.open_reader("orders", start=positions[333]) as reader:
        assert (await take(reader, 1))[0].position == positions[333]


async def test_a_second_writer_fences_the_first(make_client: ClientFactory) -> None:
    first_client, second_client = await make_client(), await make_client()
    ns1 = await open_namespace(first_client, "tenant", create=True)
    ns2 = await open_namespace(second_client, "tenant")
    old = await ns1.open_writer("log")
    acked = await asyncio.gather(*(old.write(b"old-%d" % i) for i in range(50)))
    new = await ns2.open_writer("log")
    assert new.epoch == old.epoch + 1
    with pytest.raises(LedgerFencedError):
        await old.write(b"too late")
    with pytest.raises(LedgerFencedError):
        old.write(b"still too late")
    later = await new.write(b"new-0")
    assert later.seq == acked[-1].seq + 1
    await new.close()
    async with await ns2.open_reader("log") as reader:
        records = await take(reader, 51)
    assert [r.payload for r in records] == [b"old-%d" % i for i in range(50)] + [b"new-0"]


async def test_a_fenced_writer_cannot_roll_into_a_new_segment(make_client: ClientFactory) -> None:
    first_client, second_client = await make_client(), await make_client()
    ns1 = await open_namespace(first_client, "tenant", create=True)
    old = await ns1.open_writer("log", roll_bytes=10)
    await old.write(b"0123456789")  # Starts a roll.
    new = await (await open_namespace(second_client, "tenant")).open_writer("log")
    with pytest.raises(LedgerFencedError):
        await old.flush()
        await old.write(b"x")
    await new.close()


async def test_tailing_reader_follows_the_writer_across_rolls(make_client: ClientFactory) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("live")
    reader = await ns.open_reader("live", start="earliest", long_poll_seconds=0.2)
    tail = asyncio.ensure_future(take(reader, 100))
    writer = await ns.open_writer("live", roll_bytes=64)
    for i in range(100):
        await writer.write(b"live-%03d" % i)
    records = await tail
    assert [r.payload for r in records] == [b"live-%03d" % i for i in range(100)]
    await writer.close()
    await reader.close()


async def test_latest_starts_after_what_is_already_written(make_client: ClientFactory) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    await asyncio.gather(*(writer.write(b"old") for _ in range(5)))
    await writer.close()  # A sealed end: "latest" is exact (an open one lags by the LAC).
    async with await ns.open_reader("s", start="latest") as reader:
        assert reader.next_seq == 5
        writer = await ns.open_writer("s")
        position = await writer.write(b"new")
        assert (await take(reader, 1))[0].position == position
    await writer.close()


async def test_quota_counts_sealed_and_open_bytes_per_namespace(make_client: ClientFactory) -> None:
    bk = await make_client()
    small = await open_namespace(bk, "small", create=True, quota_bytes=1000)
    other = await open_namespace(bk, "other", create=True)
    first = await small.open_writer("a", roll_bytes=300)
    await asyncio.gather(*(first.write(b"x" * 100) for _ in range(6)))
    await first.close()  # 600 bytes sealed.
    second = await small.open_writer("b")
    await asyncio.gather(*(second.write(b"y" * 100) for _ in range(4)))
    with pytest.raises(QuotaExceededError, match="quota_bytes=1000"):
        second.write(b"z")
    unaffected = await other.open_writer("a")
    await asyncio.gather(*(unaffected.write(b"w" * 100) for _ in range(20)))
    await unaffected.close()
    await second.close()


async def test_truncate_deletes_whole_ledgers_and_tells_late_readers_where_to_start(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=100)
    positions = await asyncio.gather(*(writer.write(b"r" * 10) for _ in range(100)))
    stale = await ns.open_reader("s")  # Positioned at seq 0 before truncation.
    before = (await ns.stream_metadata("s")).segments
    result = await ns.truncate("s", before=positions[55])
    after = await ns.stream_metadata("s")
    assert result.removed_ledgers == tuple(
        s.ledger_id for s in before[: len(result.removed_ledgers)]
    )
    assert after.first_seq == result.first_seq <= 55
    for ledger_id in result.removed_ledgers:
        with pytest.raises(NoSuchLedgerError):
            await bk.get_ledger_metadata(ledger_id)
    with pytest.raises(StreamTruncatedError, match="first available position") as raised:
        await ns.open_reader("s", start=positions[0])
    assert raised.value.first_available == positions[after.first_seq]
    with pytest.raises(StreamTruncatedError):
        await take(stale, 1)
    await stale.close()
    async with await ns.open_reader("s") as reader:
        assert (await take(reader, 1))[0].position == positions[after.first_seq]
    await writer.close()


async def test_durable_cursor_resumes_and_holds_back_truncation(make_client: ClientFactory) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=50)
    positions = await asyncio.gather(*(writer.write(b"%03d" % i) for i in range(100)))
    await writer.close()  # The end is then exact, not the bookies' lagging LAC.
    async with await ns.open_reader("s", cursor="billing") as reader:
        records = await take(reader, 30)
        await asyncio.gather(*(reader.ack(r.position) for r in records))  # Batched.
    async with await ns.open_reader("s", cursor="billing", start="latest") as reader:
        assert (await take(reader, 1))[0].position == positions[30]
    result = await ns.truncate("s", before=positions[90])
    assert result.first_seq <= 30  # The cursor still needs seq 30.
    [info] = await ns.cursors("s")
    assert info.name == "billing" and info.position == positions[29]
    assert info.lag == 70
    forced = await ns.truncate("s", before=positions[90], force=True)
    assert forced.first_seq > 30
    with pytest.raises(StreamTruncatedError):
        await ns.open_reader("s", cursor="billing")


async def test_retention_applies_age_and_size_policies(make_client: ClientFactory) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True, retention_bytes=200)
    writer = await ns.open_writer("s", roll_bytes=100)
    await asyncio.gather(*(writer.write(b"r" * 10) for _ in range(100)))
    await writer.close()
    report = await ns.apply_retention()
    meta = await ns.stream_metadata("s")
    assert report.removed["s"] and meta.sealed_bytes <= 200
    await ns.update_settings(retention_bytes=None, retention_seconds=1.0)
    report = await ns.apply_retention(now_ms_value=meta.segments[-1].closed_ms + 5_000)
    assert (await ns.stream_metadata("s")).segments == ()


async def test_namespaces_are_isolated_limited_and_deleted(make_client: ClientFactory) -> None:
    bk = await make_client()
    a = await open_namespace(bk, "a", create=True, max_streams=2)
    ab = await open_namespace(bk, "ab", create=True)
    await a.create_stream("s1")
    await a.create_stream("s2")
    await ab.create_stream("s3")
    with pytest.raises(TooManyStreamsError, match="max_streams=2"):
        await a.open_writer("s4")
    assert await a.list_streams() == ["s1", "s2"]
    assert await ab.list_streams() == ["s3"]
    assert {"a", "ab"} <= set(await list_namespaces(bk))
    with pytest.raises(NamespaceNotEmptyError):
        await delete_namespace(bk, "a")
    await delete_namespace(bk, "a", force=True)
    with pytest.raises(NamespaceNotFoundError):
        await open_namespace(bk, "a")
    assert await ab.list_streams() == ["s3"]


async def test_delete_stream_fences_its_writer_and_drops_its_ledgers(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    position = await writer.write(b"x")
    await ns.delete_stream("s")
    with pytest.raises(LedgerFencedError):
        await writer.write(b"y")
    with pytest.raises(NoSuchLedgerError):
        await bk.get_ledger_metadata(position.ledger_id)
    assert await ns.list_streams() == []


async def test_ack_beyond_what_was_delivered_is_refused(make_client: ClientFactory) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    position = await writer.write(b"x")
    async with await ns.open_reader("s", cursor="c") as reader:
        with pytest.raises(Exception, match="delivered only"):
            await reader.ack(position)
    async with await ns.open_reader("s") as reader:
        with pytest.raises(Exception, match="no cursor"):
            await reader.ack(StreamPosition(position.ledger_id, 0, 0))
    await writer.close()


async def test_roll_seconds_rolls_an_old_segment_at_the_next_write(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_seconds=0.05)
    first = await writer.write(b"a")
    await asyncio.sleep(0.1)
    await writer.write(b"b")  # Still in the old segment; starts the roll.
    third = await writer.write(b"c")
    assert third.ledger_id != first.ledger_id and third.seq == 2
    await writer.close()
