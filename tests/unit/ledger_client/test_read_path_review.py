"""The read path against bookies that misbehave in ways the other read tests do not cover: a
range answer that holds an entry past where it says it stopped looking (an older bookie's
READ_RANGE with a gap, or a wrong READ_ENTRY answer, as the pool packs them), a bookie dying
after answering part of a range, a closed ledger whose last segment is empty (and a tailing
reader across the recovery that seals it), long polls answered at once with an older LAC, and
copies of another entry answered for the one asked (single reads, recovery, the last
acknowledged entry), and the bound on entries read one by one (`read_window`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bkaio.errors import BookieUnavailableError, NoSuchEntryError
from bkaio.ledger_client.quorum import write_set
from bkaio.ledger_client.types import EntriesAnswer, StoredCopy
from bkaio.protocol.records import scan_records
from tests.unit.ledger_client.cluster import FakeCluster, fake_cluster
from tests.unit.ledger_client.test_range_reads import closed_ledger, payload, payloads


@pytest.mark.parametrize(("ensemble", "qw"), [(3, 3), (5, 2)])
async def test_an_answer_with_a_gap_below_an_entry_past_its_end_misplaces_nothing(
    ensemble: int, qw: int
) -> None:
    # An older bookie's READ_RANGE that skips a missing entry (the protocol says it stops
    # there), or a READ_ENTRY of a stride answered with the wrong entry, reach the reader as
    # records holding entry first + 2 * stride with `next_entry_id` first + 2 * stride
    # (`BookiePool._read_entries_by_older_ops` counts the entries it got). Entry first +
    # stride must not be delivered with the payload of the one after it.
    cluster = fake_cluster(5, read_batch_entries=100)
    ledger_id = await closed_ledger(cluster, 20, ensemble, qw)
    rh = await cluster.client.open_ledger(ledger_id)
    genuine = cluster.ops.read_entries
    bent: list[str] = []

    async def with_a_gap(
        bookie_id: str, ledger: int, first: int, last: int, **options: Any
    ) -> EntriesAnswer:
        answer = await genuine(bookie_id, ledger, first, last, **options)
        stride = options.get("stride", 1)
        if bent or first != 0:
            return answer
        scan = scan_records(answer.records, ledger, first, stride, last)
        # Entries first and first + 2 * stride, as the older path packs two entries.
        records = answer.records
        kept = records[: scan.offsets[1]] + records[scan.offsets[2] : scan.offsets[3]]
        bent.append(bookie_id)
        return EntriesAnswer(answer.lac, first + 2 * stride, kept)

    cluster.ops.read_entries = with_a_gap  # type: ignore[method-assign,assignment]
    assert [e.payload for e in await rh.read(0, 19)] == payloads(20)
    assert bent


@pytest.mark.parametrize(("ensemble", "qw"), [(3, 3), (5, 2)])
async def test_a_bookie_dying_after_part_of_a_range_costs_no_entry(ensemble: int, qw: int) -> None:
    # 30 kB entries and 64 KiB requests: each answer is cut after two entries by its byte
    # limit; the bookie that gave the first answer then dies. The rest of its stream goes
    # to the next bookie of the write set, from where the answer stopped.
    cluster = fake_cluster(5, read_batch_entries=100, read_batch_bytes=64 * 1024)
    ledger_id = await closed_ledger(cluster, 40, ensemble, qw, size=30_000)
    rh = await cluster.client.open_ledger(ledger_id)
    genuine = cluster.ops.read_entries
    killed: list[str] = []

    async def then_dies(
        bookie_id: str, ledger: int, first: int, last: int, **options: Any
    ) -> EntriesAnswer:
        answer = await genuine(bookie_id, ledger, first, last, **options)
        if not killed:
            assert answer.next_entry_id <= last  # Cut short by its byte limit.
            killed.append(bookie_id)
            cluster.ops.down.add(bookie_id)
        return answer

    cluster.ops.read_entries = then_dies  # type: ignore[method-assign,assignment]
    got = [(e.entry_id, e.payload) async for e in rh.read_iter(0, 39)]
    assert got == [(i, payload(i, 30_000)) for i in range(40)]
    assert cluster.ops.entry_reads == 0  # Whole requests failed over, not entries.
    assert killed and killed[0] in cluster.ops.down


async def test_a_closed_ledger_whose_last_segment_is_empty_reads_to_its_end() -> None:
    cluster = fake_cluster(5, read_batch_entries=3, explicit_lac_interval=0)
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*(lh.append(payload(i)) for i in range(4)))
    cluster.ops.down.add(lh.metadata.ensembles[0][1][1])
    await lh.append(payload(4))  # Ensemble change at entry 4.
    assert [start for start, _ in lh.metadata.ensembles] == [0, 4]
    for bookie_id in lh.metadata.ensembles[1][1]:  # The writer died before entry 4 landed.
        ledger = cluster.bookie(bookie_id).ledgers.get(lh.ledger_id)
        if ledger is not None:
            ledger.entries.pop(4, None)
            ledger.explicit_lac = -1
    cluster.ops.down.clear()
    tail = await cluster.second_client().open_ledger(lh.ledger_id, b"pw", recovery=False)
    start = tail.last_add_confirmed + 1  # The bookies' LAC lags: entries past it are waited for.
    waiting = asyncio.ensure_future(tail.wait_for_entries(tail.last_add_confirmed + 1, 5.0))
    rh = await cluster.second_client().open_ledger(lh.ledger_id, b"pw")
    assert rh.is_closed and rh.last_entry_id == 3
    assert [start for start, _ in rh.metadata.ensembles] == [0, 4]  # The last one is empty.
    assert [e.payload for e in await rh.read(0, 3)] == payloads(4)
    assert [e.payload async for e in rh.read_iter(0, 3)] == payloads(4)
    with pytest.raises(NoSuchEntryError, match="beyond its last entry 3"):
        await rh.read(0, 4)
    with pytest.raises(NoSuchEntryError, match="closed at entry 3"):
        await rh.wait_for_entry(4)
    # The tailing reader (no recovery) finds the close by itself (its polls answered at once by
    # fenced bookies) and gets the entries past its old LAC once each.
    seen = [e.entry_id for e in await waiting]
    while seen and seen[-1] < 3:
        seen += [e.entry_id for e in await tail.wait_for_entries(seen[-1] + 1, 5.0)]
    assert seen == list(range(start, 4))
    with pytest.raises(NoSuchEntryError, match="closed at entry 3"):
        await tail.wait_for_entries(4, 5.0)


async def test_polls_answered_at_once_with_an_older_lac_stall_nothing() -> None:
    # The first entries bookie answers every long poll at once with a LAC far behind the
    # reader's and the records of old entries (a bookie behind, or waking its polls). The
    # others must be asked: the tail got nothing for as long as the ledger grew (its rounds
    # ended with only that bookie asked, and the next asked it again). The reader's LAC never
    # goes back, and it gets each entry once, in order.
    cluster = fake_cluster(3, explicit_lac_interval=0, explicit_lac_on_ack=True)
    lh = await cluster.client.create_ledger(3, 3, 2)
    for i in range(5):
        await lh.append(payload(i))
    rh = await cluster.client.open_ledger(lh.ledger_id, recovery=False)
    genuine = cluster.ops.read_entries
    stale = lh.metadata.ensembles[0][1][0]

    async def lagging(
        bookie_id: str, ledger: int, first: int, last: int, **options: Any
    ) -> EntriesAnswer:
        if bookie_id != stale or options.get("previous_lac") is None:
            return await genuine(bookie_id, ledger, first, last, **options)
        old = await genuine(bookie_id, ledger, 0, 2, max_count=3, max_bytes=1 << 20)
        return EntriesAnswer(1, 3, old.records)

    cluster.ops.read_entries = lagging  # type: ignore[method-assign,assignment]
    seen: list[int] = [e.entry_id for e in await rh.read(0, rh.last_add_confirmed)]
    lacs = [rh.last_add_confirmed]
    for i in range(5, 15):
        await lh.append(payload(i))
        while seen[-1] < i:
            got = await rh.wait_for_entries(seen[-1] + 1, timeout=5.0)
            assert got, "nothing within 5 s"
            assert all(e.payload == payload(e.entry_id) for e in got)
            seen += [e.entry_id for e in got]
            lacs.append(rh.last_add_confirmed)
    assert seen == list(range(15))
    assert lacs == sorted(lacs)


def off_by_one(cluster: FakeCluster, bookie_id: str) -> None:
    """`bookie_id` answers READ_ENTRY of e with its copy of e - 1 (digest-valid, for e - 1)."""
    genuine = cluster.ops.read_entry

    async def shifted(bookie: str, ledger: int, entry_id: int, **options: Any) -> StoredCopy:
        if bookie == bookie_id and entry_id > 0:
            entry_id -= 1
        return await genuine(bookie, ledger, entry_id, **options)

    cluster.ops.read_entry = shifted  # type: ignore[method-assign,assignment]


async def test_a_copy_of_another_entry_is_never_taken_for_the_one_asked() -> None:
    # Single reads (a range answer's hole) and recovery's fencing reads check the entry id a
    # copy carries, not only its digest (which is valid: for the entry it is).
    cluster = fake_cluster(3, explicit_lac_interval=0)
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*(lh.append(payload(i)) for i in range(6)))
    ensemble = lh.metadata.ensembles[0][1]
    rh = await cluster.client.open_ledger(lh.ledger_id, b"pw", recovery=False)
    assert await rh.read_last_acknowledged() == 5
    sticky = ensemble[lh.ledger_id % 3]
    del cluster.bookie(sticky).ledgers[lh.ledger_id].entries[2]  # Read one by one...
    shifted = next(ensemble[i] for i in write_set(2, 3, 3) if ensemble[i] != sticky)
    off_by_one(cluster, shifted)  # ...first from a bookie that answers with entry 1.
    assert [e.payload for e in await rh.read(0, 5)] == payloads(6)
    # Recovery asks for entry 6, which no bookie holds: the shifted one answers with entry 5.
    recovered = await cluster.second_client().open_ledger(lh.ledger_id, b"pw")
    assert recovered.last_entry_id == 5
    assert [e.payload for e in await recovered.read(0, 5)] == payloads(6)


async def test_a_copy_of_another_entry_never_makes_one_acknowledged() -> None:
    # Entry 5 is on one bookie only (never acknowledged, Qa 2); a second bookie answers the
    # read of entry 5 with its copy of entry 4. Counted as a copy of 5, it would make entry 5
    # look acknowledged: it is neither present on Qa bookies nor absent on Qw - Qa + 1.
    cluster = fake_cluster(3, explicit_lac_interval=0)
    lh = await cluster.client.create_ledger(3, 3, 2)
    await asyncio.gather(*(lh.append(payload(i)) for i in range(6)))
    _holder, shifted, lacking = lh.metadata.ensembles[0][1]
    for bookie_id in (shifted, lacking):
        del cluster.bookie(bookie_id).ledgers[lh.ledger_id].entries[5]
    rh = await cluster.client.open_ledger(lh.ledger_id, recovery=False)
    assert await rh.read_last_acknowledged() == 4  # Entry 5: one copy, two bookies say no.
    off_by_one(cluster, shifted)
    with pytest.raises(BookieUnavailableError, match="entry 5 was acknowledged"):
        await rh.read_last_acknowledged()


@pytest.mark.parametrize(("ensemble", "qw"), [(3, 3), (5, 2)])
async def test_entries_read_one_by_one_stay_within_the_read_window(ensemble: int, qw: int) -> None:
    # The bookies asked first lack every entry (a lagging bookie, Qa < Qw): every entry of
    # every piece in the read-ahead window is read one by one, never more than `read_window`
    # at once for the whole read (the window of pieces and the strides of each do not each get
    # `read_window` of their own).
    cluster = fake_cluster(5, read_batch_entries=8, read_window=4, read_ahead_requests=64)
    ledger_id = await closed_ledger(cluster, 200, ensemble, qw)
    rh = await cluster.client.open_ledger(ledger_id)
    bookies = rh.metadata.ensembles[0][1]
    first_asked = {bookies[ledger_id % ensemble]} if ensemble == qw else set(bookies)
    genuine = cluster.ops.read_entries
    reading = most = 0

    async def lacking(
        bookie_id: str, ledger: int, first: int, last: int, **options: Any
    ) -> EntriesAnswer:
        answer = await genuine(bookie_id, ledger, first, last, **options)
        if bookie_id in first_asked:
            return EntriesAnswer(answer.lac, last + 1, b"")  # Looked at all, holds none.
        return answer

    async def counted(*args: Any, **options: Any) -> StoredCopy:
        nonlocal reading, most
        reading += 1
        most = max(most, reading)
        try:
            await asyncio.sleep(0.001)
            return await read_entry(*args, **options)
        finally:
            reading -= 1

    read_entry = cluster.ops.read_entry
    cluster.ops.read_entries = lacking  # type: ignore[method-assign,assignment]
    cluster.ops.read_entry = counted  # type: ignore[method-assign]
    assert [e.payload async for e in rh.read_iter(0, 199)] == payloads(200)
    assert cluster.ops.entry_reads == 200
    assert most <= 4
