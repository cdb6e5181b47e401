"""Recovery and ensemble changes racing other metadata writers and further bookie failures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bkaio.errors import MetadataError
from bkaio.ledger_client.quorum import bookies_for_entry
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.ledger_metadata import LedgerMetadata, LedgerState
from tests.unit.ledger_client.cluster import fake_cluster


async def test_a_replicator_swap_in_an_earlier_segment_survives_the_recovery_seal() -> None:
    """Autorecovery moves fragments of closed segments of a ledger that is not CLOSED
    (autorecovery/replicator.py `_swap`) while a recovery is under way: the recovery's seal,
    retried after that compare-and-swap, keeps the swap and adds only its own end."""
    cluster = fake_cluster(5, explicit_lac_interval=0)
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*(lh.append(b"%d" % i) for i in range(4)))
    first = lh.metadata.ensembles[0][1]
    cluster.ops.down.add(first[1])  # First of entry 4's write set: a change at entry 4.
    await lh.append(b"4")  # Entry 4 carries LAC 3: recovery re-writes it.
    cluster.ops.down.clear()
    second = lh.metadata.ensembles[1][1]
    assert [s for s, _ in lh.metadata.ensembles] == [0, 4]
    held = second[2]
    cluster.ops.hold(held)  # The recovery's re-write of entry 4 waits here.
    rewriting = asyncio.Event()
    add_entry = cluster.ops.add_entry

    def noting_adds(bookie_id: str, *args: Any, **kwargs: Any) -> None:
        add_entry(bookie_id, *args, **kwargs)
        if bookie_id == held:
            rewriting.set()

    cluster.ops.add_entry = noting_adds  # type: ignore[method-assign]
    recovery = asyncio.ensure_future(cluster.second_client().open_ledger(lh.ledger_id, b"pw"))
    await rewriting.wait()
    # The replicator moves segment 0's copy from first[0] to a bookie in no ensemble.
    spare = next(b for b in cluster.ops.bookies if b not in {*first, *second})
    md = cluster.store.records[lh.ledger_id]
    assert md.state is LedgerState.IN_RECOVERY
    swapped = tuple(spare if b == first[0] else b for b in first)
    await cluster.store.update(md.replace(ensembles=((0, swapped), md.ensembles[1])))
    cluster.ops.release(held)
    rh = await recovery
    assert rh.last_entry_id == 4
    sealed = cluster.store.records[lh.ledger_id]
    assert sealed.state is LedgerState.CLOSED
    assert sealed.ensembles == ((0, swapped), (4, second))


async def test_a_second_bookie_failing_during_an_ensemble_change_is_replaced_after_it() -> None:
    cluster = fake_cluster(6)
    lh = await cluster.client.create_ledger(3, 3, 2)
    await lh.append(b"0")
    first, _, third = lh.metadata.ensembles[0][1]
    cluster.ops.hold(third)
    update = cluster.store.update
    changes = 0

    async def failing_third_meanwhile(md: LedgerMetadata) -> LedgerMetadata:
        nonlocal changes
        changes += 1
        if changes == 1:  # The first change's compare-and-swap is under way: third fails.
            cluster.ops.down.add(third)
            cluster.ops.release(third)
        return await update(md)

    cluster.store.update = failing_third_meanwhile  # type: ignore[method-assign,assignment]
    cluster.ops.down.add(first)
    appended = [lh.append(b"%d" % i) for i in range(1, 6)]
    assert await asyncio.gather(*appended) == list(range(1, 6))
    await lh.close()
    md = cluster.store.records[lh.ledger_id]
    assert [s for s, _ in md.ensembles] == [0, 1]  # Both changes at LAC + 1 = entry 1.
    assert first not in md.ensembles[-1][1] and third not in md.ensembles[-1][1]
    for entry_id in range(md.last_entry_id + 1):
        for bookie_id in bookies_for_entry(md.ensembles, entry_id, md.write_quorum):
            stored = cluster.bookie(bookie_id).ledgers[md.ledger_id].entries
            assert entry_id in stored, (entry_id, bookie_id, md.ensembles)


async def test_a_close_during_an_ensemble_change_waits_for_it_and_seals_at_the_lac() -> None:
    """A bookie fails adds that already completed (a delayed write failure): the change it
    starts is still writing its segment when close() is called."""
    cluster = fake_cluster(4)
    lh = await cluster.client.create_ledger(3, 3, 2)
    slow = lh.metadata.ensembles[0][1][2]
    cluster.ops.hold(slow)
    assert await asyncio.gather(*(lh.append(b"%d" % i) for i in range(3))) == [0, 1, 2]
    gate = asyncio.Event()
    changing = asyncio.Event()
    update = cluster.store.update

    async def gated(md: LedgerMetadata) -> LedgerMetadata:
        if not md.is_closed:
            changing.set()
            await gate.wait()
        return await update(md)

    cluster.store.update = gated  # type: ignore[method-assign,assignment]
    cluster.ops.down.add(slow)
    cluster.ops.release(slow)  # Its three adds fail now.
    await changing.wait()
    closing = asyncio.ensure_future(lh.close())
    await asyncio.sleep(0)
    assert not closing.done()
    gate.set()
    await closing
    md = cluster.store.records[lh.ledger_id]
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 2
    assert [s for s, _ in md.ensembles] == [0, 3] and slow not in md.ensembles[1][1]


async def test_two_concurrent_closes_of_one_handle_seal_once_and_both_succeed() -> None:
    """(`async with` around a body that also calls close(), say.) The second close used to
    find the first one's CLOSED record and raise LedgerFencedError, "closed by another
    client"."""
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 3, 2)
    await lh.append(b"a")
    updates = cluster.store.updates
    await asyncio.gather(lh.close(), lh.close())
    assert cluster.store.updates == updates + 1
    md = cluster.store.records[lh.ledger_id]
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 0


async def test_a_writer_keeps_a_replicator_swap_through_its_ensemble_change_and_close() -> None:
    """Both compare-and-swaps of the writer lose to autorecovery's move of a fragment of an
    earlier segment: each is retried on the record as it is then."""
    cluster = fake_cluster(7)
    lh = await cluster.client.create_ledger(3, 3, 2)
    await asyncio.gather(*(lh.append(b"%d" % i) for i in range(3)))
    first = lh.metadata.ensembles[0][1]
    cluster.ops.down.add(first[0])  # First of entry 3's write set: a change at entry 3.
    assert await lh.append(b"3") == 3
    cluster.ops.down.clear()
    second = lh.metadata.ensembles[1][1]
    spare = next(b for b in cluster.ops.bookies if b not in {*first, *second})
    swapped = tuple(spare if b == first[1] else b for b in first)
    md = cluster.store.records[lh.ledger_id]
    md = await cluster.store.update(md.replace(ensembles=((0, swapped), md.ensembles[1])))
    cluster.ops.down.add(second[1])  # First of entry 4's write set: a change at entry 4.
    assert await lh.append(b"4") == 4
    third = lh.metadata.ensembles[2][1]
    md = cluster.store.records[lh.ledger_id]
    assert md.ensembles == ((0, swapped), (3, second), (4, third))
    spare = next(b for b in cluster.ops.bookies if b not in {*swapped, *second, *third})
    moved = tuple(spare if b == second[0] else b for b in second)
    await cluster.store.update(md.replace(ensembles=((0, swapped), (3, moved), (4, third))))
    await lh.close()
    md = cluster.store.records[lh.ledger_id]
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 4
    assert md.ensembles == ((0, swapped), (3, moved), (4, third))


@pytest.mark.parametrize("landing", [0, 1], ids=["marking", "sealing"])
async def test_recovery_gives_up_after_a_bounded_number_of_lost_metadata_updates(
    landing: int,
) -> None:
    """A store that loses every answer (MetadataOutcomeUnknownError, nothing written) after
    `landing` updates: the recovery fails, retryably, instead of retrying for ever."""
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")
    await lh.append(b"a")
    update = cluster.store.update
    lost = 0

    async def losing(md: LedgerMetadata) -> LedgerMetadata:
        nonlocal landing, lost
        if landing:
            landing -= 1
            return await update(md)
        lost += 1
        assert lost < 100, "recovery retries its metadata update without bound"
        raise MetadataOutcomeUnknownError("connection lost during the update")

    cluster.store.update = losing  # type: ignore[method-assign,assignment]
    with pytest.raises(MetadataError, match="compare-and-swap attempts"):
        await cluster.second_client().open_ledger(lh.ledger_id, b"pw")
    assert cluster.store.records[lh.ledger_id].state is not LedgerState.CLOSED


async def test_close_gives_up_after_a_bounded_number_of_lost_metadata_updates() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 3, 2)
    await lh.append(b"a")
    lost = 0

    async def losing(md: LedgerMetadata) -> LedgerMetadata:
        nonlocal lost
        lost += 1
        assert lost < 100, "close retries its metadata update without bound"
        raise MetadataOutcomeUnknownError("connection lost during the update")

    cluster.store.update = losing  # type: ignore[method-assign,assignment]
    with pytest.raises(MetadataError, match="compare-and-swap attempts"):
        await lh.close()
    assert cluster.store.records[lh.ledger_id].state is LedgerState.OPEN
