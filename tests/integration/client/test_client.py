"""The ledger client against real bookie processes and a real etcd.

The tests share three bookies (tests/fixtures/bookies.py) on free loopback ports, with metadata
in the session's etcd under a prefix of this module's (tests/fixtures/etcd.py): each test
creates, and asserts on, ledgers of its own, and none stops a bookie.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from bkaio.errors import LedgerFencedError, NoSuchEntryError, NoSuchLedgerError, UnauthorizedError
from bkaio.ledger_client import BookKeeper, LedgerHandle
from bkaio.meta.ledger_metadata import LedgerState
from bkaio.testing.procs import EtcdProcess
from tests.fixtures.bookies import BookieCluster, running_on_own_loop


@pytest.fixture(scope="module")
def cluster(
    etcd_process: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BookieCluster]:
    """Started once for the module, on an event loop of its own (the tests' loops are per
    test)."""
    bookies = BookieCluster(
        f"etcd://{etcd_process.endpoint}/module-test_client",
        tmp_path_factory.mktemp("client"),
        count=3,
    )
    with running_on_own_loop(bookies):
        yield bookies


async def test_ten_thousand_pipelined_appends_read_back_identical(cluster: BookieCluster) -> None:
    payloads = [os.urandom(16) + b"%d" % i for i in range(10_000)]
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        lh = await bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw")
        ids = await asyncio.gather(*(lh.append(p) for p in payloads))
        assert ids == list(range(10_000))
        await lh.close()
        assert lh.last_add_confirmed == 9_999
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert rh.is_closed and rh.last_entry_id == 9_999
        assert rh.metadata.length == sum(len(p) for p in payloads)
        entries = await rh.read(0, 9_999)
        assert [e.payload for e in entries] == payloads
        assert [e.entry_id for e in entries] == list(range(10_000))
        streamed = [e.payload async for e in rh.read_iter(9_990, 9_999)]
        assert streamed == payloads[9_990:]


async def test_recovery_by_a_second_client_fences_the_open_writer(cluster: BookieCluster) -> None:
    async with (
        BookKeeper.connect(cluster.metadata_uri, client_id="writer") as writer_client,
        BookKeeper.connect(cluster.metadata_uri, client_id="recoverer") as recoverer,
    ):
        lh = await writer_client.create_ledger(3, 3, 2, password=b"pw")
        await asyncio.gather(*(lh.append(b"entry-%d" % i) for i in range(200)))
        acked = lh.last_add_confirmed
        rh = await recoverer.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert rh.is_closed
        assert rh.last_entry_id >= acked
        with pytest.raises(LedgerFencedError):
            await lh.append(b"after recovery")
        with pytest.raises(LedgerFencedError):
            await lh.close()
        md = await recoverer.get_ledger_metadata(lh.ledger_id)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == rh.last_entry_id
        entries = await rh.read(0, rh.last_entry_id)
        assert [e.payload for e in entries[: acked + 1]] == [b"entry-%d" % i for i in range(200)]


async def test_tailing_reader_sees_entries_as_they_are_acknowledged(cluster: BookieCluster) -> None:
    async with BookKeeper.connect(cluster.metadata_uri, explicit_lac_interval=0.05) as bk:
        lh = await bk.create_ledger(3, 2, 2, password=b"pw")
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        seen: list[bytes] = []

        async def tail() -> None:
            for entry_id in range(30):
                entry = await rh.wait_for_entry(entry_id, timeout=10.0)
                assert entry is not None, f"entry {entry_id} not seen in time"
                assert entry.entry_id <= lh.last_add_confirmed  # Never beyond the LAC.
                seen.append(entry.payload)

        tailer = asyncio.ensure_future(tail())
        for i in range(30):
            await lh.append(b"tail-%d" % i)
            if i % 10 == 0:
                await asyncio.sleep(0.02)
        await asyncio.wait_for(tailer, 20.0)
        assert seen == [b"tail-%d" % i for i in range(30)]
        assert await rh.wait_for_entry(30, timeout=0.2) is None
        await lh.close()
        with pytest.raises(NoSuchEntryError):
            await rh.wait_for_entry(30, timeout=5.0)


async def test_wrong_password_deleted_ledger_and_listing(cluster: BookieCluster) -> None:
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        lh: LedgerHandle = await bk.create_ledger(3, 2, 2, password=b"right")
        await lh.append(b"x")
        await lh.close()
        with pytest.raises(UnauthorizedError):
            await bk.open_ledger(lh.ledger_id, password=b"wrong")
        assert lh.ledger_id in [lid async for lid in bk.list_ledgers()]
        await bk.delete_ledger(lh.ledger_id)
        with pytest.raises(NoSuchLedgerError):
            await bk.open_ledger(lh.ledger_id, password=b"right")
        with pytest.raises(NoSuchLedgerError):
            await bk.get_ledger_metadata(lh.ledger_id)
        assert lh.ledger_id not in [lid async for lid in bk.list_ledgers()]


async def test_connect_can_be_awaited_and_reads_past_the_lac_fail(cluster: BookieCluster) -> None:
    bk = await BookKeeper.connect(cluster.metadata_uri)
    try:
        lh = await bk.create_ledger(3, 3, 2)
        for i in range(3):
            await lh.append(b"%d" % i)
        rh = await bk.open_ledger(lh.ledger_id, recovery=False)
        lac = await rh.read_last_add_confirmed()
        assert lac in (1, 2)  # Piggybacked LAC lags by one until the explicit LAC lands.
        with pytest.raises(NoSuchEntryError):
            await rh.read(0, 5)
        await lh.close()
    finally:
        await bk.close()
