"""The add path against FakeBookies: quorum, ordering, ensemble change, fencing, close."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.errors import (
    ConfigError,
    LedgerClosedError,
    LedgerFencedError,
    NotEnoughBookiesError,
    TooManyRequestsError,
)
from bkaio.ledger_client import ClientConfig
from bkaio.meta.ledger_metadata import LedgerState
from tests.unit.ledger_client.cluster import fake_cluster


async def test_appends_resolve_in_entry_order_and_close_seals_at_the_lac() -> None:
    cluster = fake_cluster()
    lh = await cluster.client.create_ledger(3, 2, 2, password=b"pw")
    ids = await asyncio.gather(*(lh.append(b"x%d" % i) for i in range(50)))
    assert ids == list(range(50))
    assert lh.last_add_confirmed == 49
    await lh.close()
    md = cluster.store.records[lh.ledger_id]
    assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 49, lh.length)
    assert md.length == sum(len(b"x%d" % i) for i in range(50))


async def test_entries_are_striped_over_their_write_sets() -> None:
    cluster = fake_cluster(4)
    lh = await cluster.client.create_ledger(4, 3, 2)
    await asyncio.gather(*(lh.append(b"e") for _ in range(8)))
    await lh.close()
    ensemble = lh.metadata.ensembles[0][1]
    for entry_id in range(8):
        holders = {
            b for b in ensemble if entry_id in cluster.bookie(b).ledgers[lh.ledger_id].entries
        }
        expected = {ensemble[(entry_id + k) % 4] for k in range(3)}
        assert holders == expected


async def test_a_later_entry_with_its_quorum_waits_for_an_earlier_one() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 2, 2)
    ensemble = lh.metadata.ensembles[0][1]
    # Entry 0 goes to indexes 0,1; entry 1 to 1,2. Hold index 0: entry 1 completes first.
    cluster.ops.hold(ensemble[0])
    first, second = lh.append(b"a"), lh.append(b"b")
    await asyncio.sleep(0.01)
    assert not first.done() and not second.done()
    assert lh.last_add_confirmed == -1
    cluster.ops.release(ensemble[0])
    assert await second == 1
    assert first.done() and first.result() == 0


async def test_a_failed_bookie_is_replaced_in_a_new_segment_at_lac_plus_one() -> None:
    cluster = fake_cluster(4)
    lh = await cluster.client.create_ledger(3, 2, 2)
    assert await asyncio.gather(*(lh.append(b"%d" % i) for i in range(5))) == list(range(5))
    victim = lh.metadata.ensembles[0][1][2]  # Entry 5 (write set {2, 0}) fails first.
    cluster.ops.down.add(victim)
    assert await asyncio.gather(*(lh.append(b"%d" % i) for i in range(5, 10))) == list(range(5, 10))
    await lh.close()
    md = cluster.store.records[lh.ledger_id]
    assert [start for start, _ in md.ensembles] == [0, 5]
    assert victim not in md.ensembles[1][1]
    reader = await cluster.client.open_ledger(lh.ledger_id, recovery=False)
    entries = await reader.read(0, 9)
    assert [e.payload for e in entries] == [b"%d" % i for i in range(10)]


async def test_a_failure_on_entry_zero_replaces_the_only_segment() -> None:
    cluster = fake_cluster(4)
    lh = await cluster.client.create_ledger(3, 3, 2)
    victim = lh.metadata.ensembles[0][1][0]
    cluster.ops.down.add(victim)
    assert await lh.append(b"first") == 0
    await lh.close()
    md = cluster.store.records[lh.ledger_id]
    assert len(md.ensembles) == 1 and victim not in md.ensembles[0][1]


async def test_a_hung_bookie_is_replaced_after_the_add_timeout() -> None:
    cluster = fake_cluster(4, add_timeout=0.05)
    lh = await cluster.client.create_ledger(3, 3, 3)
    await lh.append(b"a")
    victim = lh.metadata.ensembles[0][1][2]
    cluster.ops.hung.add(victim)
    assert await lh.append(b"b") == 1
    assert victim not in lh.metadata.ensembles[-1][1]


async def test_without_a_replacement_adds_continue_while_qa_can_be_met() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 3, 2)
    await lh.append(b"a")
    cluster.ops.down.add(lh.metadata.ensembles[0][1][0])
    assert await asyncio.gather(*(lh.append(b"b") for _ in range(6))) == list(range(1, 7))
    await lh.close()
    assert cluster.store.records[lh.ledger_id].last_entry_id == 6


async def test_without_a_replacement_adds_fail_once_qa_cannot_be_met() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 2, 2)
    await lh.append(b"a")
    cluster.ops.down.add(lh.metadata.ensembles[0][1][0])
    results = await asyncio.gather(*(lh.append(b"b") for _ in range(6)), return_exceptions=True)
    assert any(isinstance(r, NotEnoughBookiesError) for r in results)
    successes = [r for r in results if isinstance(r, int)]
    assert successes == list(range(1, 1 + len(successes)))  # Only a prefix succeeds.
    with pytest.raises(NotEnoughBookiesError):
        lh.append(b"c")
    await lh.close()
    assert cluster.store.records[lh.ledger_id].last_entry_id == lh.last_add_confirmed


async def test_recovery_fences_the_writer_append_and_close() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*(lh.append(b"%d" % i) for i in range(10)))
    acked = lh.last_add_confirmed
    recovered = await cluster.second_client().open_ledger(lh.ledger_id, b"pw", recovery=True)
    assert recovered.is_closed and recovered.last_entry_id >= acked
    with pytest.raises(LedgerFencedError):
        await lh.append(b"late")
    with pytest.raises(LedgerFencedError):
        await lh.close()


async def test_ensemble_change_after_recovery_started_is_fenced() -> None:
    cluster = fake_cluster(4)
    lh = await cluster.client.create_ledger(3, 3, 2)
    await lh.append(b"a")
    md = cluster.store.records[lh.ledger_id]
    cluster.store.records[lh.ledger_id] = md.with_state(LedgerState.IN_RECOVERY).with_version(99)
    cluster.ops.down.add(md.ensembles[0][1][1])  # First of entry 1's write set (1, 2, 0).
    with pytest.raises(LedgerFencedError, match="IN_RECOVERY"):
        await lh.append(b"b")


async def test_append_after_close_is_ledger_closed() -> None:
    cluster = fake_cluster()
    lh = await cluster.client.create_ledger()
    await lh.close()
    await lh.close()  # Idempotent.
    with pytest.raises(LedgerClosedError):
        lh.append(b"x")
    assert cluster.store.records[lh.ledger_id].last_entry_id == -1


async def test_close_whose_cas_outcome_was_lost_finds_its_own_close() -> None:
    cluster = fake_cluster()
    lh = await cluster.client.create_ledger()
    await lh.append(b"x")
    cluster.store.unknown_outcome_next_update = True
    await lh.close()
    assert cluster.store.records[lh.ledger_id].last_entry_id == 0


async def test_outstanding_adds_are_bounded_and_the_rest_follow() -> None:
    cluster = fake_cluster(max_outstanding_adds=2)
    lh = await cluster.client.create_ledger(3, 2, 2)
    futures = [lh.append(b"%d" % i) for i in range(10)]
    assert sum(cluster.ops.add_count.values()) == 4  # Two entries times Qw.
    assert await asyncio.gather(*futures) == list(range(10))


async def test_appends_beyond_the_queue_bound_are_refused_and_capacity_can_be_awaited() -> None:
    cluster = fake_cluster(max_outstanding_adds=2, max_queued_adds=3)
    lh = await cluster.client.create_ledger(3, 2, 2)
    futures = [lh.append(b"%d" % i) for i in range(5)]  # Two in flight, three queued.
    with pytest.raises(TooManyRequestsError, match="wait_for_capacity"):
        lh.append(b"one too many")
    await lh.wait_for_capacity()
    futures.append(lh.append(b"5"))
    assert await asyncio.gather(*futures) == list(range(6))


@pytest.mark.parametrize("name", ["max_outstanding_adds", "max_queued_adds"])
@pytest.mark.parametrize("value", [0, -1])
def test_add_bounds_below_one_are_refused(name: str, value: int) -> None:
    # max_queued_adds=0 was taken, and then refused every append (none may ever wait).
    with pytest.raises(ConfigError, match=f"{name}={value} must be >= 1"):
        ClientConfig(**{name: value})  # type: ignore[arg-type]


async def test_explicit_lac_reaches_the_bookies_after_the_interval() -> None:
    cluster = fake_cluster(explicit_lac_interval=0.02)
    lh = await cluster.client.create_ledger(3, 3, 2)
    for i in range(3):
        await lh.append(b"%d" % i)
    reader = await cluster.second_client().open_ledger(lh.ledger_id, recovery=False)
    assert await reader.read_last_add_confirmed() == 1  # Piggybacked: lags by one.
    await asyncio.sleep(0.1)
    assert await reader.read_last_add_confirmed() == 2
    await lh.close()


def _lac_pushes(ledger_id: int) -> list[asyncio.Task[object]]:
    return [
        task
        for task in asyncio.all_tasks()
        if task.get_name() == f"ledger-{ledger_id}-lac" and not task.done()
    ]


async def test_closing_the_client_ends_the_explicit_lac_pushes_of_its_open_handles() -> None:
    """A handle left open (its writer failed, say) when its client closes: its LAC push in
    flight is stopped and no later one starts; one left pending would outlive the client's
    connections and die with the loop ("Task was destroyed but it is pending")."""
    cluster = fake_cluster(explicit_lac_interval=0.005)
    lh = await cluster.client.create_ledger(3, 3, 2)
    await lh.append(b"0")
    cluster.ops.stalled_reads.update(cluster.ops.bookies)  # WRITE_LACs never answered.
    await lh.append(b"1")  # LAC 1, above what the adds carried: a push is due.
    await asyncio.sleep(0.05)  # Past the interval's timer, which runs first: the push started.
    assert _lac_pushes(lh.ledger_id)
    await cluster.client.close()
    assert not _lac_pushes(lh.ledger_id)
    await asyncio.sleep(0.03)  # Several intervals: no push starts after the close.
    assert not _lac_pushes(lh.ledger_id)
