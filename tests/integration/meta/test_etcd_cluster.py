"""Three real etcd members on loopback: bookies, clients and autorecovery keep working when one
member is killed (the leader: the interesting case) or goes silent (SIGSTOP: a partitioned
member whose connections stay open), in the middle of writes.

What "keep working" means here: no append fails (appends do not touch metadata), every ledger
created or closed during the failover succeeds, every acknowledged entry is read back, no
bookie loses its registration, and autorecovery still re-replicates a bookie killed after the
failover.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog

from bkaio.autorecovery import list_under_replicated, who_is_auditor
from bkaio.ledger_client import BookKeeper, LedgerHandle
from bkaio.meta import LedgerMetadata, initialise_cluster_at, open_metadata, open_store
from bkaio.meta.etcd_watch import WATCH_IDLE_SECONDS, WATCH_SILENT_PERIODS
from bkaio.testing.procs import etcd_binary
from tests.faults.harness.etcd import EtcdCluster
from tests.fixtures.bookies import BookieClusterFactory
from tests.integration.autorecovery.helpers import (
    AUTORECOVERY_CONFIG,
    PASSWORD,
    ledgers_naming,
    verify_full_replication,
    wait_for,
)

pytestmark = pytest.mark.skipif(etcd_binary() is None, reason="etcd not installed")

# The default registration TTL: a shorter one is lost on a heavily loaded 2-core box by
# keep-alives that are late for reasons that have nothing to do with etcd (event-loop stalls).
REGISTRATION_TTL_SECONDS = 10.0
# Waited past a TTL after the fault: for the election (500 ms timeout, seconds on a loaded box)
# and for a bookie to notice the lost lease.
LEASE_MARGIN_SECONDS = 5.0
# The autorecovery tests' fast settings, with leases that a loaded 2-core box keeps alive
# through an etcd election (2 s leases leave no room for one slow keep-alive there).
CONFIG = {
    **AUTORECOVERY_CONFIG,
    "autorecovery": {
        **AUTORECOVERY_CONFIG["autorecovery"],
        "auditor_lease_ttl_seconds": 6.0,
        "worker_lease_ttl_seconds": 6.0,
    },
}


@pytest.fixture
async def etcd_cluster(tmp_path: Path) -> AsyncIterator[EtcdCluster]:
    (tmp_path / "etcd").mkdir()
    cluster = EtcdCluster(tmp_path / "etcd")
    await asyncio.to_thread(cluster.start_all)
    try:
        yield cluster
    finally:
        for process in cluster.processes:  # A stopped member cannot die of SIGKILL's reaping.
            if process is not None and process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
        await asyncio.to_thread(cluster.stop_all)


class Workload:
    """Appends to a ledger without pause and rolls to a new ledger (a metadata create and a
    close) every `roll_every` entries; records every acknowledged payload and every failure."""

    def __init__(self, bk: BookKeeper, roll_every: int = 150) -> None:
        self.bk = bk
        self.roll_every = roll_every
        self.written: dict[int, list[bytes]] = {}
        self.failures: list[BaseException] = []
        self.acked = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        sequence = 0
        while not self._stop.is_set():
            try:
                handle = await self.bk.create_ledger(3, 3, 2, password=PASSWORD)
                await self._fill(handle, sequence)
                await handle.close()
            except Exception as error:  # Counted and asserted on: nothing may fail.
                self.failures.append(error)
                return
            sequence += 1

    async def _fill(self, handle: LedgerHandle, sequence: int) -> None:
        payloads = self.written.setdefault(handle.ledger_id, [])
        pending: list[asyncio.Future[int]] = []
        for index in range(self.roll_every):
            if self._stop.is_set():
                break
            payload = b"%d-%d" % (sequence, index)
            pending.append(handle.append(payload))
            payloads.append(payload)
            if len(pending) >= 20:
                await asyncio.gather(*pending)
                self.acked += len(pending)
                pending.clear()
            await asyncio.sleep(0.002)
        await asyncio.gather(*pending)
        self.acked += len(pending)

    async def wait_acked(self, count: int, timeout_seconds: float = 90.0) -> None:
        async def enough() -> bool:
            if self.failures:
                raise self.failures[0]
            return self.acked >= count

        await wait_for(enough, timeout_seconds, f"{count} appends acknowledged")

    def stop(self) -> None:
        self._stop.set()


async def _registered(bk: BookKeeper) -> set[str]:
    metadata = bk.metadata
    assert metadata is not None
    return {info.bookie_id for info in await metadata.bookies.list()}


@pytest.mark.parametrize("fault", ["kill_leader", "sigstop_member"])
async def test_one_etcd_member_lost_mid_write(
    etcd_cluster: EtcdCluster,
    bookie_cluster_factory: BookieClusterFactory,
    fault: str,
) -> None:
    uri = etcd_cluster.uri("/bkaio-multi")
    cluster = await bookie_cluster_factory(
        count=4,
        metadata_uri=uri,
        config=CONFIG,
        registration_ttl_seconds=REGISTRATION_TTL_SECONDS,
    )
    async with BookKeeper.connect(uri, add_timeout=30.0) as bk:
        metadata = bk.metadata
        assert metadata is not None

        async def auditor_elected() -> bool:
            return await who_is_auditor(metadata) is not None

        await wait_for(auditor_elected, 30, "an auditor is elected")
        workload = Workload(bk)
        task = asyncio.ensure_future(workload.run())
        await workload.wait_acked(300)

        leader = etcd_cluster.leader()
        assert leader is not None
        fault_at = asyncio.get_running_loop().time()
        if fault == "kill_leader":
            victim = leader
            await asyncio.to_thread(etcd_cluster.kill, victim)
        else:
            # Member 0 is the first endpoint of the URI: the one every client talks to first.
            victim = 0
            process = etcd_cluster.processes[victim]
            assert process is not None
            os.kill(process.pid, signal.SIGSTOP)

        # Through the failover and past a registration TTL: writes and rolls go on. etcd drops
        # a lease one TTL after its last refresh (a new leader restarts every lease's TTL), so
        # a bookie whose keep-alives stopped at the fault has lost its lease by then.
        await workload.wait_acked(workload.acked + 600)
        since_fault = asyncio.get_running_loop().time() - fault_at
        await asyncio.sleep(max(0.0, REGISTRATION_TTL_SECONDS + LEASE_MARGIN_SECONDS - since_fault))
        await workload.wait_acked(workload.acked + 200)
        assert await _registered(bk) == set(cluster.bookie_ids), "a bookie lost its lease"
        workload.stop()
        await task
        assert workload.failures == []
        assert len(workload.written) >= 3  # Ledgers were created and closed meanwhile.

        # Nothing acknowledged is lost: every ledger reads back whole.
        for ledger_id, payloads in workload.written.items():
            reader = await bk.open_ledger(ledger_id, password=PASSWORD, recovery=False)
            entries = await reader.read(0, reader.last_entry_id) if payloads else []
            assert [entry.payload for entry in entries] == payloads, ledger_id

        # Autorecovery still works on two members: a bookie killed now is re-replicated.
        await wait_for(auditor_elected, 30, "an auditor is elected after the failover")
        some_ledger = next(iter(workload.written))
        victim_bookie_id = (await metadata.ledgers.get(some_ledger)).ensembles[0][1][0]
        cluster.kill9(cluster.bookie_ids.index(victim_bookie_id))

        async def rereplicated() -> bool:
            return not await ledgers_naming(
                metadata, victim_bookie_id
            ) and not await list_under_replicated(metadata)

        await wait_for(rereplicated, 180, f"no ledger names {victim_bookie_id}")
        for ledger_id, payloads in workload.written.items():
            if payloads:
                await verify_full_replication(
                    cluster, await metadata.ledgers.get(ledger_id), payloads
                )


@pytest.mark.parametrize("fault", ["killed", "stopped"])
async def test_a_client_starts_while_the_first_member_is_lost(
    etcd_cluster: EtcdCluster, fault: str
) -> None:
    """The first endpoint of the URI refuses (killed) or never answers (stopped): connecting
    moves on to the next member within the connect timeout, and the client works."""
    uri = etcd_cluster.uri("/bkaio-first-lost")
    await initialise_cluster_at(uri)
    process = etcd_cluster.processes[0]
    assert process is not None
    if fault == "killed":
        await asyncio.to_thread(etcd_cluster.kill, 0)
    else:
        os.kill(process.pid, signal.SIGSTOP)
    async with await open_metadata(uri) as metadata:
        created = await metadata.ledgers.create(
            LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1, ensembles=((0, ("b",)),))
        )
        assert (await metadata.ledgers.get(created.ledger_id)).ledger_id == created.ledger_id


async def test_a_slow_watch_consumer_is_not_taken_for_a_silent_member(
    etcd_cluster: EtcdCluster,
) -> None:
    """A consumer that holds an event longer than a member may stay silent does not make the
    store leave a member that answers; and the watch delivers every change once."""
    store = await open_store(etcd_cluster.uri("/bkaio-slow-consumer"))
    try:
        start = await store.current_revision() + 1
        watch = store.watch_prefix("/k/", start_revision=start)
        for index in range(2):
            await store.put(f"/k/{index}", b"v")
        first = await anext(watch)
        with structlog.testing.capture_logs() as logs:
            await asyncio.sleep(WATCH_IDLE_SECONDS * (WATCH_SILENT_PERIODS + 1))  # Holding it.
            second = await anext(watch)
            await store.put("/k/2", b"v")
            third = await anext(watch)
        assert [e.key for e in (first, second, third)] == ["/k/0", "/k/1", "/k/2"]
        assert [e for e in logs if e["event"] == "etcd_member_failover"] == []
        await watch.aclose()
    finally:
        await store.close()


async def test_a_watch_leaves_a_member_that_lost_its_leader(etcd_cluster: EtcdCluster) -> None:
    """A member cut off from the others (here: the others down) keeps a watch's stream open
    and answers its progress requests itself: the watch must not take that for health. The
    member ends it for want of a leader; it re-opens elsewhere and, once the cluster is whole
    again, delivers the next change."""
    store = await open_store(etcd_cluster.uri("/bkaio-leaderless"))
    try:
        start = await store.current_revision() + 1
        watch = store.watch_prefix("/k/", start_revision=start)
        await store.put("/k/0", b"v")
        assert (await anext(watch)).key == "/k/0"  # Open on the first member.
        with structlog.testing.capture_logs() as logs:
            following = asyncio.ensure_future(anext(watch))
            await asyncio.to_thread(etcd_cluster.kill, 1)
            await asyncio.to_thread(etcd_cluster.kill, 2)

            async def left_the_member() -> bool:
                return any(
                    e["event"] == "etcd_watch_reconnecting" and e["code"] == "UNAVAILABLE"
                    for e in logs
                )

            await wait_for(left_the_member, 30.0, "the watch leaving the leaderless member")
            await asyncio.to_thread(etcd_cluster.start, 1)
            await asyncio.to_thread(etcd_cluster.start, 2)
            await store.put("/k/1", b"v")
            assert (await asyncio.wait_for(following, 60)).key == "/k/1"
        await watch.aclose()
    finally:
        await store.close()
