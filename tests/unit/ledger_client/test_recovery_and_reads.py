"""Recovery and read decisions against FakeBookies (quorum coverage, absence, fencing)."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.errors import (
    BookieUnavailableError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bkaio.ledger_client.errors import InvalidArgumentError, LedgerRecoveryError
from bkaio.meta.ledger_metadata import LedgerState
from tests.unit.ledger_client.cluster import fake_cluster


async def test_an_entry_on_one_bookie_is_recovered_and_rewritten_to_qa() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")
    await lh.append(b"a")
    await lh.append(b"b")
    _b0, b1, b2 = lh.metadata.ensembles[0][1]
    for bookie_id in (b1, b2):
        del cluster.bookie(bookie_id).ledgers[lh.ledger_id].entries[1]
    cluster.ops.slow_reads.add(b1)  # Only b2 can say "no": one negative of the 2 needed.
    rh = await cluster.second_client().open_ledger(lh.ledger_id, b"pw", recovery=True)
    assert rh.last_entry_id == 1
    assert rh.length == 2
    assert 1 in cluster.bookie(b2).ledgers[lh.ledger_id].entries  # Re-written (RECOVERY_ADD).
    cluster.ops.slow_reads.clear()
    assert [e.payload for e in await rh.read(0, 1)] == [b"a", b"b"]


async def test_fencing_recovery_reads_stop_a_late_add_bookkeeper_2614() -> None:
    """Qw3/Qa2: e0 reached b2 only; the fence to b3 is lost; b1 and b3 say 'no such entry'
    before b2 answers. The recovery read fenced b3, so the writer's delayed add to b3 is
    rejected: the writer never sees e0 acknowledged in a ledger sealed without it."""
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")
    b1, b2, b3 = lh.metadata.ensembles[0][1]
    cluster.ops.hold(b1)
    cluster.ops.hold(b3)
    add = lh.append(b"e0")
    await asyncio.sleep(0.01)
    assert 0 in cluster.bookie(b2).ledgers[lh.ledger_id].entries
    cluster.ops.fence_lost.add(b3)
    cluster.ops.slow_reads.add(b2)
    rh = await cluster.second_client().open_ledger(lh.ledger_id, b"pw", recovery=True)
    assert rh.last_entry_id == -1
    cluster.ops.release(b3)  # The delayed add reaches b3, which the recovery read fenced.
    cluster.ops.release(b1)
    with pytest.raises(LedgerFencedError):
        await add


async def test_recovery_without_enough_answers_leaves_the_ledger_unsealed() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")
    await lh.append(b"a")
    ensemble = lh.metadata.ensembles[0][1]
    cluster.ops.down.update(ensemble[:2])  # Only 1 of the needed E - Qa + 1 = 2 answers.
    with pytest.raises(LedgerRecoveryError, match="only 1 of 3 bookies answered"):
        await cluster.second_client().open_ledger(lh.ledger_id, b"pw", recovery=True)
    assert cluster.store.records[lh.ledger_id].state is LedgerState.IN_RECOVERY
    cluster.ops.down.clear()
    rh = await cluster.second_client().open_ledger(lh.ledger_id, b"pw", recovery=True)
    assert rh.is_closed and rh.last_entry_id == 0


async def test_recovery_of_an_empty_last_segment_starts_at_its_first_entry_2615() -> None:
    cluster = fake_cluster(5)
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*(lh.append(b"%d" % i) for i in range(4)))
    first = lh.metadata.ensembles[0][1]
    cluster.ops.down.add(first[1])  # First of entry 4's write set (1, 2, 0).
    await lh.append(b"4")  # Ensemble change at entry 4 (LAC 3).
    assert [s for s, _ in lh.metadata.ensembles] == [0, 4]
    # The new segment holds entry 4 on Qa bookies; pretend the writer died before it did.
    for bookie_id in lh.metadata.ensembles[1][1]:
        ledger = cluster.bookie(bookie_id).ledgers.get(lh.ledger_id)
        if ledger is not None:
            ledger.entries.pop(4, None)
            ledger.explicit_lac = -1
    rh = await cluster.second_client().open_ledger(lh.ledger_id, b"pw", recovery=True)
    assert rh.last_entry_id == 3
    assert rh.length == 4
    assert [s for s, _ in rh.metadata.ensembles] == [0, 4]


async def test_concurrent_recoveries_agree_on_the_end() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 2, 2, password=b"pw")
    await asyncio.gather(*(lh.append(b"%d" % i) for i in range(20)))
    first, second = await asyncio.gather(
        cluster.second_client().open_ledger(lh.ledger_id, b"pw"),
        cluster.second_client().open_ledger(lh.ledger_id, b"pw"),
    )
    assert first.last_entry_id == second.last_entry_id == 19
    assert cluster.store.records[lh.ledger_id].state is LedgerState.CLOSED


async def test_a_closed_ledger_opens_without_recovery_work() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(password=b"pw")
    await lh.append(b"a")
    await lh.close()
    updates = cluster.store.updates
    rh = await cluster.client.open_ledger(lh.ledger_id, b"pw", recovery=True)
    assert rh.is_closed and rh.last_entry_id == 0
    assert cluster.store.updates == updates


async def test_wrong_password_is_unauthorized_and_missing_ledger_is_no_such_ledger() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(password=b"pw")
    with pytest.raises(UnauthorizedError):
        await cluster.client.open_ledger(lh.ledger_id, b"nope")
    await cluster.client.delete_ledger(lh.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await cluster.client.open_ledger(lh.ledger_id, b"pw")
    with pytest.raises(NoSuchLedgerError):
        await cluster.client.delete_ledger(lh.ledger_id)
    assert [i async for i in cluster.client.list_ledgers()] == []


async def test_a_corrupt_copy_is_skipped_for_another_one() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 3, 2)
    await lh.append(b"payload")
    await lh.close()
    first = lh.metadata.ensembles[0][1][0]
    cluster.bookie(first).corrupt(lh.ledger_id, 0)
    rh = await cluster.client.open_ledger(lh.ledger_id)
    assert (await rh.read(0, 0))[0].payload == b"payload"
    for bookie_id in lh.metadata.ensembles[0][1][1:]:
        cluster.bookie(bookie_id).corrupt(lh.ledger_id, 0)
    with pytest.raises(BookieUnavailableError, match="corrupt copy"):
        await rh.read(0, 0)


async def test_reads_past_the_end_and_bad_ranges_are_errors() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger()
    await asyncio.gather(*(lh.append(b"x") for _ in range(3)))
    await lh.close()
    rh = await cluster.client.open_ledger(lh.ledger_id)
    with pytest.raises(NoSuchEntryError, match="beyond its last entry 2"):
        await rh.read(0, 3)
    with pytest.raises(InvalidArgumentError):
        await rh.read(2, 1)
    with pytest.raises(NoSuchEntryError, match="will never exist"):
        await rh.wait_for_entry(3)


async def test_unanswered_bookies_never_count_as_no() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 2, 2)
    await lh.append(b"x")
    await lh.close()
    ensemble = lh.metadata.ensembles[0][1]
    rh = await cluster.client.open_ledger(lh.ledger_id)
    cluster.ops.down.update(ensemble[:2])  # Entry 0 lives on indexes 0 and 1.
    with pytest.raises(BookieUnavailableError, match="too few bookies answered"):
        await rh.read(0, 0)
    cluster.ops.down.clear()
    cluster.bookie(ensemble[0]).ledgers.clear()
    cluster.bookie(ensemble[1]).ledgers.clear()
    with pytest.raises(NoSuchEntryError, match="absent"):
        await rh.read(0, 0)


async def test_speculative_read_beats_a_hung_first_replica() -> None:
    cluster = fake_cluster(3, speculative_read_timeout=0.01, read_timeout=5.0)
    cluster.ops.timeout = 5.0
    lh = await cluster.client.create_ledger(3, 3, 2)
    await lh.append(b"x")
    await lh.close()
    rh = await cluster.client.open_ledger(lh.ledger_id)
    cluster.ops.hung.add(lh.metadata.ensembles[0][1][0])
    async with asyncio.timeout(1.0):
        assert (await rh.read(0, 0))[0].payload == b"x"


async def test_tailing_reader_sees_entries_up_to_the_lac_only() -> None:
    cluster = fake_cluster(3, explicit_lac_interval=0.01)
    lh = await cluster.client.create_ledger(3, 3, 2)
    rh = await cluster.second_client().open_ledger(lh.ledger_id, recovery=False)
    assert await rh.wait_for_entry(0, timeout=0.05) is None
    await lh.append(b"first")
    entry = await rh.wait_for_entry(0, timeout=2.0)
    assert entry is not None and entry.payload == b"first"
    assert rh.last_add_confirmed <= lh.last_add_confirmed
    await lh.close()
    with pytest.raises(NoSuchEntryError):
        await rh.wait_for_entry(1, timeout=2.0)
