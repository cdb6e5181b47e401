"""The memory a shard spends on the answers of reads (READ_ENTRY, READ_RANGE, READ_ENTRIES).

A read request is small and counted as such in flight (`REQUEST_OVERHEAD_BYTES`), but its answer
may hold a whole entry (`server.max_entry_bytes`) or a range (`server.max_read_range_bytes`),
and a client may pipeline `server.max_inflight_per_connection` reads per connection. Stopping
the reading of requests (the write buffer's high-water mark, the shard's memory bound) does not
stop the reads already taken: each answer went into the transport's buffer as it came, so a
client that pipelined thousands of range reads and read nothing made the shard hold thousands
of answers. Here every read reserves its answer's bound before its disk read (after a long
poll's wait, so a waiting poll holds nothing), in two steps, each in arrival order:

1. its connection: the transport is not above its high-water mark and either no other read of
   the connection holds a reservation, or the unsent bytes, what its reads hold and this bound
   fit `server.write_buffer_high_bytes`. A connection's unsent answers thus stay within the
   high-water mark plus one answer's bound, and a client that does not read its socket stalls
   only its own reads (reads of other connections pass it; step 2 is only for those whose
   connection has room);
2. the shard: its request bytes in flight (`inflight_bytes`, which the reservations join) plus
   this bound stay within three quarters of `server.max_memory_bytes` (the mark where
   connections paused for memory resume: reads alone never keep adds paused), or no read holds
   a reservation (so that a bound above that still gets served, one at a time).

The reservation is given back once the answer is handed to the transport (`release`, called
after the flush that writes it), or when the read fails or is cancelled. The bound of an answer
is known before it is read but for its first entry, which a read returns whatever its size: it
is the larger of the payload a read may return past the first entry and `max_entry_bytes`
(adds refuse larger entries), plus `ENTRY_OVERHEAD_BYTES` per entry it may return. Waiting
reads are requests already counted in flight, so their number is bounded by
`max_inflight_per_connection` times `max_connections`; a lost connection's waiting reads are
cancelled (nobody is left to answer) and hold nothing. Adds never come here.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from bkaio.config import ServerConfig

from .interfaces import Peer
from .metrics import ShardMetrics

__all__ = ["ENTRY_OVERHEAD_BYTES", "ReadMemory", "answer_bound"]

# What an answer takes per entry besides its payload: the record head or the encoded fields of
# an entry, and the objects a READ_RANGE answer is built from.
ENTRY_OVERHEAD_BYTES = 256


def answer_bound(limits: ServerConfig, max_bytes: int, max_count: int) -> int:
    """The most memory the answer to a read of at most `max_count` entries and, past the
    first, `max_bytes` of payload can take."""
    return max(max_bytes, limits.max_entry_bytes) + max(max_count, 1) * ENTRY_OVERHEAD_BYTES


@dataclass(slots=True, eq=False)
class _Waiter:
    """A read waiting for its reservation."""

    peer: Peer | None
    bound: int
    task: asyncio.Task[object] | None  # The read's, which releases the reservation.
    future: asyncio.Future[None]
    staged: bool = False  # Its connection had room: it waits for the shard's.


@dataclass(slots=True, eq=False)
class _ConnectionReads:
    """The reads of one connection that wait or hold a reservation."""

    queue: deque[_Waiter] = field(default_factory=deque)  # Waiting for the connection's room.
    staged: set[_Waiter] = field(default_factory=set)  # Waiting for the shard's.
    held: int = 0  # The bounds of its staged reads and of those holding a reservation.


@dataclass(slots=True, frozen=True)
class _Grant:
    peer: Peer | None
    bound: int


class MemoryAccount(Protocol):
    """What `ReadMemory` shares with the request handling: the shard's bytes in flight."""

    inflight_bytes: int


class ReadMemory:
    """The reservations of one shard's read answers. Event loop only."""

    def __init__(
        self,
        account: MemoryAccount,
        limits: ServerConfig,
        metrics: ShardMetrics,
        on_freed: Callable[[], None],
    ) -> None:
        self._account = account
        self._high = limits.write_buffer_high_bytes
        self._budget = limits.max_memory_bytes * 3 // 4
        self._metrics = metrics
        self._on_freed = on_freed  # Bytes went back: connections paused for memory may resume.
        self.reserved_bytes = 0  # The bounds of the reads holding a reservation.
        self.waiting_reads = 0  # Reads waiting for their reservation.
        self._grants: dict[asyncio.Task[object] | None, _Grant] = {}
        self._connections: dict[Peer, _ConnectionReads] = {}
        self._ready: deque[_Waiter] = deque()  # Step 2, in order (cancelled ones skipped).

    @property
    def waiting(self) -> bool:
        """Whether reads wait for the shard's memory."""
        return bool(self._ready)

    @property
    def held(self) -> int:
        """Reservations held (reads between their reservation and their answer's flush)."""
        return len(self._grants)

    async def reserve(self, peer: Peer | None, bound: int) -> None:
        """Wait until the answer of the current task's read, at most `bound` bytes, may be
        prepared for `peer` (None: a caller without a connection, tests), and reserve it;
        `release` (with the task) gives it back."""
        reads = self._connections.get(peer) if peer is not None else None
        if (
            not self._ready
            and (reads is None or not reads.queue)
            and self._connection_has_room(peer, reads, bound)
            and self._fits(bound)
        ):
            if peer is not None:
                if reads is None:
                    reads = self._connections[peer] = _ConnectionReads()
                reads.held += bound
            self._grant(peer, bound, asyncio.current_task())
            return
        loop = asyncio.get_running_loop()
        waiter = _Waiter(peer, bound, asyncio.current_task(), loop.create_future())
        if peer is None:
            waiter.staged = True
            self._ready.append(waiter)
        else:
            if reads is None:
                reads = self._connections[peer] = _ConnectionReads()
            reads.queue.append(waiter)
            self._pump(peer, reads)
            if not waiter.staged:
                self._metrics.limit_hit("write_buffer_high_bytes")
        if waiter.staged and not waiter.future.done():
            self.admit()
            if not waiter.future.done():
                self._metrics.limit_hit("max_memory_bytes")
        self.waiting_reads += 1
        try:
            await waiter.future
        except asyncio.CancelledError:
            self._forget(waiter)
            raise
        finally:
            self.waiting_reads -= 1

    def release(self, task: asyncio.Task[object] | None) -> None:
        """The reservation of `task`'s read goes back (its answer is with the transport, or it
        failed); nothing when it holds none."""
        grant = self._grants.pop(task, None)
        if grant is None:
            return
        self.reserved_bytes -= grant.bound
        self._account.inflight_bytes -= grant.bound
        peer = grant.peer
        if peer is not None:
            reads = self._connections.get(peer)
            if reads is not None:  # None: the connection is gone.
                reads.held -= grant.bound
                self._pump(peer, reads)
        self._on_freed()  # Which admits the reads waiting for the shard (`admit`).

    def connection_writable(self, peer: Peer) -> None:
        """`peer`'s transport drained below its low-water mark: its reads may go on."""
        reads = self._connections.get(peer)
        if reads is not None:
            self._pump(peer, reads)

    def connection_lost(self, peer: Peer) -> None:
        """Cancel `peer`'s waiting reads; the ones holding a reservation give it back when
        they end."""
        reads = self._connections.pop(peer, None)
        if reads is None:
            return
        for waiter in (*reads.queue, *reads.staged):
            waiter.future.cancel()  # Skipped in `_ready` from now on.
        self.admit()

    def admit(self) -> None:
        """Reserve for the reads waiting for the shard's memory, in order, while it has room."""
        ready = self._ready
        while ready:
            waiter = ready[0]
            if waiter.future.done():  # Cancelled.
                ready.popleft()
                continue
            if not self._fits(waiter.bound):
                return
            ready.popleft()
            peer = waiter.peer
            if peer is not None:
                reads = self._connections.get(peer)
                if reads is not None:
                    reads.staged.discard(waiter)
            waiter.future.set_result(None)
            self._grant(peer, waiter.bound, waiter.task)

    # --- internals ---------------------------------------------------------------------------

    def _grant(self, peer: Peer | None, bound: int, task: asyncio.Task[object] | None) -> None:
        held = self._grants.get(task)  # A task reserving twice (a caller of its own) holds both.
        self._grants[task] = _Grant(peer, bound + (held.bound if held is not None else 0))
        self.reserved_bytes += bound
        self._account.inflight_bytes += bound

    def _fits(self, bound: int) -> bool:
        return not self._grants or self._account.inflight_bytes + bound <= self._budget

    def _connection_has_room(
        self, peer: Peer | None, reads: _ConnectionReads | None, bound: int
    ) -> bool:
        if peer is None:
            return True
        if peer.writing_paused():  # False once the connection is gone: nothing waits for it.
            return False
        held = reads.held if reads is not None else 0
        return held == 0 or peer.unsent_bytes() + held + bound <= self._high

    def _pump(self, peer: Peer, reads: _ConnectionReads) -> None:
        """Move `peer`'s waiting reads to the shard's step while the connection has room."""
        queue = reads.queue
        moved = False
        while queue:
            waiter = queue[0]
            if waiter.future.done():  # Cancelled.
                queue.popleft()
                continue
            if not self._connection_has_room(peer, reads, waiter.bound):
                break
            queue.popleft()
            reads.held += waiter.bound
            waiter.staged = True
            reads.staged.add(waiter)
            self._ready.append(waiter)
            moved = True
        if not queue and not reads.held and self._connections.get(peer) is reads:
            del self._connections[peer]
        if moved:
            self.admit()

    def _forget(self, waiter: _Waiter) -> None:
        """`waiter`'s read was cancelled while it waited (or just as its reservation came)."""
        if waiter.future.done() and not waiter.future.cancelled():  # Reserved already.
            self.release(waiter.task)
            return
        peer = waiter.peer
        reads = self._connections.get(peer) if peer is not None else None
        if peer is None or reads is None:
            self.admit()
            return
        if waiter in reads.staged:
            reads.staged.discard(waiter)
            reads.held -= waiter.bound
        self._pump(peer, reads)
        self.admit()
