"""The bookie's READ_ENTRIES handler: range and stride reads, and long polls that answer with
the entries (docs/protocol.md "Range reads").

The entries come from storage as entry records (`ShardStorage.read_records`): runs read from
the entry logs with one `pread` each and sent as they are, cached entries packed; the answer
is framed around those buffers without copying them (`FrameEncoder.add_read_entries`). The
count and byte limits are the smaller of the request's and the bookie's
(`server.max_read_range_count` / `max_read_range_bytes`), so one request holds the shard's loop
and the reader pool for a bounded time. A long poll waits like READ_LAC's (`wait_for_lac`),
then reads only up to the LAC it answers with, including entries of it still being journaled
here (the LAC says an ack quorum holds them durably; BookKeeper's bookie serves them from its
write cache): the answer never waits for this bookie's own sync. The answer's memory is
reserved after that wait and before the read (bkaio/bookie/read_memory.py): a waiting poll
holds none.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Hashable
from typing import Protocol

from bkaio.config import ServerConfig
from bkaio.entrylog.api import LedgerStorage
from bkaio.errors import NoSuchLedgerError, TooManyRequestsError
from bkaio.protocol import I64_MAX, ReadEntriesRequest, ReadEntriesResponse, Response, Status

from .interfaces import Peer
from .lac_waiters import LacWaiters
from .metrics import ShardMetrics
from .read_memory import ReadMemory, answer_bound


class ShardServer(Protocol):
    """What these handlers use of the shard's server (bkaio/bookie/server.py)."""

    storage: LedgerStorage
    limits: ServerConfig
    metrics: ShardMetrics
    lac_waiters: LacWaiters
    read_memory: ReadMemory
    stopping: bool


async def wait_for_lac(
    server: ShardServer,
    ledger_id: int,
    previous_lac: int,
    timeout_ms: int,
    owner: Hashable = None,
) -> int:
    """The ledger's LAC once it exceeds `previous_lac`, or after `timeout_ms` but no more than
    `server.max_long_poll_seconds` (or at shutdown, or when the ledger is fenced) whatever it is
    then. TooManyRequestsError past the shard's bound on waiting polls, or past the bound of
    `owner` (the poll's connection)."""
    lac = _lac_of(server, ledger_id)
    if lac > previous_lac or server.stopping:
        return lac
    # The client's timeout is capped: a waiting poll suspends its connection's idle timeout, so
    # an uncapped one would hold its slot (and connection) for as long as the client asked.
    timeout_seconds = timeout_ms / 1000
    if timeout_seconds > server.limits.max_long_poll_seconds:
        server.metrics.limit_hit("max_long_poll_seconds")
        timeout_seconds = server.limits.max_long_poll_seconds
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    try:
        server.lac_waiters.add(ledger_id, previous_lac, future, owner)
    except TooManyRequestsError:
        server.metrics.limit_hit("max_long_poll_waiters")
        raise
    try:
        async with asyncio.timeout(timeout_seconds):
            lac = await future
    except TimeoutError:
        pass
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # Our task was cancelled, not just the
            raise  # waiter (which `LacWaiters.wake_all` cancels at shutdown).
    finally:
        server.lac_waiters.remove(ledger_id, future)
    return max(lac, _lac_of(server, ledger_id))  # A WRITE_LAC may be ahead of storage.


def notify_lac_early(
    storage: LedgerStorage, waiters: LacWaiters, ledger_id: int, master_key: bytes, lac: int
) -> None:
    """A LAC that a WRITE_LAC or an add's piggyback brings, its key checked against the one
    storage holds: wake the long polls it satisfies now, before storage has journaled (and
    applied) it. The LAC only says the writer has those entries acknowledged (on an ack quorum
    of bookies, durably), which a reader may act on at once; journaling it only keeps this
    bookie's LAC across a restart. A ledger without a key here yet, or fenced, waits for
    storage."""
    state = storage.ledger_state(ledger_id)
    if (
        state is not None
        and hmac.compare_digest(state.master_key, master_key)  # A secret: constant time.
        and lac > state.lac
        and not state.fenced
    ):
        waiters.notify(ledger_id, lac)


def _lac_of(server: ShardServer, ledger_id: int) -> int:
    try:
        return server.storage.last_add_confirmed(ledger_id)
    except NoSuchLedgerError:
        return -1


async def read_entries(
    server: ShardServer, request: ReadEntriesRequest, peer: Peer | None = None
) -> Response:
    """The answer to `request` (its shard already checked by the server) for `peer`, the
    connection a long poll counts against and the answer's memory waits for (None: only the
    shard's memory; the caller releases the reservation, `ReadMemory.release`)."""
    ledger_id = request.ledger_id
    limits = server.limits
    max_count = min(request.max_count, limits.max_read_range_count)
    max_bytes = min(request.max_bytes, limits.max_read_range_bytes)
    if max_count < request.max_count:
        server.metrics.limit_hit("max_read_range_count")
    if max_bytes < request.max_bytes:
        server.metrics.limit_hit("max_read_range_bytes")
    first = request.first_entry_id
    last = request.last_entry_id
    # A long poll's LAC covers entries this bookie may still be journaling (it was the
    # slowest of the write quorum): they come from memory, as an ack quorum holds them.
    journaling_up_to = -1
    if request.long_poll:
        lac = await wait_for_lac(server, ledger_id, request.previous_lac, request.timeout_ms, peer)
        last = min(last, lac)
        if last < first or max_count == 0 or server.storage.ledger_state(ledger_id) is None:
            # Nothing confirmed past the poll's start, no entries wanted (a poll for the LAC
            # alone), or no such ledger yet: the LAC alone.
            return ReadEntriesResponse(request.request_id, Status.OK, ledger_id, lac, first, ())
        journaling_up_to = lac
    count = max(0, min(max_count, (last - first) // request.stride + 1))
    await server.read_memory.reserve(peer, answer_bound(limits, max_bytes, count))
    run = await server.storage.read_records(
        ledger_id, first, last, request.stride, max_count, max_bytes,
        journaling_up_to=journaling_up_to,
    )  # fmt: skip
    server.metrics.read_entry_bytes.inc(run.payload_bytes)
    if not request.long_poll:
        lac = _lac_of(server, ledger_id)  # As of the answer (a long poll's: the one it waited for).
    return ReadEntriesResponse(
        request.request_id,
        Status.OK,
        ledger_id,
        lac,
        min(run.next_entry_id, I64_MAX),
        tuple(run.parts),
    )
