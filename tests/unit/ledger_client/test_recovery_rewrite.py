"""Recovery re-writes through ensemble changes: a dead bookie is replaced, never sealed in."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from typing import Any

import pytest

from bkaio.errors import BookieIOError, NotEnoughBookiesError
from bkaio.ledger_client.placement import BookieCandidate
from bkaio.ledger_client.quorum import bookies_for_entry
from bkaio.meta.ledger_metadata import LedgerMetadata, LedgerState
from tests.unit.ledger_client.cluster import FakeCluster, fake_cluster


def _holders_complete(cluster: FakeCluster, md: LedgerMetadata) -> None:
    """Every entry is on every bookie its final write set names."""
    for entry_id in range(md.last_entry_id + 1):
        for bookie_id in bookies_for_entry(md.ensembles, entry_id, md.write_quorum):
            entries = cluster.bookie(bookie_id).ledgers[md.ledger_id].entries
            assert entry_id in entries, (entry_id, bookie_id, md.ensembles)


async def _open_writer_with_pipelined_entries(cluster: FakeCluster, count: int) -> int:
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")
    # Sent together: each carries LAC -1, so recovery must re-write every one of them.
    await asyncio.gather(*(lh.append(b"e%d" % i) for i in range(count)))
    return lh.ledger_id


async def test_a_dead_bookie_is_replaced_and_the_sealed_ledger_names_only_holders() -> None:
    cluster = fake_cluster(4, explicit_lac_interval=0)
    ledger_id = await _open_writer_with_pipelined_entries(cluster, 20)
    victim = cluster.store.records[ledger_id].ensembles[0][1][1]
    cluster.ops.down.add(victim)
    rh = await cluster.second_client().open_ledger(ledger_id, b"pw", recovery=True)
    md = rh.metadata
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 19
    assert len(md.ensembles) == 1  # Recovery started at entry 0: its segment was replaced.
    assert victim not in md.ensembles[-1][1]
    _holders_complete(cluster, md)
    assert [e.payload for e in await rh.read(0, 19)] == [b"e%d" % i for i in range(20)]


async def test_a_replacement_that_fails_too_is_replaced_in_turn() -> None:
    cluster = fake_cluster(5, explicit_lac_interval=0)
    ledger_id = await _open_writer_with_pipelined_entries(cluster, 10)
    first = cluster.store.records[ledger_id].ensembles[0][1]
    spares = [b for b in cluster.ops.bookies if b not in first]
    cluster.ops.down.update({first[0], spares[0]})
    recoverer = cluster.second_client()
    recoverer._context.placement = _Preferring(spares[0])  # The failing spare comes first.
    rh = await recoverer.open_ledger(ledger_id, b"pw", recovery=True)
    md = rh.metadata
    assert md.last_entry_id == 9
    assert first[0] not in md.ensembles[-1][1] and spares[0] not in md.ensembles[-1][1]
    _holders_complete(cluster, md)


async def test_with_no_spare_a_dead_bookie_stays_while_qa_holds_and_else_recovery_fails() -> None:
    cluster = fake_cluster(3, explicit_lac_interval=0)
    ledger_id = await _open_writer_with_pipelined_entries(cluster, 5)
    ensemble = cluster.store.records[ledger_id].ensembles[0][1]
    cluster.ops.down.add(ensemble[0])
    rh = await cluster.second_client().open_ledger(ledger_id, b"pw", recovery=True)
    assert rh.last_entry_id == 4  # On the two live bookies (Qa = 2): degraded, not lost.
    assert [e.payload for e in await rh.read(0, 4)] == [b"e%d" % i for i in range(5)]

    other = fake_cluster(3, explicit_lac_interval=0)
    ledger_id = await _open_writer_with_pipelined_entries(other, 5)
    ensemble = other.store.records[ledger_id].ensembles[0][1]
    refusing = set(ensemble[:2])  # They answer the fencing reads but refuse the re-writes.
    add_entry = other.ops.add_entry

    def refuse_adds(bookie_id: str, *args: Any, **kwargs: Any) -> None:
        if bookie_id in refusing:
            error = BookieIOError(f"{bookie_id}: disk failed")
            asyncio.get_running_loop().call_soon(kwargs["callback"], error)
            return
        add_entry(bookie_id, *args, **kwargs)

    other.ops.add_entry = refuse_adds  # type: ignore[method-assign]
    with pytest.raises(NotEnoughBookiesError, match="disk failed"):
        await other.second_client().open_ledger(ledger_id, b"pw")
    assert other.store.records[ledger_id].state is LedgerState.IN_RECOVERY  # Not sealed.


class _Preferring:
    """A placement that offers `first` as the first replacement, then any other bookie."""

    def __init__(self, first: str) -> None:
        self._first = first

    def new_ensemble(
        self,
        bookies: Sequence[BookieCandidate],
        ensemble_size: int,
        write_quorum: int,
        exclude: Collection[str] = (),
    ) -> tuple[str, ...]:
        raise AssertionError("recovery creates no ensembles")

    def replace_bookie(
        self,
        bookies: Sequence[BookieCandidate],
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        exclude: Collection[str] = (),
    ) -> str:
        excluded = {*exclude, *ensemble}
        names = [b.bookie_id for b in bookies if not b.read_only]
        for name in [self._first, *names]:
            if name not in excluded:
                return name
        raise NotEnoughBookiesError("no bookie left")
