"""A ledger handle's batch path: one loop iteration's appends leave as one batch per bookie.

The fake bookies' `add_entries` (the wire pool's batch call) records each batch and applies its
adds one by one through the fake `add_entry`, so storage semantics and fault knobs stay those of
the fakes. A bookie in `refuse_batches` answers False, as the pool does for a connection that
takes no ADD_ENTRIES frames; the handle must then send those adds one by one.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from bkaio.ledger_client.add_batching import _frames_of
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.ledger_client.connections import BookiePool
from bkaio.ledger_client.types import ClientConfig
from bkaio.protocol.encoder import ADD_ENTRIES_BATCH_BYTES
from tests.unit.ledger_client.fakes import FakeBookie, FakeBookieOps, FakeLedgerStore

PASSWORD = b"batch-password"


def _client(bookies: int = 3) -> tuple[BookKeeper, FakeBookieOps]:
    ids = [f"127.0.0.1:{3181 + 10 * i}" for i in range(bookies)]
    ops = FakeBookieOps([FakeBookie(bookie_id) for bookie_id in ids])
    # No batching wait: these tests look at what one loop iteration sends (test_batch_wait.py
    # has the wait).
    config = ClientConfig(add_timeout=0.5, read_timeout=0.5, add_batch_wait_us=0)
    client = BookKeeper(ledgers=FakeLedgerStore(), ops=ops, config=config, rng=random.Random(1))
    client.set_bookies([ops.info(bookie_id) for bookie_id in ids])
    return client, ops


async def test_appends_of_one_iteration_leave_as_one_batch_per_bookie() -> None:
    """50 appends in one go: each bookie gets one batch of all 50, in entry order."""
    client, ops = _client()
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    futures = [handle.append(b"entry %d" % i) for i in range(50)]
    assert await asyncio.gather(*futures) == list(range(50))
    assert sorted(bookie for bookie, _, _ in ops.batches) == sorted(handle.metadata.ensembles[0][1])
    for _, entry_ids, frame_sizes in ops.batches:
        assert entry_ids == list(range(50)) and frame_sizes == [50]
    for bookie in ops.bookies.values():
        stored = bookie.ledgers[handle.ledger_id].entries
        assert [stored[i].payload for i in range(50)] == [b"entry %d" % i for i in range(50)]
    await handle.close()
    assert handle.last_add_confirmed == 49


async def test_a_bookie_that_takes_no_batches_gets_the_adds_one_by_one() -> None:
    """`add_entries` False for one bookie: its adds go through `add_entry`; all resolve."""
    client, ops = _client()
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    plain = handle.metadata.ensembles[0][1][1]
    ops.refuse_batches.add(plain)
    assert await asyncio.gather(*(handle.append(b"x%d" % i) for i in range(20))) == list(range(20))
    assert plain not in {bookie for bookie, _, _ in ops.batches}
    assert len(ops.batches) == 2
    assert ops.add_count[plain] == 20
    assert sorted(ops.bookies[plain].ledgers[handle.ledger_id].entries) == list(range(20))
    await handle.close()


async def test_appends_of_later_iterations_make_later_batches() -> None:
    """Each loop iteration's appends are a batch of their own; ids continue across them."""
    client, ops = _client()
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    first = [handle.append(b"a") for _ in range(3)]
    await asyncio.sleep(0)
    second = [handle.append(b"b") for _ in range(4)]
    assert await asyncio.gather(*first, *second) == list(range(7))
    per_bookie: dict[str, list[list[int]]] = {}
    for bookie, entry_ids, _ in ops.batches:
        per_bookie.setdefault(bookie, []).append(entry_ids)
    assert all(batches == [[0, 1, 2], [3, 4, 5, 6]] for batches in per_bookie.values())
    await handle.close()


async def test_large_entries_are_cut_into_frames_within_the_batch_bytes() -> None:
    """Five 30 KiB entries: frames of two, two and one (each within 64 KiB)."""
    client, ops = _client()
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    payload = bytes(30 * 1024)
    assert await asyncio.gather(*(handle.append(payload) for _ in range(5))) == list(range(5))
    assert {tuple(sizes) for _, _, sizes in ops.batches} == {(2, 2, 1)}
    await handle.close()


async def test_a_striped_ledger_does_not_use_batches() -> None:
    """E > Qw: each add goes to its own write set, one by one."""
    client, ops = _client(4)
    handle = await client.create_ledger(4, 2, 2, password=PASSWORD)
    assert await asyncio.gather(*(handle.append(b"s") for _ in range(8))) == list(range(8))
    assert ops.batches == []
    assert sum(ops.add_count.values()) == 16
    await handle.close()


async def test_a_bookie_down_gets_its_batch_refused_and_is_replaced() -> None:
    """A failed batch add swaps the bookie out like a failed single add; appends resolve."""
    client, ops = _client(4)
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    victim = handle.metadata.ensembles[0][1][0]
    ops.down.add(victim)
    assert await asyncio.gather(*(handle.append(b"d") for _ in range(10))) == list(range(10))
    await handle.close()
    assert victim not in handle.metadata.ensembles[-1][1]


def test_frames_of_keeps_every_entry_once_in_order() -> None:
    """The frames cover the packed entries exactly, each within the batch bytes or alone."""
    packed = [bytes(size) for size in (100, 70_000, 10, 40_000, 30_000, 5)]
    frames = _frames_of(packed)
    assert [part for _, _, parts, _ in frames for part in parts] == packed
    assert [(start, end) for start, end, _, _ in frames] == [(0, 1), (1, 2), (2, 4), (4, 6)]
    for start, end, parts, size in frames:
        assert size == sum(map(len, parts))
        assert size <= ADD_ENTRIES_BATCH_BYTES or end - start == 1


async def test_the_pool_runs_deferred_sends_once_each_in_order_at_the_iterations_end() -> None:
    """`BookiePool.defer_send`: every send deferred in one iteration runs once, in order, in
    one later callback; one that raises does not keep the others from running."""
    pool = BookiePool(ClientConfig(), lambda bookie_id: None)
    ran: list[str] = []

    def failing() -> None:
        ran.append("failing")
        raise RuntimeError("a handle's bug")

    pool.defer_send(lambda: ran.append("first"))
    pool.defer_send(failing)
    pool.defer_send(lambda: ran.append("third"))
    assert ran == []
    await asyncio.sleep(0)
    assert ran == ["first", "failing", "third"]
    await asyncio.sleep(0)
    assert ran == ["first", "failing", "third"]
    pool.defer_send(lambda: ran.append("next"))
    await asyncio.sleep(0)
    assert ran[-1] == "next"


class FakeSlowBookieOps(FakeBookieOps):
    """FakeBookieOps whose `when_writable` reports the bookies in `unwritable` as not taking
    writes, as the pool does for a connection whose transport paused writing."""

    def __init__(self, bookies: list[FakeBookie]) -> None:
        super().__init__(bookies)
        self.unwritable: set[str] = set()
        self.writable_callbacks: dict[str, list[Callable[[], None]]] = {}

    def when_writable(self, bookie_id: str, ledger_id: int, callback: Callable[[], None]) -> bool:
        if bookie_id not in self.unwritable:
            return False
        self.writable_callbacks.setdefault(bookie_id, []).append(callback)
        return True

    def make_writable(self, bookie_id: str) -> None:
        self.unwritable.discard(bookie_id)
        for callback in self.writable_callbacks.pop(bookie_id, []):
            callback()


def _slow_client() -> tuple[BookKeeper, FakeSlowBookieOps]:
    ids = [f"127.0.0.1:{3181 + 10 * i}" for i in range(3)]
    ops = FakeSlowBookieOps([FakeBookie(bookie_id) for bookie_id in ids])
    # No batching wait: these tests look at what one loop iteration sends (test_batch_wait.py
    # has the wait).
    config = ClientConfig(add_timeout=0.5, read_timeout=0.5, add_batch_wait_us=0)
    client = BookKeeper(ledgers=FakeLedgerStore(), ops=ops, config=config, rng=random.Random(1))
    client.set_bookies([ops.info(bookie_id) for bookie_id in ids])
    return client, ops


async def test_appends_wait_while_a_bookie_takes_no_writes_and_go_on_when_it_does() -> None:
    """A write-set bookie whose connection paused: the batch already made is sent, later
    appends are held (not sent to anyone) until it takes writes again; none is lost."""
    client, ops = _slow_client()
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    slow = handle.metadata.ensembles[0][1][2]
    ops.unwritable.add(slow)
    first = [handle.append(b"first %d" % i) for i in range(5)]
    assert await asyncio.gather(*first) == list(range(5))
    later = [handle.append(b"later %d" % i) for i in range(5)]
    await asyncio.sleep(0.05)
    assert not any(future.done() for future in later)
    assert sum(len(entry_ids) for _, entry_ids, _ in ops.batches) == 15  # Only the first 5.
    ops.make_writable(slow)
    assert await asyncio.gather(*later) == list(range(5, 10))
    stored = ops.bookies[slow].ledgers[handle.ledger_id].entries
    assert sorted(stored) == list(range(10))
    await handle.close()


async def test_a_held_back_ledger_goes_on_once_the_slow_bookie_counts_as_failed() -> None:
    """The slow bookie never takes writes again but its adds fail: appends are released and
    complete on the others (no spare bookie to replace it: Qa = 2 of the 2 left)."""
    client, ops = _slow_client()
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    slow = handle.metadata.ensembles[0][1][0]
    ops.unwritable.add(slow)
    ops.hung.add(slow)  # Its adds time out (0.2 s in the fakes).
    first = [handle.append(b"a") for _ in range(3)]
    assert await asyncio.gather(*first) == [0, 1, 2]
    later = [handle.append(b"b") for _ in range(3)]
    assert await asyncio.wait_for(asyncio.gather(*later), 5) == [3, 4, 5]
    await handle.close()
