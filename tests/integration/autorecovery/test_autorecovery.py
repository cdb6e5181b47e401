"""Autorecovery against real bookie processes and a real etcd: a bookie killed for good is
re-replicated by the auditor and the workers running inside the other bookies, also when the
killed bookie was the auditor; decommission drains a live bookie under writes; GC reclaims
deleted ledgers. Scaled to the shared 2-core test machine (numbers in each test)."""

from __future__ import annotations

import asyncio
import time

from bkaio.autorecovery import (
    RecoveryProgress,
    decommission_bookie,
    list_under_replicated,
    recover_bookie,
    who_is_auditor,
)
from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer

from .helpers import (
    AUTORECOVERY_CONFIG,
    PASSWORD,
    ledgers_naming,
    verify_full_replication,
    wait_for,
    write_ledgers,
)

# 12 ledgers on 5 bookies: the auditor's bookie holds one but for a chance of 0.4^12 (2e-5);
# 1000 entries each put ~1.8 MB on each bookie, over two entry logs.
LEDGERS = 12
ENTRIES = 1000
PAYLOAD_BYTES = 256


async def test_killed_auditor_bookie_is_rereplicated_and_auditor_moves(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """5 bookies, 12 ledgers E3/Qw3/Qa3 x 1000 entries; kill -9 the auditor's bookie for good.
    Qa3: every bookie holds every entry before the kill (`write_ledgers`), so the check after
    re-replication (every entry read from every bookie of its write set) checks the copies."""
    cluster = await bookie_cluster_factory(
        count=5, metadata_uri=etcd_server.uri, config=AUTORECOVERY_CONFIG
    )
    meta = await cluster.metadata()
    written = await write_ledgers(etcd_server.uri, LEDGERS, ENTRIES, PAYLOAD_BYTES)

    async def auditor_elected() -> bool:
        return await who_is_auditor(meta) is not None

    await wait_for(auditor_elected, 30, "an auditor is elected")
    victim_id = await who_is_auditor(meta)
    assert victim_id is not None
    victim = cluster.bookie_ids.index(victim_id)
    affected = await ledgers_naming(meta, victim_id)
    assert affected, "the auditor's bookie holds no ledger: nothing to test"
    before = {ledger_id: await meta.ledgers.get(ledger_id) for ledger_id in written}

    killed_at = time.monotonic()
    cluster.kill9(victim)

    async def rereplicated() -> bool:
        return not await ledgers_naming(meta, victim_id) and not await list_under_replicated(meta)

    await wait_for(rereplicated, 90, f"no ledger names {victim_id} and nothing is marked")
    seconds = time.monotonic() - killed_at
    new_auditor = await who_is_auditor(meta)
    assert new_auditor is not None and new_auditor != victim_id
    checked = 0
    for ledger_id, payloads in written.items():
        md = await meta.ledgers.get(ledger_id)
        checked += await verify_full_replication(cluster, md, payloads, before=before[ledger_id])
    assert checked == LEDGERS * ENTRIES * 3
    copied = len(affected) * ENTRIES
    print(
        f"\nre-replicated {len(affected)} ledgers ({copied} entries, "
        f"{copied * PAYLOAD_BYTES / 1e6:.1f} MB) in {seconds:.1f} s after kill -9 "
        f"(incl. detection and auditor fail-over): {copied / seconds:.0f} entries/s"
    )


async def test_recover_command_moves_a_dead_bookies_fragments_now(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """Autorecovery off in the bookies: the admin command alone does the work, with progress;
    an open ledger on the dead bookie is fenced and closed first."""
    config = {**AUTORECOVERY_CONFIG, "autorecovery": {"enabled": False}}
    cluster = await bookie_cluster_factory(count=4, metadata_uri=etcd_server.uri, config=config)
    meta = await cluster.metadata()
    written = await write_ledgers(etcd_server.uri, 4, 200, 128)
    open_ledger = await write_ledgers(etcd_server.uri, 1, 50, 128, close=False)
    (open_id,) = open_ledger
    victim_id = (await meta.ledgers.get(open_id)).ensembles[0][1][0]
    victim = cluster.bookie_ids.index(victim_id)
    cluster.kill9(victim)
    await cluster.wait_until_deregistered(victim)
    updates: list[RecoveryProgress] = []
    report = await recover_bookie(
        etcd_server.uri, victim_id, updates.append, admin_token=cluster.admin_token
    )
    assert report.complete, report.failed
    assert updates and updates[-1].ledgers_done == updates[-1].ledgers_total
    assert not await ledgers_naming(meta, victim_id)
    assert report.open_ledgers_recovered == 1
    for ledger_id, payloads in {**written, **open_ledger}.items():
        md = await meta.ledgers.get(ledger_id)
        await verify_full_replication(cluster, md, payloads)


async def test_decommission_under_writes_loses_no_write(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(
        count=4, metadata_uri=etcd_server.uri, config=AUTORECOVERY_CONFIG
    )
    meta = await cluster.metadata()
    closed = await write_ledgers(etcd_server.uri, 6, 200, 128)
    target_id = cluster.bookie_ids[1]
    stop = asyncio.Event()
    written: dict[int, list[bytes]] = {}
    async with BookKeeper.connect(etcd_server.uri, add_timeout=30.0) as bk:

        async def writer(index: int) -> None:
            # Qa3, as write_ledgers: the check at the end reads every copy (a Qa2 writer does
            # not wait for the slowest bookie, and its client's exit drops what it lacked).
            handle = await bk.create_ledger(3, 3, 3, password=PASSWORD)
            payloads = written.setdefault(handle.ledger_id, [])
            while not stop.is_set():
                batch = [b"w%d-%d" % (index, len(payloads) + i) for i in range(20)]
                await asyncio.gather(*(handle.append(p) for p in batch))  # Raises on failure.
                payloads.extend(batch)
                await asyncio.sleep(0.01)
            await handle.close()

        writers = [asyncio.create_task(writer(i)) for i in range(3)]
        await asyncio.sleep(1.0)
        report = await decommission_bookie(
            etcd_server.uri,
            target_id,
            admin_token=cluster.admin_token,
            open_ledger_grace_seconds=20.0,
        )
        await asyncio.sleep(0.5)  # Writes go on after the drain too.
        stop.set()
        await asyncio.gather(*writers)  # Any failed write raises here.
    assert report.complete, report.failed
    assert report.open_ledgers_recovered == 0  # The writers moved off by themselves.
    assert not await ledgers_naming(meta, target_id)
    for ledger_id, payloads in {**closed, **written}.items():
        md = await meta.ledgers.get(ledger_id)
        await verify_full_replication(cluster, md, payloads)
