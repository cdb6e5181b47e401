"""Streams against real bookie processes and a real etcd.

The tests share three bookies (tests/fixtures/bookies.py) with metadata in the session's etcd
under a prefix of this module's: each test writes streams of its own (names differ) and none
stops a bookie. Latencies are printed, never asserted (timings belong in benchmarks/).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Iterator

import pytest

from bkaio.errors import NoSuchLedgerError, QuotaExceededError
from bkaio.ledger_client import BookKeeper
from bkaio.stream import StreamPosition, StreamRecord, StreamTruncatedError, open_namespace
from bkaio.testing.procs import EtcdProcess
from tests.fixtures.bookies import BookieCluster, running_on_own_loop


@pytest.fixture(scope="module")
def cluster(
    etcd_process: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BookieCluster]:
    """Started once for the module, on an event loop of its own (the tests' loops are per
    test)."""
    bookies = BookieCluster(
        f"etcd://{etcd_process.endpoint}/module-test_streams",
        tmp_path_factory.mktemp("streams"),
        count=3,
    )
    with running_on_own_loop(bookies):
        yield bookies


async def test_ten_thousand_records_across_forced_rolls_read_once_in_order(
    cluster: BookieCluster,
) -> None:
    """Ten thousand records over 8+ segments: every roll, seq and read-ahead boundary that a
    larger stream crosses (the write rate is a benchmark's business: stream_bench.py)."""
    count = 10_000
    payloads = [b"record-%06d" % i for i in range(count)]
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        ns = await open_namespace(bk, "tenant-a", create=True)
        writer = await ns.open_writer("orders", roll_bytes=12 << 10)
        started = time.perf_counter()
        positions: list[StreamPosition] = []
        for first in range(0, count, 1_000):  # Pipelined in windows of 1,000 writes.
            window = payloads[first : first + 1_000]
            positions += await asyncio.gather(*(writer.write(p) for p in window))
        elapsed = time.perf_counter() - started
        await writer.close()
        print(f"\nstream write: {count} records in {elapsed:.2f} s = {count / elapsed:,.0f} rec/s")
        meta = await ns.stream_metadata("orders")
        assert len(meta.segments) >= 8, meta.segments  # 110 KB over 12 KiB segments.
        assert all(a.seq < b.seq for a, b in itertools.pairwise(positions))
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        ns = await open_namespace(bk, "tenant-a")
        records: list[StreamRecord] = []
        async with await ns.open_reader("orders", start="earliest") as reader:
            async with asyncio.timeout(120):
                async for record in reader:
                    records.append(record)
                    if len(records) == count:
                        break
            assert await reader.read_next(timeout=0.2) is None  # Nothing more, no duplicate.
    assert [r.payload for r in records] == payloads
    assert [r.position for r in records] == positions
    assert all(a.position < b.position for a, b in itertools.pairwise(records))


async def test_tailing_reader_sees_records_soon_after_their_ack(cluster: BookieCluster) -> None:
    count = 300
    async with (
        BookKeeper.connect(cluster.metadata_uri, explicit_lac_interval=0.002) as writer_client,
        BookKeeper.connect(cluster.metadata_uri) as reader_client,
    ):
        writer_ns = await open_namespace(writer_client, "tenant-a", create=True)
        reader_ns = await open_namespace(reader_client, "tenant-a")
        await writer_ns.create_stream("live")
        reader = await reader_ns.open_reader("live", start="earliest")
        acked_at: dict[int, float] = {}
        seen_at: dict[int, float] = {}

        async def tail() -> None:
            async for record in reader:
                seen_at[record.position.seq] = time.perf_counter()
                if len(seen_at) == count:
                    return

        tailing = asyncio.ensure_future(tail())
        writer = await writer_ns.open_writer("live", roll_bytes=4096)  # Rolls while tailing.
        for i in range(count):
            position = await writer.write(b"tick-%04d" % i)
            acked_at[position.seq] = time.perf_counter()
            await asyncio.sleep(0.002)
        async with asyncio.timeout(30):
            await tailing
        await writer.close()
        await reader.close()
    lags_ms = sorted(max(0.0, seen_at[s] - acked_at[s]) * 1000 for s in acked_at)
    p50 = statistics.median(lags_ms)
    p99 = lags_ms[int(len(lags_ms) * 0.99) - 1]
    print(f"\nack -> tailing reader: p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {lags_ms[-1]:.2f} ms")
    assert sorted(seen_at) == list(range(count))


async def test_quota_stops_one_namespace_and_not_another(cluster: BookieCluster) -> None:
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        limited = await open_namespace(bk, "limited", create=True, quota_bytes=10_000)
        free = await open_namespace(bk, "free", create=True)
        writer = await limited.open_writer("s", roll_bytes=3_000)
        await asyncio.gather(*(writer.write(b"q" * 1000) for _ in range(10)))
        with pytest.raises(QuotaExceededError, match="namespace limited"):
            writer.write(b"one byte too many")
        await writer.close()
        with pytest.raises(QuotaExceededError):  # A fresh writer counts the sealed segments.
            other_stream = await limited.open_writer("t")
            try:
                await other_stream.write(b"x")
            finally:
                await other_stream.close()
        unaffected = await free.open_writer("s")
        await asyncio.gather(*(unaffected.write(b"f" * 1000) for _ in range(30)))
        await unaffected.close()


async def test_truncation_deletes_ledgers_from_metadata(cluster: BookieCluster) -> None:
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        ns = await open_namespace(bk, "tenant-a", create=True)
        writer = await ns.open_writer("s", roll_bytes=1000)
        positions = await asyncio.gather(*(writer.write(b"t" * 100) for _ in range(100)))
        result = await ns.truncate("s", before=positions[50])
        assert result.removed_ledgers
        remaining = {ledger_id async for ledger_id in bk.list_ledgers()}
        assert remaining.isdisjoint(result.removed_ledgers)
        for ledger_id in result.removed_ledgers:
            with pytest.raises(NoSuchLedgerError):
                await bk.get_ledger_metadata(ledger_id)
        with pytest.raises(StreamTruncatedError, match="first available position"):
            await ns.open_reader("s", start=positions[0])
        async with await ns.open_reader("s") as reader:
            first = await reader.read_next(timeout=10)
        assert first is not None and first.position == positions[result.first_seq]
        await writer.close()
