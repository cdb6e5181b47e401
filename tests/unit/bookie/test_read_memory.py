"""ReadMemory (bkaio/bookie/read_memory.py): reads reserve their answer's bound from the
shard's memory, in order, within three quarters of it (one at a time when a bound is larger);
a connection whose client does not take its answers stalls only its own reads; a cancelled or
lost read holds nothing."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast

from bkaio.bookie.interfaces import Peer
from bkaio.bookie.metrics import ShardMetrics
from bkaio.bookie.read_memory import ReadMemory
from bkaio.config import ServerConfig

MB = 1024 * 1024
LIMITS = ServerConfig(
    max_memory_bytes=8 * MB, max_frame_bytes=MB, max_entry_bytes=MB // 2,
    write_buffer_high_bytes=MB,
)  # fmt: skip


@dataclass
class FakeAccount:
    inflight_bytes: int = 0
    freed: int = 0


@dataclass(eq=False)
class FakePeer:
    """The two things ReadMemory asks of a connection."""

    paused: bool = False
    unsent: int = 0

    def writing_paused(self) -> bool:
        return self.paused

    def unsent_bytes(self) -> int:
        return self.unsent


def memory(account: FakeAccount) -> ReadMemory:
    def freed() -> None:
        account.freed += 1
        if reads.waiting:
            reads.admit()  # What the server's `_resume_after_memory` does.

    reads = ReadMemory(account, LIMITS, ShardMetrics(), freed)
    return reads


class Read:
    """A read task that reserves `bound` for `peer`, then holds it until `finish`."""

    def __init__(self, reads: ReadMemory, peer: FakePeer | None, bound: int) -> None:
        self.reads = reads
        self.reserved = asyncio.Event()
        self.done = asyncio.Event()
        self.task = asyncio.create_task(self._run(peer, bound))

    async def _run(self, peer: FakePeer | None, bound: int) -> None:
        await self.reads.reserve(peer, bound)  # type: ignore[arg-type]
        self.reserved.set()
        await self.done.wait()
        self.reads.release(asyncio.current_task())

    async def finish(self) -> None:
        self.done.set()
        await self.task


async def steps() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_reads_reserve_in_order_within_three_quarters_of_the_budget() -> None:
    account = FakeAccount(inflight_bytes=MB)  # Requests in flight already.
    reads = memory(account)
    first = [Read(reads, None, 2 * MB) for _ in range(2)]  # 1 + 4 <= 6 MiB.
    third = Read(reads, None, 2 * MB)  # 7 > 6: waits ...
    small = Read(reads, None, 1)  # ... and so does a small one behind it (in order).
    await steps()
    assert all(read.reserved.is_set() for read in first)
    assert not third.reserved.is_set() and not small.reserved.is_set()
    assert reads.reserved_bytes == 4 * MB and account.inflight_bytes == 5 * MB
    assert reads.waiting_reads == 2
    await first[0].finish()
    await steps()
    assert third.reserved.is_set() and small.reserved.is_set()
    for read in (first[1], third, small):
        await read.finish()
    assert reads.reserved_bytes == 0 and account.inflight_bytes == MB and not reads.held


async def test_a_bound_above_the_budget_is_served_alone() -> None:
    account = FakeAccount()
    reads = memory(account)
    huge = Read(reads, None, 20 * MB)
    other = Read(reads, None, MB)
    await steps()
    assert huge.reserved.is_set() and not other.reserved.is_set()
    await huge.finish()
    await steps()
    assert other.reserved.is_set()
    await other.finish()
    assert account.inflight_bytes == 0


async def test_a_connection_that_takes_no_answers_stalls_only_its_own_reads() -> None:
    account = FakeAccount()
    reads = memory(account)
    stuck, fine = FakePeer(), FakePeer()
    held = Read(reads, stuck, MB // 2)  # Nothing held yet: goes at once.
    second = Read(reads, stuck, MB // 2 + 1)  # Unsent + held + bound > high: waits.
    await steps()
    assert held.reserved.is_set() and not second.reserved.is_set()
    others = [Read(reads, fine, MB // 4) for _ in range(3)]  # 3/4 MiB fits the high mark.
    await steps()
    assert all(read.reserved.is_set() for read in others)
    stuck.paused = True  # Its answer filled the transport.
    await held.finish()
    await steps()
    assert not second.reserved.is_set()  # Above the high-water mark: nothing more.
    stuck.paused, stuck.unsent = False, MB // 4
    reads.connection_writable(cast(Peer, stuck))  # Drained below the low-water mark.
    await steps()
    assert second.reserved.is_set()
    for read in (second, *others):
        await read.finish()
    assert reads.reserved_bytes == 0 and account.inflight_bytes == 0


async def test_cancelled_and_lost_reads_hold_nothing() -> None:
    account = FakeAccount()
    reads = memory(account)
    peer = FakePeer()
    first = Read(reads, peer, MB)
    queued = [Read(reads, peer, MB) for _ in range(3)]  # Wait for the connection.
    blocked = [Read(reads, None, 5 * MB + 1), Read(reads, None, MB)]  # Wait for the shard.
    await steps()
    assert first.reserved.is_set() and reads.waiting_reads == 5
    queued[0].task.cancel()
    blocked[0].task.cancel()
    await steps()
    assert queued[0].task.cancelled() and blocked[0].task.cancelled()
    assert blocked[1].reserved.is_set()  # The cancelled one ahead of it no longer counts.
    reads.connection_lost(
        cast(Peer, peer)
    )  # Its waiting reads end; the one holding gives back later.
    await steps()
    assert all(read.task.cancelled() for read in queued[1:])
    assert reads.waiting_reads == 0
    # Cancelled just as its reservation came (before it ran again): given back.
    late = Read(reads, None, 5 * MB)  # 2 + 5 > 6: waits.
    await steps()
    assert not late.reserved.is_set()
    reads.release(blocked[1].task)  # Room: `late` gets its reservation ...
    late.task.cancel()  # ... and is cancelled before it runs.
    await steps()
    assert late.task.cancelled() and not late.reserved.is_set()
    await first.finish()
    await blocked[1].finish()
    assert reads.reserved_bytes == 0 and account.inflight_bytes == 0 and not reads.held
