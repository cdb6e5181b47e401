"""The shard's add path: every ADD_ENTRY and ADD_ENTRIES frame, from checked frame to answer.

    connection: decode_adds(body) -> AddRequests       (bkaio/protocol/adds.py: fields, digest)
    ShardServer.add(peer, frame)                         (here: ids, shard, read-only, memory)
    ShardStorage.add_entries(batch, on_durable)          (key, fencing, duplicates, cache room)
    Journal.append_entries(ledger_id, entries)           (group commit, fdatasync)
    on_durable(batches of the group, error) -> answers   (here: OKs per run, errors per add)

One path for every add: an ADD_ENTRY is a frame of one. No task and no future per add: a frame
is checked here in one pass, handed to storage as one `AddRequests` batch, and answered from
the one callback storage makes per journal group (after the group's fdatasync and after its
entries are in the write cache), which updates the counters once per group. Only a frame for a
ledger this shard holds no key for yet, with `ledger_key_check = "metadata"`, waits for the key
check in a task of its own (one per frame). Semantics follow BookKeeper (reference 1.5): an add
is answered only once it is durable.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from bkaio.config import ServerConfig
from bkaio.entrylog.api import LedgerStorage
from bkaio.errors import BKError
from bkaio.protocol.messages import AddEntryResponse
from bkaio.security.ledger_keys import LedgerKeyVerifier
from bkaio.status import Status
from bkaio.supervision import loop_supervisor

from .interfaces import AddRequests, Peer
from .lac_waiters import LacWaiters
from .metrics import ShardMetrics
from .read_entries import notify_lac_early

log = structlog.get_logger(__name__)

_perf_counter = time.perf_counter  # One global lookup per add instead of two.

# Memory charged for a request beyond its payload: the decoded message and its bookkeeping.
REQUEST_OVERHEAD_BYTES = 256


class AddPath:
    """The add half of `ShardServer` (a mixin: the server's state, this module's methods)."""

    # Set by `ShardServer.__init__`.
    limits: ServerConfig
    shard_index: int
    shard_count: int
    storage: LedgerStorage
    metrics: ShardMetrics
    lac_waiters: LacWaiters
    key_verifier: LedgerKeyVerifier | None
    forced_read_only: bool
    disk_full: bool
    limbo_ids: set[int]  # Ledgers in limbo on this shard (bkaio/bookie/limbo.py): fenced.
    storage_failed: bool
    inflight_requests: int
    inflight_bytes: int
    memory_paused: set[Peer]
    tasks: set[asyncio.Task[None]]
    log: structlog.typing.FilteringBoundLogger
    _loop: asyncio.AbstractEventLoop
    _adds_in_flight: int  # Batches storage has not answered yet.
    _adds_idle: asyncio.Future[None] | None  # `drain` waits on it.

    def add(self, peer: Peer, frame: AddRequests) -> None:
        """Take the adds of `frame` (checked fields: `decode_adds`), answering each once."""
        count = len(frame.entries)
        request_id = frame.request_id
        if not peer.claim(request_id, count):
            self._add_with_duplicate_ids(peer, frame)
            return
        ledger_id = frame.ledger_id
        status = None
        if ledger_id % self.shard_count != self.shard_index:
            self.metrics.requests_rejected.labels(reason="wrong_shard").inc()
            status = Status.WRONG_SHARD
        elif self.limbo_ids and ledger_id in self.limbo_ids and not frame.recovery:
            # It may have lost the fence of a recovery along with its disks: fenced until
            # its entries are copied back (recovery adds are how they come back).
            self.metrics.requests_rejected.labels(reason="limbo").inc()
            status = Status.FENCED
        elif (
            self.forced_read_only or self.disk_full or self.storage_failed
        ) and not frame.recovery:
            self.metrics.requests_rejected.labels(reason="read_only").inc()
            status = Status.READ_ONLY
        elif frame.refused:
            peer.release(request_id, count)
            self._add_with_refusals(peer, frame)
            return
        if status is not None:
            for index, entry in enumerate(frame.entries):
                entry_id = entry.entry_id
                peer.respond(AddEntryResponse(request_id + index, status, ledger_id, entry_id))
                self.metrics.observe_request("add_entry", 0.0, False)
            peer.release(request_id, count)
            return
        size = frame.payload_bytes + count * REQUEST_OVERHEAD_BYTES
        self.inflight_requests += count
        self.inflight_bytes += size
        if self.inflight_bytes > self.limits.max_memory_bytes:
            if peer not in self.memory_paused:
                self.metrics.limit_hit("max_memory_bytes")
            self.memory_paused.add(peer)
            peer.pause_for_memory()
        frame.peer = peer
        frame.started = _perf_counter()
        frame.size = size
        if self.lac_waiters:  # Tail polls learn a piggybacked LAC on arrival (read_entries.py).
            notify_lac_early(
                self.storage, self.lac_waiters, ledger_id, frame.master_key, frame.entries[-1].lac
            )
        batch = frame  # The same object is storage's batch.
        self._adds_in_flight += 1
        if self.key_verifier is not None and not self.storage.holds_key(ledger_id):
            task = self._loop.create_task(self._add_after_key_check(batch))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return
        self.storage.add_entries(batch, self._on_adds_durable)

    def _add_with_duplicate_ids(self, peer: Peer, frame: AddRequests) -> None:
        """Refuse the adds whose request id is in flight (at once, not executed: the first
        one's answer follows as usual); take the runs of the others."""
        start = 0
        for index, entry in enumerate(frame.entries):
            request_id = frame.request_id + index
            if peer.is_in_flight(request_id):
                self.metrics.requests_rejected.labels(reason="duplicate_request_id").inc()
                peer.respond(
                    AddEntryResponse(
                        request_id, Status.BAD_REQUEST, frame.ledger_id, entry.entry_id
                    )
                )
                if start < index:
                    self.add(peer, frame.part(start, index))
                start = index + 1
        if start < len(frame.entries):
            self.add(peer, frame.part(start, len(frame.entries)))

    def _add_with_refusals(self, peer: Peer, frame: AddRequests) -> None:
        """Answer the adds refused on their own (size, digest); take the runs between them."""
        refused = frame.refused
        assert refused
        start = 0
        for index in sorted(refused):
            status = refused[index]
            if status is Status.BAD_DIGEST:
                self.metrics.requests_rejected.labels(reason="bad_digest").inc()
            else:
                self.metrics.limit_hit("max_entry_bytes")
            if start < index:
                self.add(peer, frame.part(start, index))
            entry_id = frame.entries[index].entry_id
            peer.respond(
                AddEntryResponse(frame.request_id + index, status, frame.ledger_id, entry_id)
            )
            self.metrics.observe_request("add_entry", 0.0, False)
            start = index + 1
        if start < len(frame.entries):
            self.add(peer, frame.part(start, len(frame.entries)))

    async def _add_after_key_check(self, batch: AddRequests) -> None:
        """A ledger this shard holds no key for: its key must match the ledger's metadata."""
        try:
            await self._check_ledger_key(batch.ledger_id, batch.master_key)
        except BKError as error:
            self._on_adds_durable([batch], error)
            return
        except asyncio.CancelledError:
            self._on_adds_durable([batch], None, dropped=True)
            raise
        self.storage.add_entries(batch, self._on_adds_durable)

    def _on_adds_durable(
        self, batches: list[AddRequests], error: BKError | None, *, dropped: bool = False
    ) -> None:
        """Storage's answer for the batches of one journal group: durable, or failed.

        OK answers go out per batch (a batch of an ADD_ENTRIES frame as one answer, which the
        connection joins to the next when their ids continue); the counters, the memory bound
        and the metrics are updated once for all of them.
        """
        lac_waiters = self.lac_waiters
        polls_wait = bool(lac_waiters)  # Once per group: `LacWaiters.__bool__` is Python code.
        observe_adds = self.metrics.observe_adds
        now = time.perf_counter()
        answered = 0
        freed_bytes = 0
        added_bytes = 0
        for batch in batches:
            peer = batch.peer
            entries = batch.entries
            count = len(entries)
            request_id = batch.request_id
            answered += count
            freed_bytes += batch.size
            try:
                if error is not None or batch.failures or dropped:
                    self._answer_failed_adds(batch, error, dropped, now)
                else:
                    added_bytes += batch.size - count * REQUEST_OVERHEAD_BYTES
                    if polls_wait:
                        lac_waiters.notify(batch.ledger_id, self._lac_of(batch.ledger_id))
                    if batch.coalesce:
                        peer.respond_adds_ok(
                            request_id, batch.ledger_id, entries[0].entry_id, count
                        )
                    elif count == 1:
                        peer.respond_add_ok(request_id, batch.ledger_id, entries[0].entry_id)
                    else:
                        for index, entry in enumerate(entries):
                            peer.respond_add_ok(request_id + index, batch.ledger_id, entry.entry_id)
                    observe_adds(now - batch.started, count)
            except Exception as crash:
                # A bug while answering: reported, and the batch's accounting released all
                # the same (a leak would keep the shard's reading paused for good).
                loop_supervisor().report("add_answers", crash)
            peer.release(request_id, count)
        self._adds_in_flight -= len(batches)
        if added_bytes:
            self.metrics.add_entry_bytes.inc(added_bytes)
        self.inflight_requests -= answered
        self.inflight_bytes -= freed_bytes
        self._resume_after_memory()
        idle = self._adds_idle
        if idle is not None and self._adds_in_flight == 0 and not idle.done():
            idle.set_result(None)

    def _answer_failed_adds(
        self, batch: AddRequests, error: BKError | None, dropped: bool, now: float
    ) -> None:
        """Each add of a failed batch answered with its error; with `failures`, the others OK
        (and `dropped`: nobody answers, the shard is stopping under them)."""
        if dropped:
            return
        if error is not None:
            self.log.debug("request_failed", op="ADD_ENTRY", error=str(error))
        failures = batch.failures or {}
        peer = batch.peer
        ok_bytes = 0
        for index, entry in enumerate(batch.entries):
            failure = error if error is not None else failures.get(index)
            request_id = batch.request_id + index
            if failure is None:
                ok_bytes += len(entry.payload)
                peer.respond_add_ok(request_id, batch.ledger_id, entry.entry_id)
                self.metrics.observe_add(now - batch.started)
                continue
            peer.respond(
                AddEntryResponse(request_id, failure.status, batch.ledger_id, entry.entry_id)
            )
            self.metrics.observe_request("add_entry", now - batch.started, False)
        if ok_bytes:
            self.metrics.add_entry_bytes.inc(ok_bytes)
            if self.lac_waiters:
                self.lac_waiters.notify(batch.ledger_id, self._lac_of(batch.ledger_id))

    # Provided by `ShardServer`.
    def _lac_of(self, ledger_id: int) -> int:
        raise NotImplementedError

    async def _check_ledger_key(self, ledger_id: int, master_key: bytes) -> None:
        raise NotImplementedError

    def _resume_after_memory(self) -> None:
        raise NotImplementedError
