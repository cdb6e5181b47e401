"""Range reads against FakeBookies, for every ensemble shape: the requests they make, fail-over
per entry (missing, corrupt) and per request (dead, stalled bookies, speculation), segment
boundaries, and the read-ahead window's bounds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bkaio.errors import ConfigError, NoSuchEntryError
from bkaio.ledger_client.types import ClientConfig
from tests.unit.ledger_client.cluster import FakeCluster, fake_cluster

SHAPES = [(3, 3), (3, 2), (4, 2), (5, 2), (5, 3)]  # (ensemble, write quorum)


async def closed_ledger(
    cluster: FakeCluster, count: int, ensemble: int = 3, qw: int = 3, size: int = 0
) -> int:
    lh = await cluster.client.create_ledger(ensemble, qw, 2)
    await asyncio.gather(*(lh.append(payload(i, size)) for i in range(count)))
    await lh.close()
    return lh.ledger_id


def payload(index: int, size: int = 0) -> bytes:
    text = f"e{index}".encode()
    return text + bytes(max(0, size - len(text)))


def payloads(count: int, first: int = 0) -> list[bytes]:
    return [payload(i) for i in range(first, first + count)]


async def test_unsticky_long_read_is_a_few_requests_spread_over_the_ensemble() -> None:
    cluster = fake_cluster(3, read_batch_entries=50, sticky_reads=False)
    ledger_id = await closed_ledger(cluster, 120)
    rh = await cluster.client.open_ledger(ledger_id)
    entries = await rh.read(0, 119)
    assert [e.payload for e in entries] == payloads(120)
    assert [e.entry_id for e in entries] == list(range(120))
    assert {e.ledger_id for e in entries} == {ledger_id}
    asked = cluster.ops.range_reads
    assert [(first, got) for _b, first, got in asked] == [(0, 50), (50, 50), (100, 20)]
    assert len({bookie for bookie, _f, _g in asked}) == 3  # One piece per bookie.
    assert cluster.ops.entry_reads == 0


async def test_sticky_reads_ask_one_bookie_chosen_by_the_ledger_id() -> None:
    cluster = fake_cluster(3, read_batch_entries=50)
    ledger_ids = [await closed_ledger(cluster, 120) for _ in range(3)]
    chosen = []
    for ledger_id in ledger_ids:
        cluster.ops.range_reads.clear()
        rh = await cluster.client.open_ledger(ledger_id)
        assert [e.payload for e in await rh.read(0, 119)] == payloads(120)
        assert [e.payload async for e in rh.read_iter(0, 119)] == payloads(120)
        assert [e.payload for e in await rh.read(7, 7)] == payloads(1, first=7)
        sticky = rh.metadata.ensembles[0][1][ledger_id % 3]
        assert {bookie for bookie, _f, _g in cluster.ops.range_reads} == {sticky}
        chosen.append(ledger_id % 3)
    assert len(set(chosen)) == 3  # Consecutive ledgers load different bookies.


async def test_the_sticky_bookie_down_costs_no_entry() -> None:
    cluster = fake_cluster(3, read_batch_entries=10)
    ledger_id = await closed_ledger(cluster, 100)
    rh = await cluster.client.open_ledger(ledger_id)
    bookies = rh.metadata.ensembles[0][1]
    cluster.ops.down.add(bookies[ledger_id % 3])
    assert [e.payload for e in await rh.read(0, 99)] == payloads(100)
    assert [e.payload for e in await rh.read(42, 42)] == payloads(1, first=42)
    assert cluster.ops.entry_reads == 0  # Each request went on to the next bookie.
    assert {bookie for bookie, _f, _g in cluster.ops.range_reads} == {bookies[(ledger_id + 1) % 3]}


@pytest.mark.parametrize(("ensemble", "qw"), SHAPES)
async def test_every_shape_reads_in_ranges_one_stride_per_bookie(ensemble: int, qw: int) -> None:
    cluster = fake_cluster(5, read_batch_entries=10)
    ledger_id = await closed_ledger(cluster, 123, ensemble, qw)
    rh = await cluster.client.open_ledger(ledger_id)
    assert [e.payload for e in await rh.read(0, 122)] == payloads(123)
    assert [e.payload for e in await rh.read(7, 7)] == payloads(1, first=7)
    assert [e.payload for e in await rh.read(3, 60)] == payloads(58, first=3)
    assert cluster.ops.entry_reads == 0
    if ensemble > qw:
        # Stride requests: one per bookie and piece, each bookie serving its own residue.
        first_piece = [r for r in cluster.ops.range_reads[:ensemble]]
        assert sorted(first for _b, first, _g in first_piece) == list(range(ensemble))
        assert len({bookie for bookie, _f, _g in first_piece}) == ensemble


@pytest.mark.parametrize(("ensemble", "qw"), SHAPES)
async def test_a_dead_bookie_costs_no_entry(ensemble: int, qw: int) -> None:
    cluster = fake_cluster(5, read_batch_entries=8)
    ledger_id = await closed_ledger(cluster, 100, ensemble, qw)
    rh = await cluster.client.open_ledger(ledger_id)
    cluster.ops.down.add(rh.metadata.ensembles[0][1][1])
    assert [e.payload for e in await rh.read(0, 99)] == payloads(100)
    assert cluster.ops.entry_reads == 0  # Whole requests failed over, not entries.


@pytest.mark.parametrize(("ensemble", "qw"), SHAPES)
async def test_a_stalled_bookie_is_raced_by_a_speculative_read(ensemble: int, qw: int) -> None:
    cluster = fake_cluster(
        5, read_batch_entries=8, speculative_read_timeout=0.01, read_timeout=60.0
    )
    ledger_id = await closed_ledger(cluster, 60, ensemble, qw)
    rh = await cluster.client.open_ledger(ledger_id)
    cluster.ops.stalled_reads.add(rh.metadata.ensembles[0][1][0])  # Never answers.
    async with asyncio.timeout(60):  # Without speculation the reads would wait for ever.
        assert [e.payload for e in await rh.read(0, 59)] == payloads(60)
        assert [e.payload async for e in rh.read_iter(0, 59)] == payloads(60)


@pytest.mark.parametrize(("ensemble", "qw"), SHAPES)
async def test_a_corrupt_copy_is_read_from_another_replica(ensemble: int, qw: int) -> None:
    cluster = fake_cluster(5, read_batch_entries=100)
    ledger_id = await closed_ledger(cluster, 40, ensemble, qw)
    rh = await cluster.client.open_ledger(ledger_id)
    bookies = rh.metadata.ensembles[0][1]
    # The bookie asked for entry 5: the sticky one (E = Qw), else the first of its write set.
    primary = bookies[ledger_id % ensemble if ensemble == qw else 5 % ensemble]
    cluster.bookie(primary).corrupt(ledger_id, 5)
    assert [e.payload for e in await rh.read(0, 39)] == payloads(40)
    assert cluster.ops.entry_reads == 1  # Entry 5 alone, from another replica.


async def test_a_bookie_missing_entries_has_only_those_read_elsewhere() -> None:
    cluster = fake_cluster(3, read_batch_entries=100)
    ledger_id = await closed_ledger(cluster, 30)
    rh = await cluster.client.open_ledger(ledger_id)
    first_bookie = rh.metadata.ensembles[0][1][ledger_id % 3]  # The sticky bookie.
    del cluster.bookie(first_bookie).ledgers[ledger_id].entries[10]  # Qa=2: it may lag.
    assert [e.payload for e in await rh.read(0, 29)] == payloads(30)
    assert cluster.ops.range_reads == [(first_bookie, 0, 29)]
    assert cluster.ops.entry_reads == 1


@pytest.mark.parametrize(("ensemble", "qw"), [(3, 3), (5, 2)])
async def test_an_entry_no_replica_holds_is_absent(ensemble: int, qw: int) -> None:
    cluster = fake_cluster(5, read_batch_entries=100)
    ledger_id = await closed_ledger(cluster, 10, ensemble, qw)
    rh = await cluster.client.open_ledger(ledger_id)
    for bookie_id in rh.metadata.ensembles[0][1]:
        cluster.bookie(bookie_id).ledgers[ledger_id].entries.pop(7, None)
    with pytest.raises(NoSuchEntryError, match="entry 7 is absent"):
        await rh.read(0, 9)
    seen = []
    with pytest.raises(NoSuchEntryError, match="entry 7 is absent"):
        async for entry in rh.read_iter(0, 9):
            seen.append(entry.entry_id)
    assert seen == []  # Entries 0..9 are one piece: it fails as a whole.


async def test_all_replicas_down_is_unavailable_not_absent() -> None:
    cluster = fake_cluster(5, read_batch_entries=100)
    ledger_id = await closed_ledger(cluster, 10, 5, 2)
    rh = await cluster.client.open_ledger(ledger_id)
    bookies = rh.metadata.ensembles[0][1]
    cluster.ops.down.update(bookies[3:5])  # Entry 3 is on 3 and 4 only.
    with pytest.raises(Exception, match="entry 3: too few bookies answered"):
        await rh.read(0, 9)
    assert [e.payload for e in await rh.read(0, 2)] == payloads(3)


async def test_a_piece_never_crosses_an_ensemble_change() -> None:
    cluster = fake_cluster(4, read_batch_entries=100)
    lh = await cluster.client.create_ledger(3, 3, 2)
    for i in range(5):
        await lh.append(payload(i))
    cluster.ops.down.add(lh.metadata.ensembles[0][1][1])  # The next add changes the ensemble.
    for i in range(5, 10):
        await lh.append(payload(i))
    cluster.ops.down.clear()
    await lh.close()
    assert len(lh.metadata.ensembles) == 2
    second_start = lh.metadata.ensembles[1][0]
    rh = await cluster.client.open_ledger(lh.ledger_id)
    assert [e.payload for e in await rh.read(0, 9)] == payloads(10)
    starts = [first for _b, first, _got in cluster.ops.range_reads]
    assert starts == [0, second_start]


async def test_read_iter_streams_in_order() -> None:
    cluster = fake_cluster(3, read_batch_entries=7)
    ledger_id = await closed_ledger(cluster, 40)
    rh = await cluster.client.open_ledger(ledger_id)
    seen = [entry.payload async for entry in rh.read_iter(3, 39)]
    assert seen == payloads(37, first=3)
    batches = [batch async for batch in rh.read_batches(3, 39)]
    assert [len(b) for b in batches] == [7, 7, 7, 7, 7, 2]


@pytest.mark.parametrize(("ensemble", "qw"), [(3, 3), (5, 2)])
async def test_read_ahead_stays_within_its_bytes_under_a_slow_consumer(
    ensemble: int, qw: int
) -> None:
    size = 10_000
    bound = 1_500_000
    cluster = fake_cluster(
        5, read_batch_entries=10, read_ahead_bytes=bound, read_ahead_requests=64
    )  # Requests are no limit here: the whole ledger is 30 or 6 pieces.
    ledger_id = await closed_ledger(cluster, 300, ensemble, qw, size=size)
    rh = await cluster.client.open_ledger(ledger_id)
    consumed = 0
    most_ahead = 0
    piece_bytes = 10 * size * (1 if ensemble == qw else ensemble)
    async for batch in rh.read_batches(0, 299):
        assert len(batch) * size == piece_bytes
        await asyncio.sleep(0.005)  # A slow consumer: every piece of the window arrives.
        # Fetched and not handed out (beyond the batch the consumer holds): within the bound.
        ahead = sum(cluster.ops.range_bytes) - consumed - piece_bytes
        assert ahead <= bound
        most_ahead = max(most_ahead, ahead)
        consumed += piece_bytes
    assert consumed == 300 * size
    assert most_ahead >= piece_bytes  # It did read ahead.


async def settle(cluster: FakeCluster) -> None:
    """Wait until the fake bookies get no more range requests: they answer without a timer, so
    50 turns of the loop without one means every request the read-ahead lets go has run."""
    quiet, seen = 0, -1
    while quiet < 50:
        await asyncio.sleep(0)
        quiet = quiet + 1 if len(cluster.ops.range_reads) == seen else 0
        seen = len(cluster.ops.range_reads)


@pytest.mark.parametrize(("ensemble", "qw"), [(3, 3), (5, 2)])
async def test_read_ahead_of_large_entries_stays_within_its_bytes(ensemble: int, qw: int) -> None:
    # Entries of 16 KiB, requests of 64 KiB (read_batch_bytes below the 64 KiB floor): each
    # request brings 4 entries, so a stream of 40 entries takes 10 requests. The read-ahead
    # counted only a piece's first requests (64 KiB a stream), so a window of such pieces held
    # ten times more than read_ahead_bytes. Now each further request waits for room, except
    # those of the next batch (the head of the window): the consumer cannot go on without it.
    size = 16 * 1024
    bound = 1024 * 1024
    cluster = fake_cluster(
        5,
        read_batch_entries=40,
        read_batch_bytes=16 * 1024,
        read_ahead_bytes=bound,
        read_ahead_requests=64,
    )
    count = 1000  # 25 pieces of 640 KiB (E = Qw), or 5 of 3.2 MiB (5 streams).
    ledger_id = await closed_ledger(cluster, count, ensemble, qw, size=size)
    rh = await cluster.client.open_ledger(ledger_id)
    consumed = 0
    most_ahead = 0
    async for batch in rh.read_batches(0, count - 1):
        piece_bytes = len(batch) * size
        await settle(cluster)  # A slow consumer: whatever the window lets in arrives.
        # Fetched and not handed out, beyond the batch the consumer holds: the next batch
        # (whole, as a piece always completes) and at most read_ahead_bytes more.
        ahead = sum(cluster.ops.range_bytes) - consumed - piece_bytes
        most_ahead = max(most_ahead, ahead)
        assert ahead <= bound + piece_bytes, (ahead, bound, piece_bytes)
        consumed += piece_bytes
    assert consumed == count * size
    assert max(cluster.ops.range_bytes) <= 64 * 1024  # Every answer within its max_bytes.
    assert most_ahead > piece_bytes  # It did read ahead beyond the next batch.


async def test_read_ahead_keeps_a_window_of_requests() -> None:
    cluster = fake_cluster(3, read_batch_entries=10, read_ahead_requests=4)
    ledger_id = await closed_ledger(cluster, 200)
    rh = await cluster.client.open_ledger(ledger_id)
    batches = rh.read_batches(0, 199)
    first = await anext(batches)
    assert len(first) == 10
    await asyncio.sleep(0.01)  # The window fills while the consumer holds its batch.
    assert len(cluster.ops.range_reads) == 4  # The one handed out and three ahead.
    await batches.aclose()


async def test_a_paced_read_asks_for_its_pieces_no_faster_than_its_rate() -> None:
    # 100 entries a second, pieces of 10: a piece every 0.1 s at the earliest (a lower bound,
    # whatever the machine's speed), though the window would take 16 at once.
    cluster = fake_cluster(3, read_batch_entries=10, read_ahead_entries_per_second=100.0)
    ledger_id = await closed_ledger(cluster, 40)
    rh = await cluster.client.open_ledger(ledger_id)
    loop = asyncio.get_running_loop()
    asked: list[tuple[float, int]] = []
    unpaced = cluster.ops.read_entries

    async def timed(bookie_id: str, ledger: int, first: int, *rest: Any, **options: Any) -> Any:
        asked.append((loop.time(), first))
        return await unpaced(bookie_id, ledger, first, *rest, **options)

    cluster.ops.read_entries = timed  # type: ignore[method-assign,assignment]
    # From the read's start: a request is recorded when its task first runs, which on a busy
    # machine can be later for the first than for the next, so the gap between two recorded
    # requests may fall short of the pace while the pace itself holds.
    start = loop.time()
    assert [e.payload async for e in rh.read_iter(0, 39)] == payloads(40)
    assert [first for _at, first in asked] == [0, 10, 20, 30]
    for index, (at, _first) in enumerate(asked):
        assert at - start >= index * 0.1 - 0.001  # The loop's timers may fire 1 ms early.


async def test_a_paced_read_that_was_held_up_does_not_burst_to_catch_up() -> None:
    # 100 entries a second, pieces of 10. The consumer holds the first batch for 0.5 s: the
    # pace then counts from when it resumes (less the 20 ms slack), so the pieces after the
    # pause still go 0.1 s apart (a pace counted from the start would let five go at once,
    # the window allowing). Measured from the resumption, as a recorded request may start late.
    cluster = fake_cluster(3, read_batch_entries=10, read_ahead_entries_per_second=100.0)
    ledger_id = await closed_ledger(cluster, 100)
    rh = await cluster.client.open_ledger(ledger_id)
    loop = asyncio.get_running_loop()
    asked: list[float] = []
    unpaced = cluster.ops.read_entries

    async def timed(bookie_id: str, ledger: int, first: int, *rest: Any, **options: Any) -> Any:
        asked.append(loop.time())
        return await unpaced(bookie_id, ledger, first, *rest, **options)

    cluster.ops.read_entries = timed  # type: ignore[method-assign,assignment]
    batches = rh.read_batches(0, 99)
    received = len(await anext(batches))
    await asyncio.sleep(0.5)
    resumed_at, resumed = loop.time(), len(asked)
    received += sum([len(batch) async for batch in batches])
    assert received == 100 and len(asked) == 10
    for index, at in enumerate(asked[resumed:]):
        assert at - resumed_at >= index * 0.1 - 0.02 - 0.001  # Slack; timers 1 ms early.


def test_read_options_are_checked() -> None:
    for name in (
        "read_batch_entries",
        "read_batch_bytes",
        "read_ahead_requests",
        "read_ahead_bytes",
        "read_window",
    ):
        with pytest.raises(ConfigError, match=name):
            ClientConfig(**{name: 0})  # type: ignore[arg-type]
    for pace in (0.0, -5.0, float("nan")):
        with pytest.raises(ConfigError, match="read_ahead_entries_per_second"):
            ClientConfig(read_ahead_entries_per_second=pace)
