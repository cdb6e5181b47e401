"""Autorecovery defects of issue 25, against real bookie processes (each running the real
autorecovery service) and a real etcd: the auditor does not spin after the lost-bookie delay
and counts ledgers once (1); a ledger that cannot be copied neither kills the worker nor stops
the others (2); marks of a bookie that came back are dropped (3)."""

from __future__ import annotations

import asyncio

from bkaio.autorecovery import list_under_replicated, who_is_auditor
from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory
from tests.fixtures.etcd import EtcdServer

from .helpers import (
    PASSWORD,
    autorecovery_config,
    bookie_metrics,
    entries_held,
    ledgers_naming,
    metric_sum,
    verify_full_replication,
    wait_for,
    write_ledgers,
    write_short_on,
)


def _no_tracebacks(cluster: BookieCluster) -> None:
    for bookie in cluster.bookies:
        text = bookie.log_path.read_text(errors="replace")
        assert "ExceptionGroup" not in text, bookie.log_tail()
        assert '"task_failed"' not in text, bookie.log_tail()


async def test_auditor_audits_on_events_only_and_counts_each_ledger_once(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """Defect 1: after the delay the old auditor rescanned every 0.01 s and re-counted every
    ledger each time (16,477 audit_marked lines in 4 minutes, 630 marks for 15 ledgers)."""
    cluster = await bookie_cluster_factory(
        count=4,
        metadata_uri=etcd_server.uri,
        config=autorecovery_config(lost_bookie_delay_seconds=1.0, audit_interval_seconds=3600.0),
    )
    meta = await cluster.metadata()
    written = await write_ledgers(etcd_server.uri, 6, 50, 64)

    async def elected() -> bool:
        return await who_is_auditor(meta) is not None

    await wait_for(elected, 30, "an auditor is elected")
    auditor_id = await who_is_auditor(meta)
    auditor = cluster.bookie_ids.index(str(auditor_id))
    victim = next(i for i in range(4) if i != auditor)
    victim_id = cluster.bookie_ids[victim]
    affected = await ledgers_naming(meta, victim_id)
    assert affected
    cluster.kill9(victim)

    async def rereplicated() -> bool:
        return not await ledgers_naming(meta, victim_id) and not await list_under_replicated(meta)

    await wait_for(rereplicated, 90, f"no ledger names {victim_id} and nothing is marked")
    before = await bookie_metrics(cluster[auditor].admin_url)
    await asyncio.sleep(3.0)  # Quiet: nothing changes, so nothing should be audited.
    after = await bookie_metrics(cluster[auditor].admin_url)
    audits = metric_sum(after, "bkaio_autorecovery_audits_total")
    assert metric_sum(before, "bkaio_autorecovery_audits_total") == audits
    assert audits <= 8, after  # Elected, the kill, the delay's end, the copies' ensemble... .
    assert metric_sum(after, "bkaio_autorecovery_ledgers_marked_total") == len(affected)
    assert metric_sum(after, "bkaio_autorecovery_under_replicated_ledgers") == 0
    log_text = cluster[auditor].log_path.read_text(errors="replace")
    assert 1 <= log_text.count('"audit_marked"') <= 2, log_text.count('"audit_marked"')
    for ledger_id, payloads in written.items():
        await verify_full_replication(cluster, await meta.ledgers.get(ledger_id), payloads)
    _no_tracebacks(cluster)


async def test_unreadable_ledger_fails_alone_and_the_worker_goes_on(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """Defect 2: a failed entry copy raised an ExceptionGroup that killed the worker's loop.

    Ledger U (E3 Qw2) and ledger R (E3 Qw3) on b0, b1, b2; b0 and b1 die for good: U's entry 0
    (write set b0, b1) has no copy left, R is readable from b2. R is re-replicated while U
    keeps failing; no worker dies."""
    cluster = await bookie_cluster_factory(
        count=5, metadata_uri=etcd_server.uri, config=autorecovery_config(retry_backoff_seconds=0.5)
    )
    meta = await cluster.metadata()
    await asyncio.gather(cluster.stop(3), cluster.stop(4))
    await cluster.wait_until_deregistered(3)
    await cluster.wait_until_deregistered(4)
    async with BookKeeper.connect(etcd_server.uri, add_timeout=30.0) as bk:
        striped = await bk.create_ledger(3, 2, 2, password=PASSWORD)
        full = await bk.create_ledger(3, 3, 2, password=PASSWORD)
        payloads = [b"entry-%d" % i for i in range(30)]
        for handle in (striped, full):
            await asyncio.gather(*(handle.append(p) for p in payloads))
            await handle.close()
    await asyncio.gather(cluster.start(3), cluster.start(4))
    cluster.kill9(0)
    cluster.kill9(1)
    dead = {cluster.bookie_ids[0], cluster.bookie_ids[1]}

    async def full_moved() -> bool:
        md = await meta.ledgers.get(full.ledger_id)
        return not any(dead & set(ensemble) for _, ensemble in md.ensembles)

    await wait_for(full_moved, 90, f"ledger {full.ledger_id} moved off {sorted(dead)}")
    await verify_full_replication(cluster, await meta.ledgers.get(full.ledger_id), payloads)

    async def striped_failed_twice() -> bool:
        failures = 0.0
        for index in (2, 3, 4):
            samples = await bookie_metrics(cluster[index].admin_url)
            failures += metric_sum(samples, "bkaio_autorecovery_replication_failures_total")
        return failures >= 2

    await wait_for(striped_failed_twice, 60, f"ledger {striped.ledger_id} retried")
    marks = {r.ledger_id: r for r in await list_under_replicated(meta)}
    assert set(marks) == {striped.ledger_id}
    for index in (2, 3, 4):
        samples = await bookie_metrics(cluster[index].admin_url)
        assert metric_sum(samples, "bkaio_task_failures_total") == 0, samples
    logs = "".join(cluster[i].log_path.read_text(errors="replace") for i in (2, 3, 4))
    assert f'"ledger_id": {striped.ledger_id}' in logs and "EntryUnreadableError" in logs
    _no_tracebacks(cluster)


async def test_marks_of_a_bookie_that_came_back_are_dropped(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """Defect 3: the mark kept the bookie as missing after it returned, and `recover` then
    failed with "readable from none of []". Three bookies, E3: with one gone there is no
    replacement, so the marks stay until it returns; then the auditor drops them."""
    cluster = await bookie_cluster_factory(
        count=3,
        metadata_uri=etcd_server.uri,
        config=autorecovery_config(lost_bookie_delay_seconds=0.0),
    )
    meta = await cluster.metadata()
    written = await write_ledgers(etcd_server.uri, 3, 20, 64)
    await cluster.stop(2)  # Graceful: it keeps every entry it was sent (checked at the end).

    async def all_marked() -> bool:
        return len(await list_under_replicated(meta)) == len(written)

    await wait_for(all_marked, 60, "every ledger is marked while bookie 2 is gone")
    marks = await list_under_replicated(meta)
    assert {r.missing_bookies for r in marks} == {(cluster.bookie_ids[2],)}
    await cluster.start(2)

    async def none_marked() -> bool:
        return not await list_under_replicated(meta)

    await wait_for(none_marked, 60, "the marks are dropped once bookie 2 is back")
    for ledger_id, payloads in written.items():
        md = await meta.ledgers.get(ledger_id)
        assert cluster.bookie_ids[2] in md.ensembles[0][1]  # Nothing was moved.
        await verify_full_replication(cluster, md, payloads)
    _no_tracebacks(cluster)


async def test_entries_missing_on_a_live_bookie_are_found_and_filled_in(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """The ledger check (BookKeeper's periodic check): a writer that went on at Qa while b2
    was down and could not be replaced leaves b2's fragment short, though b2 comes back and the
    metadata still names it. The check finds it; a worker copies the missing entries back to
    b2 (three bookies: there is no other bookie to move the fragment to)."""
    cluster = await bookie_cluster_factory(
        count=3,
        metadata_uri=etcd_server.uri,
        config=autorecovery_config(
            lost_bookie_delay_seconds=3600.0, ledger_check_interval_seconds=2.0
        ),
    )
    meta = await cluster.metadata()
    payloads = [b"entry-%d" % i for i in range(40)]
    ledger_id = await write_short_on(cluster, etcd_server.uri, 2, payloads)
    b2 = cluster.bookie_ids[2]
    await cluster.start(2)  # Without entries 20..39: it was down while they were written.

    async def filled() -> bool:
        held = await entries_held(cluster, b2, ledger_id)
        return held == len(payloads) and not await list_under_replicated(meta)

    await wait_for(filled, 60, f"ledger {ledger_id}'s entries filled back into {b2}")
    md = await meta.ledgers.get(ledger_id)
    assert b2 in md.ensembles[0][1]  # Filled in place: the metadata did not change.
    await verify_full_replication(cluster, md, payloads)
    samples = [await bookie_metrics(b.admin_url) for b in cluster.bookies]
    assert sum(metric_sum(x, "bkaio_autorecovery_ledgers_marked_total") for x in samples) >= 1
    _no_tracebacks(cluster)
