"""Reads through READ_RANGE (ensemble == write quorum) against FakeBookies: batching, hand-over
between bookies, corrupt and missing copies, segment boundaries, and the per-entry fallback."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.errors import ConfigError, NoSuchEntryError
from bkaio.ledger_client.types import ClientConfig
from tests.unit.ledger_client.cluster import FakeCluster, fake_cluster


async def closed_ledger(cluster: FakeCluster, count: int, ensemble: int = 3, qw: int = 3) -> int:
    lh = await cluster.client.create_ledger(ensemble, qw, 2)
    await asyncio.gather(*(lh.append(f"e{i}".encode()) for i in range(count)))
    await lh.close()
    return lh.ledger_id


def payloads(count: int, first: int = 0) -> list[bytes]:
    return [f"e{i}".encode() for i in range(first, first + count)]


async def test_a_long_read_is_a_few_range_requests_not_one_read_per_entry() -> None:
    cluster = fake_cluster(3, read_batch_entries=50)
    ledger_id = await closed_ledger(cluster, 120)
    rh = await cluster.client.open_ledger(ledger_id)
    entries = await rh.read(0, 119)
    assert [e.payload for e in entries] == payloads(120)
    assert [e.entry_id for e in entries] == list(range(120))
    assert [(first, got) for _b, first, got in cluster.ops.range_reads] == [
        (0, 50),
        (50, 50),
        (100, 20),
    ]
    assert cluster.ops.entry_reads == 0


async def test_a_bookie_missing_entries_hands_over_to_the_next_one() -> None:
    cluster = fake_cluster(3, read_batch_entries=100)
    ledger_id = await closed_ledger(cluster, 30)
    rh = await cluster.client.open_ledger(ledger_id)
    first_bookie = rh.metadata.ensembles[0][1][0]  # Write set of entry 0 starts here.
    del cluster.bookie(first_bookie).ledgers[ledger_id].entries[10]  # Qa=2: it may lag.
    assert [e.payload for e in await rh.read(0, 29)] == payloads(30)
    asked = [(bookie, first, got) for bookie, first, got in cluster.ops.range_reads]
    assert asked[0] == (first_bookie, 0, 10)
    assert asked[1][1:] == (10, 20) and asked[1][0] != first_bookie
    assert cluster.ops.entry_reads == 0


async def test_a_corrupt_copy_in_a_range_is_read_from_another_bookie() -> None:
    cluster = fake_cluster(3, read_batch_entries=100)
    ledger_id = await closed_ledger(cluster, 20)
    rh = await cluster.client.open_ledger(ledger_id)
    first_bookie = rh.metadata.ensembles[0][1][0]
    cluster.bookie(first_bookie).corrupt(ledger_id, 5)
    assert [e.payload for e in await rh.read(0, 19)] == payloads(20)
    assert cluster.ops.range_reads[0] == (first_bookie, 0, 20)  # Got 20; kept the 5 before.
    assert cluster.ops.range_reads[1][1] == 5


async def test_down_bookies_fall_back_to_entry_reads_with_the_usual_errors() -> None:
    cluster = fake_cluster(3, read_batch_entries=100)
    ledger_id = await closed_ledger(cluster, 10)
    rh = await cluster.client.open_ledger(ledger_id)
    ensemble = rh.metadata.ensembles[0][1]
    cluster.ops.down.update(ensemble[:2])
    assert [e.payload for e in await rh.read(0, 9)] == payloads(10)  # The third has all.
    for bookie_id in ensemble:  # Nobody has entry 7: absent by the quorum rule.
        cluster.bookie(bookie_id).ledgers[ledger_id].entries.pop(7)
    cluster.ops.down.clear()
    with pytest.raises(NoSuchEntryError, match="entry 7 is absent"):
        await rh.read(0, 9)


async def test_striped_ledgers_read_entry_by_entry() -> None:
    cluster = fake_cluster(4, read_batch_entries=100)
    ledger_id = await closed_ledger(cluster, 12, ensemble=4, qw=2)
    rh = await cluster.client.open_ledger(ledger_id)
    assert [e.payload for e in await rh.read(0, 11)] == payloads(12)
    assert cluster.ops.range_reads == []
    assert cluster.ops.entry_reads == 12


async def test_a_batch_never_crosses_an_ensemble_change() -> None:
    cluster = fake_cluster(4, read_batch_entries=100)
    lh = await cluster.client.create_ledger(3, 3, 2)
    for i in range(5):
        await lh.append(f"e{i}".encode())
    cluster.ops.down.add(lh.metadata.ensembles[0][1][1])  # The next add changes the ensemble.
    for i in range(5, 10):
        await lh.append(f"e{i}".encode())
    cluster.ops.down.clear()
    await lh.close()
    assert len(lh.metadata.ensembles) == 2
    second_start = lh.metadata.ensembles[1][0]
    rh = await cluster.client.open_ledger(lh.ledger_id)
    assert [e.payload for e in await rh.read(0, 9)] == payloads(10)
    starts = [first for _b, first, _got in cluster.ops.range_reads]
    assert starts == [0, second_start]


async def test_read_iter_streams_batches_in_order() -> None:
    cluster = fake_cluster(3, read_batch_entries=7, read_window=10)
    ledger_id = await closed_ledger(cluster, 40)
    rh = await cluster.client.open_ledger(ledger_id)
    seen = [entry.payload async for entry in rh.read_iter(3, 39)]
    assert seen == payloads(37, first=3)


def test_batch_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="read_batch_entries"):
        ClientConfig(read_batch_entries=0)
    with pytest.raises(ConfigError, match="read_batch_bytes"):
        ClientConfig(read_batch_bytes=0)
