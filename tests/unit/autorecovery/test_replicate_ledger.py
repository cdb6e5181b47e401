"""`Replicator.replicate_ledger`, the real code (copier, placement, metadata swap) over SQLite
metadata and in-memory bookies: moving a striped ledger (E > Qw) off a dead bookie and a
decommissioned, still running one in the same call reads the entries whose only surviving copy
is on the running one from it; a metadata swap the store keeps losing answers to gives up after
a bounded number of compare-and-swaps instead of looping (holding the ledger's lock) for ever;
a swap that loses to a writer's ensemble change and close keeps the writer's changes; a
swap waits for the lease of the ledger's lock when it is in doubt, and is not made when the
store does not confirm it."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from bkaio.autorecovery import AutorecoveryMetrics, EntryUnreadableError, Outcome, ReplicationError
from bkaio.autorecovery.cluster import ClusterView
from bkaio.autorecovery.fragments import LockLeaseUnconfirmedError
from bkaio.autorecovery.replicator import Replicator
from bkaio.ledger_client.quorum import write_set
from bkaio.ledger_client.types import StoredCopy
from bkaio.meta import LedgerMetadata, LedgerState, Metadata
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.store import MAX_METADATA_ATTEMPTS
from bkaio.protocol.digest import entry_digest
from tests.unit.autorecovery.fake_leases import FakeLockLease
from tests.unit.autorecovery.test_fill_in_place import (
    KEY,
    FakeBookiePool,
    FakeMasterKeysEveryBookieGives,
)
from tests.unit.ledger_client.fakes import FakeBookie

A, B, C, D, E = (f"127.0.0.1:{port}" for port in range(3181, 3186))
ENTRIES = 12


@dataclass
class Cluster:
    replicator: Replicator
    view: ClusterView
    pool: FakeBookiePool
    bookies: dict[str, FakeBookie]


@pytest.fixture
async def cluster(meta: Metadata) -> AsyncIterator[Cluster]:
    """Five in-memory bookies A..E; the view shows them all writable until a test says
    otherwise. The real Replicator, its pool replaced by the fakes."""
    bookies = {bookie_id: FakeBookie(bookie_id) for bookie_id in (A, B, C, D, E)}
    pool = FakeBookiePool(list(bookies.values()))
    view = ClusterView(meta)
    real_pool, view.pool = view.pool, pool  # type: ignore[assignment]  # The fake stands in.
    await real_pool.close()
    view.set_bookies([pool.info(bookie_id) for bookie_id in bookies])
    keys = FakeMasterKeysEveryBookieGives(view, "token")
    replicator = Replicator(view, keys, AutorecoveryMetrics(CollectorRegistry()))
    try:
        yield Cluster(replicator, view, pool, bookies)
    finally:
        await view.close()


async def _closed_ledger(
    meta: Metadata, cluster: Cluster, ensemble: tuple[str, ...], write_quorum: int
) -> LedgerMetadata:
    """A closed ledger of ENTRIES entries, each on every bookie of its write set."""
    md = await meta.ledgers.create(
        LedgerMetadata(
            ensemble_size=len(ensemble),
            write_quorum=write_quorum,
            ack_quorum=write_quorum,
            ensembles=((0, ensemble),),
        )
    )
    length = 0
    for entry_id in range(ENTRIES):
        payload = b"entry-%d" % entry_id
        length += len(payload)
        digest = entry_digest(md.ledger_id, entry_id, entry_id - 1, length, payload)
        copy = StoredCopy(entry_id, entry_id - 1, length, digest, payload)
        for index in write_set(entry_id, len(ensemble), write_quorum):
            cluster.bookies[ensemble[index]].add(md.ledger_id, copy, KEY, recovery=False)
    return await meta.ledgers.update(md.closed(ENTRIES - 1, length))


def _lacking(md: LedgerMetadata, bookies: dict[str, FakeBookie]) -> list[tuple[int, str]]:
    """(entry, bookie) for each entry a bookie of its write set in `md` does not hold."""
    lacking = []
    for entry_id in range(md.last_entry_id + 1):
        ensemble = md.ensemble_for(entry_id)
        for index in write_set(entry_id, md.ensemble_size, md.write_quorum):
            ledger = bookies[ensemble[index]].ledgers.get(md.ledger_id)
            if ledger is None or entry_id not in ledger.entries:
                lacking.append((entry_id, ensemble[index]))
    return lacking


async def test_a_decommissioned_running_bookie_is_read_while_a_dead_one_is_moved_with_it(
    meta: Metadata, cluster: Cluster
) -> None:
    """E3/Qw2 over A, B, C: B died, C is decommissioned (read-only, still up). One mark names
    both (the auditor takes a decommissioned bookie as lost at once), so one call moves both.
    Entries 1, 4, 7, 10 have the write set {B, C}: C holds their only surviving copy. The
    copier left every bookie being moved off out of its sources, except the fragment's own:
    B's fragment (moved first) found no source for entry 1 and the ledger failed with
    EntryUnreadableError, on every retry, though C could give it (a drain reports such a
    ledger at once and gives up on it)."""
    md = await _closed_ledger(meta, cluster, (A, B, C), write_quorum=2)
    cluster.pool.down.add(B)
    decommissioned = dataclasses.replace(cluster.pool.info(C), read_only=True)
    cluster.view.set_bookies([cluster.pool.info(b) for b in (A, D, E)] + [decommissioned])

    result = await cluster.replicator.replicate_ledger(
        md.ledger_id, [B, C], recover_open_tail=False, lock_lease=FakeLockLease()
    )

    assert result.outcome is Outcome.DONE
    assert result.fragments == 2
    moved = await meta.ledgers.get(md.ledger_id)
    assert sorted(moved.ensembles[0][1]) == [A, D, E]
    assert _lacking(moved, cluster.bookies) == []


async def test_a_swap_the_store_keeps_losing_gives_up_after_a_bounded_number_of_attempts(
    meta: Metadata, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fragment was copied, but every compare-and-swap of the metadata loses its answer
    (and did not land). The swap re-read and tried again without bound, back to back, while
    the worker kept the ledger's lock (its lease kept alive): one ReplicationError after
    MAX_METADATA_ATTEMPTS now, as a writer's ensemble change and close and a recovery's seal
    give up (retried by the worker after its backoff; the copy is collected by GC if it is
    never swapped in)."""
    md = await _closed_ledger(meta, cluster, (A, B, C), write_quorum=3)
    cluster.pool.down.add(B)
    cluster.view.set_bookies([cluster.pool.info(b) for b in (A, C, D)])
    attempts = 0

    async def lossy_update(metadata: LedgerMetadata) -> LedgerMetadata:
        nonlocal attempts
        attempts += 1
        if attempts > 10 * MAX_METADATA_ATTEMPTS:  # Without a bound: fail, do not hang.
            raise RuntimeError(f"{attempts} compare-and-swaps of one fragment's move")
        raise MetadataOutcomeUnknownError("connection lost during the update")

    monkeypatch.setattr(meta.ledgers, "update", lossy_update)

    with pytest.raises(ReplicationError, match="compare-and-swap") as raised:
        await cluster.replicator.replicate_ledger(
            md.ledger_id, [B], recover_open_tail=False, lock_lease=FakeLockLease()
        )

    assert raised.value.ledger_id == md.ledger_id
    assert attempts == MAX_METADATA_ATTEMPTS
    assert (await meta.ledgers.get(md.ledger_id)).ensembles == md.ensembles
    assert sorted(cluster.bookies[D].ledgers[md.ledger_id].entries) == list(range(ENTRIES))


async def test_a_swap_that_loses_to_a_writers_ensemble_change_and_close_keeps_both(
    meta: Metadata, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's fragment of the first segment of an open ledger is copied; just before the swap's
    compare-and-swap lands, the writer changes its ensemble (a new last segment) and closes the
    ledger. The swap loses its compare-and-swap, reads the record again and puts the
    replacement into the first segment of the closed record: the writer's segment, state and
    length stay, and the first segment names no B. (The writer losing to the swap is tested
    in tests/unit/ledger_client; this is the other order.)"""
    md = await _closed_ledger(meta, cluster, (A, B, C), write_quorum=3)
    md = await meta.ledgers.update(  # Open again, with an open tail from entry 12 on A, C, D.
        dataclasses.replace(md, state=LedgerState.OPEN, last_entry_id=-1, length=0).with_ensemble(
            ENTRIES, (A, C, D)
        )
    )
    cluster.pool.down.add(B)
    cluster.view.set_bookies([cluster.pool.info(b) for b in (A, C, D, E)])
    update = meta.ledgers.update
    writer: list[LedgerMetadata] = []

    async def writer_first(metadata: LedgerMetadata) -> LedgerMetadata:
        if not writer:  # The swap's first compare-and-swap: the writer's two land before it.
            current = await meta.ledgers.get(md.ledger_id)
            changed = await update(current.with_ensemble(ENTRIES, (A, D, E)))
            writer.append(await update(changed.closed(ENTRIES + 1, 999)))
        return await update(metadata)

    monkeypatch.setattr(meta.ledgers, "update", writer_first)

    result = await cluster.replicator.replicate_ledger(
        md.ledger_id, [B], recover_open_tail=False, lock_lease=FakeLockLease()
    )

    assert writer and result.outcome is Outcome.DONE
    final = await meta.ledgers.get(md.ledger_id)
    assert final.is_closed and (final.last_entry_id, final.length) == (ENTRIES + 1, 999)
    assert final.ensembles[1] == (ENTRIES, (A, D, E))  # The writer's.
    first = final.ensembles[0][1]
    assert B not in first and first[0] == A and first[2] == C
    replacement = first[1]
    assert sorted(cluster.bookies[replacement].ledgers[md.ledger_id].entries) == list(
        range(ENTRIES)
    )


async def test_a_copy_the_replacement_acknowledged_but_did_not_keep_is_never_swapped_in(
    meta: Metadata, cluster: Cluster
) -> None:
    """Every add of the copy was acknowledged, but the replacements' storage did not keep entry
    7. The swap put such a replacement into the ledger on the acknowledgements alone, and the
    ledger then named, for entry 7, a bookie without it (found at the next daily ledger check
    at best). The replacement's entry list is checked before the swap now (BookKeeper's
    ReplicationWorker checks the ledger again before marking it replicated): each such
    replacement is refused, the ledger fails for now with B still in place, and a retry with a
    sound replacement moves it."""
    md = await _closed_ledger(meta, cluster, (A, B, C), write_quorum=3)
    cluster.pool.down.add(B)
    cluster.view.set_bookies([cluster.pool.info(b) for b in (A, C, D, E)])
    cluster.pool.dropped |= {(D, md.ledger_id, 7), (E, md.ledger_id, 7)}

    with pytest.raises(ReplicationError):
        await cluster.replicator.replicate_ledger(
            md.ledger_id, [B], recover_open_tail=False, lock_lease=FakeLockLease()
        )
    assert (await meta.ledgers.get(md.ledger_id)).ensembles == md.ensembles

    cluster.pool.dropped.clear()
    result = await cluster.replicator.replicate_ledger(
        md.ledger_id, [B], recover_open_tail=False, lock_lease=FakeLockLease()
    )
    assert result.outcome is Outcome.DONE
    moved = await meta.ledgers.get(md.ledger_id)
    assert B not in moved.ensembles[0][1]
    assert _lacking(moved, cluster.bookies) == []


@pytest.mark.parametrize("ensemble", [(A, B), (B,)], ids=["E2-Qw1-by-entry", "E1-Qw1-by-range"])
async def test_a_decommissioned_bookie_holding_the_only_copy_is_read_a_dead_one_is_reported(
    meta: Metadata, cluster: Cluster, ensemble: tuple[str, ...]
) -> None:
    """Qw = 1: each entry of B's stripe is on B alone. Decommissioned (read-only, still up), B
    is read, the last resort, and its fragment moves with every entry; dead, the ledger fails
    with EntryUnreadableError naming the first entry only B had, and stays as it was."""
    md = await _closed_ledger(meta, cluster, ensemble, write_quorum=1)
    decommissioned = dataclasses.replace(cluster.pool.info(B), read_only=True)
    cluster.view.set_bookies([cluster.pool.info(b) for b in (A, C)] + [decommissioned])

    result = await cluster.replicator.replicate_ledger(
        md.ledger_id, [B], recover_open_tail=False, lock_lease=FakeLockLease()
    )

    assert result.outcome is Outcome.DONE
    moved = await meta.ledgers.get(md.ledger_id)
    assert B not in moved.ensembles[0][1]
    assert _lacking(moved, cluster.bookies) == []

    again = await _closed_ledger(meta, cluster, ensemble, write_quorum=1)
    cluster.pool.down.add(B)
    cluster.view.set_bookies([cluster.pool.info(b) for b in (A, C)])
    with pytest.raises(EntryUnreadableError) as raised:
        await cluster.replicator.replicate_ledger(
            again.ledger_id, [B], recover_open_tail=False, lock_lease=FakeLockLease()
        )
    assert raised.value.entry_id == (1 if len(ensemble) == 2 else 0)
    assert (await meta.ledgers.get(again.ledger_id)).ensembles == again.ensembles


@pytest.mark.parametrize("store_keeps_it", [True, False])
async def test_the_swap_waits_while_the_locks_lease_is_in_doubt(
    meta: Metadata, cluster: Cluster, store_keeps_it: bool
) -> None:
    """The worker's loop stalled past its lease's TTL during the copy: the store may have
    dropped the lease (and the lock with it) and another worker claimed the ledger. The swap
    was made at once, on a lease only `lost` would have shown gone once the late refresh had
    answered. It waits for that answer now: made when the store keeps the lease, not made
    (LockLeaseUnconfirmedError; the copy is GC's) when it does not."""
    md = await _closed_ledger(meta, cluster, (A, B, C), write_quorum=2)
    cluster.pool.down.add(B)
    cluster.view.set_bookies([cluster.pool.info(b) for b in (A, C, D, E)])
    lease = FakeLockLease()
    lease.doubt, lease.verdict = True, store_keeps_it

    if store_keeps_it:
        result = await cluster.replicator.replicate_ledger(
            md.ledger_id, [B], recover_open_tail=False, lock_lease=lease
        )
        assert result.outcome is Outcome.DONE
        assert B not in (await meta.ledgers.get(md.ledger_id)).ensembles[0][1]
    else:
        with pytest.raises(LockLeaseUnconfirmedError, match="lock is lost or unconfirmed"):
            await cluster.replicator.replicate_ledger(
                md.ledger_id, [B], recover_open_tail=False, lock_lease=lease
            )
        assert (await meta.ledgers.get(md.ledger_id)).ensembles == md.ensembles
    assert lease.waits == 1
