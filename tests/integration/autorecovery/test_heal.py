"""What the 30-minute soak (tests/soak) found missing, against real bookie processes and a real
etcd: a mark is never completed over a live bookie's copies that were not filled (a bookie
momentarily unregistered keeps its mark and is filled once back; a drain keeps it too), and a
drain waits out a bookie that holds the only other copy of some entries instead of giving them
up."""

from __future__ import annotations

import asyncio

from bkaio.autorecovery import RecoveryProgress, list_under_replicated, recover_bookie
from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer

from .helpers import (
    AUTORECOVERY_CONFIG,
    PASSWORD,
    autorecovery_config,
    bookie_metrics,
    entries_held,
    ledgers_naming,
    metric_sum,
    verify_full_replication,
    wait_for,
    write_short_on,
)


async def test_a_mark_over_an_unregistered_incomplete_bookie_is_kept_until_it_is_filled(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """b2's fragment is short (the writer went on at Qa while it was down) and the ledger is
    marked with b2 incomplete, but b2 is not registered when the workers look (a lost lease,
    a restart). The workers used to drop b2 and complete the mark, writing its copies off
    (the ledger check is off here, as it is for a day between checks by default). Now the
    mark is given back and kept while b2 is away, and b2 is filled once it is back."""
    cluster = await bookie_cluster_factory(
        count=3,
        metadata_uri=etcd_server.uri,
        config=autorecovery_config(
            lost_bookie_delay_seconds=3600.0, ledger_check_interval_seconds=0.0
        ),
    )
    meta = await cluster.metadata()
    payloads = [b"entry-%d" % i for i in range(40)]
    ledger_id = await write_short_on(cluster, etcd_server.uri, 2, payloads)
    b2 = cluster.bookie_ids[2]
    await cluster.wait_until_deregistered(2)
    await meta.underreplication.mark(ledger_id, [b2], incomplete=True)

    async def kept() -> bool:
        samples = [await bookie_metrics(b.admin_url) for b in cluster.bookies[:2]]
        return sum(metric_sum(s, "bkaio_autorecovery_marks_kept_total") for s in samples) >= 2

    await wait_for(kept, 60, "a worker gave the mark back instead of completing it")
    record = await meta.underreplication.get(ledger_id)
    assert record is not None and record.incomplete_bookies == (b2,)
    await cluster.start(2)  # Without entries 20..39.

    async def filled() -> bool:
        held = await entries_held(cluster, b2, ledger_id)
        return held == len(payloads) and not await list_under_replicated(meta)

    await wait_for(filled, 60, f"ledger {ledger_id}'s entries filled back into {b2}")
    await verify_full_replication(cluster, await meta.ledgers.get(ledger_id), payloads)


async def test_a_drain_waits_out_the_bookie_holding_the_only_other_copy(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """E3/Qw2: the entries whose write set is {victim, holder} have one other copy, on the
    holder. With the holder registered but not answering (stopped with SIGSTOP; its long
    registration lease keeps it registered), `recover` of the victim used to give the ledger
    up at once as unreadable (every failure was a timeout). Now it retries within its timeout
    and completes once the holder answers again. (A holder that is not registered at all has
    no surviving copy: that is still reported at once, test_operator_commands.)"""
    config = {**AUTORECOVERY_CONFIG, "autorecovery": {"enabled": False}}
    cluster = await bookie_cluster_factory(
        count=4, metadata_uri=etcd_server.uri, config=config, registration_ttl_seconds=120.0
    )
    meta = await cluster.metadata()
    payloads = [b"entry-%d" % i for i in range(30)]
    async with BookKeeper.connect(etcd_server.uri, add_timeout=30.0) as bk:
        handle = await bk.create_ledger(3, 2, 2, password=PASSWORD)
        await asyncio.gather(*(handle.append(p) for p in payloads))
        await handle.close()
    victim_id, holder_id, _ = (await meta.ledgers.get(handle.ledger_id)).ensembles[0][1]
    victim = cluster.bookie_ids.index(victim_id)
    holder = cluster.bookie_ids.index(holder_id)
    await cluster.stop(victim)  # Graceful: deregistered at once.
    await cluster.wait_until_deregistered(victim)
    cluster.sigstop(holder)
    updates: list[RecoveryProgress] = []
    recovery = asyncio.ensure_future(
        recover_bookie(
            etcd_server.uri,
            victim_id,
            updates.append,
            admin_token=cluster.admin_token,
            timeout_seconds=600.0,
        )
    )
    try:

        async def attempted() -> bool:
            return bool(updates) or recovery.done()

        await wait_for(attempted, 180, "the drain tried the ledger while the holder was stopped")
        assert not recovery.done(), recovery.result()  # Not given up.
        cluster.sigcont(holder)
        report = await recovery
    finally:
        cluster.sigcont(holder)
        if not recovery.done():
            recovery.cancel()
            await asyncio.gather(recovery, return_exceptions=True)
    assert report.complete and not report.unreadable, (report.failed, report.unreadable)
    assert not await ledgers_naming(meta, victim_id)
    await verify_full_replication(cluster, await meta.ledgers.get(handle.ledger_id), payloads)


async def test_a_drain_keeps_the_mark_over_an_unregistered_incomplete_bookie(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """The ledger is marked with b2 incomplete (its fragment is short: the writer went on at Qa
    while it was down) and b2 is not registered now. `recover` of b0 moves b0's fragment to
    b3 and used to complete the mark, writing b2's missing copies off; now the drain finishes
    (nothing names b0) and leaves the mark, b2 still incomplete in it, for the workers."""
    config = {**AUTORECOVERY_CONFIG, "autorecovery": {"enabled": False}}  # The drain alone.
    cluster = await bookie_cluster_factory(count=4, metadata_uri=etcd_server.uri, config=config)
    meta = await cluster.metadata()
    b0, _, b2, _ = cluster.bookie_ids
    await cluster.stop(3)  # So that no bookie can replace b2 while the ledger is written.
    await cluster.wait_until_deregistered(3)
    payloads = [b"entry-%d" % i for i in range(40)]
    ledger_id = await write_short_on(cluster, etcd_server.uri, 2, payloads)
    await cluster.wait_until_deregistered(2)
    await meta.underreplication.mark(ledger_id, [b2], incomplete=True)  # The ledger check's.
    await cluster.start(3)  # The replacement for b0.
    await cluster.stop(0)
    await cluster.wait_until_deregistered(0)
    report = await recover_bookie(
        etcd_server.uri, b0, admin_token=cluster.admin_token, timeout_seconds=300.0
    )
    assert report.complete and report.ledgers_replicated == 1, report
    assert not await ledgers_naming(meta, b0)
    record = await meta.underreplication.get(ledger_id)
    assert record is not None, "the drain completed the mark over b2's missing copies"
    assert record.incomplete_bookies == (b2,), record
