"""The ledger client under faults: kill -9 of the writer and of bookies, SIGSTOP, corruption.

Real bookie processes and a real etcd; every process started here is stopped by its fixture
(the writer child is killed and reaped by the test itself).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bkaio.errors import NoSuchEntryError, NotEnoughBookiesError
from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer

REPO = Path(__file__).resolve().parents[2]


async def _read_acks(stdout: asyncio.StreamReader, until: int) -> tuple[int, list[int]]:
    ledger_id = -1
    acked: list[int] = []
    while len(acked) < until:
        line = await stdout.readline()
        assert line, "writer child exited early"
        kind, _, value = line.decode().partition(" ")
        if kind == "LEDGER":
            ledger_id = int(value)
        elif kind == "ACK":
            acked.append(int(value))
    return ledger_id, acked


async def test_writer_killed_mid_stream_is_recovered_with_every_acked_entry(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    await bookie_cluster_factory(count=3, metadata_uri=etcd_server.uri)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.faults.client_writer_child",
        etcd_server.uri,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert child.stdout is not None
        ledger_id, acked = await asyncio.wait_for(_read_acks(child.stdout, 500), 60)
    finally:
        if child.returncode is None:
            child.kill()
    # Acks printed before the kill are still in the pipe: they count too.
    rest = await child.stdout.read()
    acked += [int(line.split()[1]) for line in rest.decode().splitlines() if line.startswith("ACK")]
    await child.wait()
    assert acked == list(range(len(acked)))

    async with (
        BookKeeper.connect(etcd_server.uri) as first,
        BookKeeper.connect(etcd_server.uri) as second,
    ):
        one, two = await asyncio.gather(
            first.open_ledger(ledger_id, password=b"pw", recovery=True),
            second.open_ledger(ledger_id, password=b"pw", recovery=True),
        )
        assert one.is_closed and two.is_closed
        assert one.last_entry_id == two.last_entry_id >= acked[-1]
        entries = await one.read(0, one.last_entry_id)
        assert [e.payload for e in entries] == [b"child-%d" % i for i in range(len(entries))]
        with pytest.raises(NoSuchEntryError):
            await one.read(0, one.last_entry_id + 1)


async def test_killing_an_ensemble_bookie_changes_the_ensemble_without_errors(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(count=4, metadata_uri=etcd_server.uri)
    async with BookKeeper.connect(etcd_server.uri) as bk:
        lh = await bk.create_ledger(3, 2, 2, password=b"pw")
        first = [lh.append(b"before-%d" % i) for i in range(300)]
        victim = cluster.bookie_ids.index(lh.metadata.ensembles[0][1][1])
        await asyncio.gather(*first[:100])
        cluster.kill9(victim)
        later = [lh.append(b"after-%d" % i) for i in range(300)]
        assert await asyncio.gather(*first, *later) == list(range(600))
        await lh.close()
        md = await bk.get_ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) >= 2
        assert cluster.bookie_ids[victim] not in md.ensembles[-1][1]
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        payloads = [e.payload for e in await rh.read(0, 599)]
        assert payloads == [b"before-%d" % i for i in range(300)] + [
            b"after-%d" % i for i in range(300)
        ]


async def test_with_two_bookies_left_adds_continue_only_where_qa_can_be_met(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(count=3, metadata_uri=etcd_server.uri)
    async with BookKeeper.connect(etcd_server.uri, add_timeout=2.0) as bk:
        wide = await bk.create_ledger(3, 3, 2, password=b"pw")  # Every write set keeps 2.
        narrow = await bk.create_ledger(3, 2, 2, password=b"pw")  # Some write sets keep 1.
        await wide.append(b"w")
        await narrow.append(b"n")
        cluster.kill9(0)
        assert await asyncio.gather(*(wide.append(b"w%d" % i) for i in range(30))) == list(
            range(1, 31)
        )
        results = await asyncio.gather(
            *(narrow.append(b"n%d" % i) for i in range(30)), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        assert failures and all(isinstance(f, NotEnoughBookiesError) for f in failures)
        await wide.close()
        await narrow.close()
        rh = await bk.open_ledger(wide.ledger_id, password=b"pw")
        assert rh.last_entry_id == 30
        assert len(await rh.read(0, 30)) == 31


async def test_a_stopped_bookie_is_replaced_after_the_add_timeout(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(count=4, metadata_uri=etcd_server.uri)
    async with BookKeeper.connect(etcd_server.uri, add_timeout=1.0) as bk:
        lh = await bk.create_ledger(3, 3, 3, password=b"pw")
        await lh.append(b"first")
        stopped_id = lh.metadata.ensembles[0][1][0]
        stopped = cluster.bookie_ids.index(stopped_id)
        cluster.sigstop(stopped)
        try:
            ids = await asyncio.wait_for(
                asyncio.gather(*(lh.append(b"x%d" % i) for i in range(20))), 30
            )
            assert ids == list(range(1, 21))
            assert stopped_id not in lh.metadata.ensembles[-1][1]
            await lh.close()
        finally:
            cluster.sigcont(stopped)
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert len(await rh.read(0, 20)) == 21


async def test_a_corrupt_copy_on_disk_is_skipped_for_another_copy(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(
        count=3,
        metadata_uri=etcd_server.uri,
        config={"storage": {"flush_interval_seconds": 0.1}},
    )
    marker = b"CORRUPT-ME-" + os.urandom(8).hex().encode()
    async with BookKeeper.connect(etcd_server.uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        await lh.append(marker)
        await lh.close()
        # Read first: the sticky bookie (ClientConfig.sticky_reads), ledger id % E.
        first = cluster.bookie_ids.index(lh.metadata.ensembles[0][1][lh.ledger_id % 3])
        await asyncio.sleep(0.5)  # Past a flush: the entry is in an entry-log file.
        await cluster.stop(first)
        flipped = 0
        for path in (cluster[first].directory / "ledgers").rglob("*.log"):
            data = bytearray(path.read_bytes())
            at = data.find(marker)
            if at >= 0:
                data[at] ^= 0xFF
                path.write_bytes(bytes(data))
                flipped += 1
        assert flipped, "the entry never reached an entry-log file"
        await cluster.start(first)
        await cluster.wait_until_registered(first)
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        with capture_logs() as logs:
            assert (await rh.read(0, 0))[0].payload == marker
    # The corrupt copy was met (and skipped), not merely left unread.
    assert [e["corrupt"] for e in logs if e["event"] == "range_read_bad_records"] == [[0]]
