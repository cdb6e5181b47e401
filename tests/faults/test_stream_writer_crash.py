"""Stream writers under faults: kill -9 of the writer process, a live writer fenced by a new one.

Real bookies and a real etcd; the writer child is killed (kill -9) and reaped by the test.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from bkaio.errors import LedgerFencedError
from bkaio.ledger_client import BookKeeper
from bkaio.stream import StreamPosition, StreamRecord, open_namespace
from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer


async def _read_acks(stream: asyncio.StreamReader, wanted: int) -> list[StreamPosition]:
    acked: list[StreamPosition] = []
    while len(acked) < wanted:
        line = await stream.readline()
        assert line, "writer child exited early"
        if line.startswith(b"ACK "):
            ledger_id, entry_id, seq = map(int, line.split()[1:])
            acked.append(StreamPosition(ledger_id, entry_id, seq))
    return acked


async def test_writer_killed_mid_stream_loses_no_acknowledged_record(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    await bookie_cluster_factory(count=3, metadata_uri=etcd_server.uri)
    async with BookKeeper.connect(etcd_server.uri) as bk:
        ns = await open_namespace(bk, "tenant-a", create=True)
        await ns.create_stream("orders")
        # A tailing reader, started before the crash, must carry on after the new writer.
        tail_reader = await ns.open_reader("orders", start="earliest")
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.integration.stream.writer_child",
            etcd_server.uri,
            "tenant-a",
            "orders",
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            acked = await asyncio.wait_for(_read_acks(child.stdout, 1500), 90)
        finally:
            if child.returncode is None:
                child.kill()  # SIGKILL, mid-stream.
        assert child.stdout is not None
        rest = await child.stdout.read()  # Acks printed before the kill still count.
        await child.wait()
        for line in rest.splitlines():
            if line.startswith(b"ACK "):
                ledger_id, entry_id, seq = map(int, line.split()[1:])
                acked.append(StreamPosition(ledger_id, entry_id, seq))
        assert [p.seq for p in acked] == list(range(len(acked)))
        assert len({p.ledger_id for p in acked}) > 1  # It rolled before it died.

        writer = await ns.open_writer("orders")  # Recovers the dead writer's open segment.
        after = await writer.write(b"after-crash")
        assert after.seq > acked[-1].seq
        records: list[StreamRecord] = []
        async with await ns.open_reader("orders") as reader, asyncio.timeout(60):
            async for record in reader:
                records.append(record)
                if record.position == after:
                    break
        assert [r.payload for r in records[:-1]] == [
            b"child-%d" % i for i in range(len(records) - 1)
        ]
        assert [r.position for r in records[: len(acked)]] == acked
        tailed: list[StreamRecord] = []
        async with asyncio.timeout(60):
            async for record in tail_reader:
                tailed.append(record)
                if record.position == after:
                    break
        assert tailed == records
        await tail_reader.close()
        await writer.close()


async def test_a_live_writer_is_fenced_by_a_new_one(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    await bookie_cluster_factory(count=3, metadata_uri=etcd_server.uri)
    async with (
        BookKeeper.connect(etcd_server.uri, client_id="old") as old_client,
        BookKeeper.connect(etcd_server.uri, client_id="new") as new_client,
    ):
        old_ns = await open_namespace(old_client, "tenant-a", create=True)
        new_ns = await open_namespace(new_client, "tenant-a")
        old = await old_ns.open_writer("orders", roll_bytes=1000)
        acked = await asyncio.gather(*(old.write(b"old-%d" % i) for i in range(300)))
        new = await new_ns.open_writer("orders")
        with pytest.raises(LedgerFencedError):
            await old.write(b"split brain?")
        with pytest.raises(LedgerFencedError):
            await old.close()
        position = await new.write(b"new")
        assert position.seq == acked[-1].seq + 1
        await new.close()
        async with await new_ns.open_reader("orders") as reader:
            records = [await reader.read_next(timeout=10) for _ in range(301)]
        assert [r.payload for r in records if r] == [b"old-%d" % i for i in range(300)] + [b"new"]
