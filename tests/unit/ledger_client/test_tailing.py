"""Tailing against FakeBookies: long polls answer with the entries (no second round trip), for
every ensemble shape, around a dead bookie; the writer's LAC pushed on acknowledgement."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bkaio.errors import NoSuchEntryError
from bkaio.ledger_client import LedgerHandle
from bkaio.ledger_client.types import EntriesAnswer
from tests.unit.ledger_client.cluster import FakeCluster, fake_cluster

SHAPES = [(3, 3), (3, 2), (5, 2)]


async def writer(cluster: FakeCluster, ensemble: int, qw: int) -> LedgerHandle:
    return await cluster.client.create_ledger(ensemble, qw, 2)


async def append_confirmed(lh: LedgerHandle, payloads: list[bytes]) -> None:
    """Append, then make the last one confirmed on the bookies (the next add would)."""
    await asyncio.gather(*(lh.append(p) for p in payloads))


@pytest.mark.parametrize(("ensemble", "qw"), SHAPES)
async def test_a_poll_brings_the_entries_themselves(ensemble: int, qw: int) -> None:
    cluster = fake_cluster(5, explicit_lac_interval=0, explicit_lac_on_ack=True)
    lh = await writer(cluster, ensemble, qw)
    rh = await cluster.client.open_ledger(lh.ledger_id, recovery=False)
    poll = asyncio.ensure_future(rh.wait_for_entries(0, timeout=5.0))
    await asyncio.sleep(0.02)
    assert not poll.done()
    await append_confirmed(lh, [b"a", b"b", b"c"])
    got = await poll
    while len(got) < 3:  # The acks may come in more than one burst.
        got += await rh.wait_for_entries(len(got), timeout=5.0)
    assert [(e.entry_id, e.payload) for e in got] == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert cluster.ops.entry_reads == 0  # No read after the polls: they carried the entries.
    await lh.close()
    with pytest.raises(NoSuchEntryError, match="closed at entry 2"):
        await rh.wait_for_entries(3, timeout=5.0)


async def test_entries_a_poll_brought_serve_the_next_calls() -> None:
    cluster = fake_cluster(3, explicit_lac_interval=0, explicit_lac_on_ack=True)
    lh = await writer(cluster, 3, 3)
    await append_confirmed(lh, [b"%d" % i for i in range(10)])
    rh = await cluster.client.open_ledger(lh.ledger_id, recovery=False)
    rh_lac = rh.last_add_confirmed
    polls_before = len(cluster.ops.range_reads)
    first = await rh.wait_for_entry(rh_lac + 1, timeout=0.05)  # Nothing confirmed past it.
    assert first is None
    await lh.append(b"10")
    entries = [await rh.wait_for_entry(i, timeout=5.0) for i in range(rh_lac + 1, 11)]
    assert [e.payload for e in entries if e is not None] == [
        b"%d" % i for i in range(rh_lac + 1, 11)
    ]
    # One poll round (three bookies asked) brought them all.
    assert len(cluster.ops.range_reads) - polls_before <= 3 * 2


@pytest.mark.parametrize(("ensemble", "qw"), SHAPES)
async def test_tailing_goes_on_with_a_bookie_down(ensemble: int, qw: int) -> None:
    # One spare bookie: the writer replaces the dead one, the reader finds out by itself.
    cluster = fake_cluster(ensemble + 1, explicit_lac_interval=0, explicit_lac_on_ack=True)
    lh = await writer(cluster, ensemble, qw)
    rh = await cluster.client.open_ledger(lh.ledger_id, recovery=False)
    cluster.ops.down.add(lh.metadata.ensembles[0][1][0])  # The first entries bookie too.
    seen: list[bytes] = []
    for round_ in range(3):
        payloads = [b"r%d-%d" % (round_, i) for i in range(4)]
        await asyncio.gather(*(lh.append(p) for p in payloads))
        while len(seen) < 4 * (round_ + 1):
            got = await rh.wait_for_entries(len(seen), timeout=5.0)
            assert got, "nothing within 5 s"
            seen += [e.payload for e in got]
    assert seen == [b"r%d-%d" % (r, i) for r in range(3) for i in range(4)]


@pytest.mark.parametrize("on_ack", [True, False])
async def test_the_writer_pushes_its_lac_on_acknowledgement(on_ack: bool) -> None:
    cluster = fake_cluster(3, explicit_lac_interval=0, explicit_lac_on_ack=on_ack)
    lh = await writer(cluster, 3, 3)
    rh = await cluster.client.open_ledger(lh.ledger_id, recovery=False)
    await lh.append(b"alone")  # No later add will piggyback its LAC.
    entry = await rh.wait_for_entry(0, timeout=0.3)
    assert (entry is not None) == on_ack
    if on_ack:
        assert entry is not None and entry.payload == b"alone"


async def test_the_next_poll_waits_at_the_bookies_while_the_consumer_works() -> None:
    cluster = fake_cluster(3, explicit_lac_interval=0, explicit_lac_on_ack=True)
    lh = await writer(cluster, 3, 3)
    rh = await cluster.client.open_ledger(lh.ledger_id, recovery=False)
    polls: list[int] = []  # previous_lac of every long poll, in the order they were sent.
    read_entries = cluster.ops.read_entries

    async def recording(*args: Any, **kwargs: Any) -> EntriesAnswer:
        if kwargs.get("previous_lac") is not None:
            polls.append(kwargs["previous_lac"])
        return await read_entries(*args, **kwargs)

    cluster.ops.read_entries = recording  # type: ignore[method-assign]
    poll = asyncio.ensure_future(rh.wait_for_entries(0, timeout=5.0))
    await asyncio.sleep(0.01)
    await asyncio.gather(*(lh.append(b"%d" % i) for i in range(3)))
    got = await poll
    lac = got[-1].entry_id
    assert polls[-1] == lac  # Sent before the consumer asked for entry lac + 1.
    await lh.append(b"next")
    assert [e.payload for e in await rh.wait_for_entries(lac + 1, timeout=5.0)][-1] == b"next"
    await rh.close()  # Cancels the poll it sent ahead again.
    await asyncio.sleep(0.01)
