"""One shard's request handling: routing checks, read-only mode, the operations of protocol v1.

`ShardServer` owns the shard's storage handle (`LedgerStorage`), its connections (as `Peer`s,
bkaio/bookie/interfaces.py), the long-poll waiters and the global memory bound, which the
answers of reads join (`ReadMemory`, bkaio/bookie/read_memory.py). Connections hand
it decoded requests (`dispatch`) and checked add frames (`add`, the one add path, in
bkaio/bookie/adds.py). Every operation but the add is a coroutine returning its response, run as
one task and answered through the connection's batched writer. Semantics follow BookKeeper
(reference 1.5): an add is answered only once its journal group is synced; a fencing read only
after the fence is durable. Imports protocol and storage types; never the ledger client, the
connection module or sockets. About 600 lines: one handler per operation of the protocol over one
shard's state (the add path and reads already live in adds.py and read_entries.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from bkaio.config import BookieConfig
from bkaio.entrylog.api import LedgerStorage
from bkaio.entrylog.types import DiskUsage, StoredEntry
from bkaio.errors import (
    BKError,
    DataUnknownError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadOnlyBookieError,
    UnauthorizedError,
    WrongShardError,
)
from bkaio.protocol.encoder import ADD_ENTRIES_BATCH_BYTES
from bkaio.protocol.messages import (
    PROTOCOL_VERSION,
    READ_ENTRIES_FEATURE,
    Flag,
    ForceRequest,
    ForceResponse,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    HelloRequest,
    HelloResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    Op,
    PingRequest,
    PingResponse,
    ReadEntriesRequest,
    ReadEntryRequest,
    ReadEntryResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    Request,
    Response,
    WireEntry,
    WriteLacRequest,
    WriteLacResponse,
)
from bkaio.security.ledger_keys import LedgerKeyRefusedError, LedgerKeyVerifier
from bkaio.security.tokens import AuthFailureThrottle, tokens_equal
from bkaio.status import Status
from bkaio.supervision import loop_supervisor

from .adds import REQUEST_OVERHEAD_BYTES, AddPath
from .interfaces import Peer
from .lac_waiters import LacWaiters
from .limbo import LimboLedgers
from .metrics import ShardMetrics
from .read_entries import notify_lac_early, read_entries, wait_for_lac
from .read_memory import ReadMemory, answer_bound
from .space import BookieSpace

__all__ = ["ADD_ENTRIES_MIN_FRAME_BYTES", "FEATURES", "REQUEST_OVERHEAD_BYTES", "ShardServer"]

log = structlog.get_logger(__name__)

FEATURES = (
    "read_range",
    "long_poll",
    "fence",
    "write_lac",
    "list_entries",
    "add_entries",
    READ_ENTRIES_FEATURE,
)
# Clients fill ADD_ENTRIES frames up to `ADD_ENTRIES_BATCH_BYTES` of entries without knowing
# this bookie's frame limit: a bookie with a smaller limit than this does not offer them.
ADD_ENTRIES_MIN_FRAME_BYTES = 4 * ADD_ENTRIES_BATCH_BYTES
_FEATURES_WITHOUT_ADD_ENTRIES = tuple(f for f in FEATURES if f != "add_entries")
_OP_NAMES = {op: op.name.lower() for op in Op}
_NO_LIMIT = 1 << 62  # max_bytes of a one-entry read: the entry whatever its size.


class ShardServer(AddPath):
    """The request handling of one shard; every method runs on the shard's event loop."""

    def __init__(
        self,
        config: BookieConfig,
        shard_index: int,
        storage: LedgerStorage,
        metrics: ShardMetrics,
        *,
        on_read_only_change: Callable[[bool], None] | None = None,
        key_verifier: LedgerKeyVerifier | None = None,
        limbo: LimboLedgers | None = None,
    ) -> None:
        assert 0 <= shard_index < config.shard_count, (shard_index, config.shard_count)
        self.config = config
        self.limits = config.server
        self.shard_index = shard_index
        self.shard_count = config.shard_count
        self.storage = storage
        self.metrics = metrics
        self.log = log.bind(bookie_id=config.bookie_id, shard=shard_index)
        self.connections: set[Peer] = set()
        self.lac_waiters = LacWaiters(
            config.server.max_long_poll_waiters, config.server.max_long_poll_waiters_per_connection
        )
        self.tasks: set[asyncio.Task[None]] = set()
        self.inflight_requests = 0
        self.inflight_bytes = 0
        self.memory_paused: set[Peer] = set()
        self.forced_read_only = config.read_only.start_read_only
        self.disk_full = False
        self.disk_almost_full = False  # Past `disk_warn_fraction`: said once (`apply_disk_usage`).
        self.storage_failed = False  # Flushes fail (storage `write_failure`): read-only.
        self.disk_usage_fraction_max = 0.0
        # The bookie's space (bkaio/bookie/space.py), refreshed with every disk check.
        self.space = BookieSpace(total_bytes=0, free_bytes=0, filesystems=0)
        self.stopping = False
        self._on_read_only_change = on_read_only_change
        # None: "first_sight" (storage records the first key); else checked against metadata.
        self.key_verifier = key_verifier
        # Ledgers this shard may have lost entries of (bkaio/bookie/limbo.py): fenced, and
        # DATA_UNKNOWN for what it lacks. The set is shared with `limbo`, which clears it.
        self.limbo = limbo
        self.limbo_ids: set[int] = limbo.ids if limbo is not None else set()
        self._loop = asyncio.get_running_loop()  # Cached: get_running_loop costs a getpid.
        self._adds_in_flight = 0  # Batches storage has not answered yet (`AddPath`).
        self._adds_idle: asyncio.Future[None] | None = None  # `drain` waits for them.
        # A full write cache stops the reading of requests (`_write_cache_full`).
        self.write_cache_full = False
        storage.room_pressure_listener = self._write_cache_full
        self.auth_throttle = AuthFailureThrottle(
            config.server.auth_failure_delay_seconds, config.server.auth_failure_max_delay_seconds
        )
        # The answers of reads reserve their memory first (bkaio/bookie/read_memory.py).
        self.read_memory = ReadMemory(self, config.server, metrics, self._resume_after_memory)
        self._handlers: dict[Op, Callable[[Any, Peer], Awaitable[Response]]] = {
            Op.READ_ENTRY: self._read_entry,
            Op.READ_RANGE: self._read_range,
            Op.READ_ENTRIES: self._read_entries,
            Op.READ_LAC: self._read_lac,
            Op.WRITE_LAC: self._write_lac,
            Op.FORCE: self._force,
            Op.LIST_ENTRIES: self._list_entries,
        }
        metrics.bind_gauges(
            connections=lambda: len(self.connections),
            inflight_requests=lambda: self.inflight_requests,
            inflight_bytes=lambda: self.inflight_bytes,
            long_poll_waiters=lambda: len(self.lac_waiters),
            read_only=lambda: 1.0 if self.read_only else 0.0,
            disk_usage_fraction_max=lambda: self.disk_usage_fraction_max,
        )

    # --- state -------------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self.forced_read_only or self.disk_full or self.storage_failed

    def set_read_only(
        self,
        *,
        forced: bool | None = None,
        disk_full: bool | None = None,
        storage_failed: bool | None = None,
    ) -> None:
        before = self.read_only
        if forced is not None:
            self.forced_read_only = forced
        if disk_full is not None:
            self.disk_full = disk_full
        if storage_failed is not None:
            self.storage_failed = storage_failed
        if self.read_only != before:
            self.log.warning(
                "shard_read_only_changed",
                read_only=self.read_only,
                forced=self.forced_read_only,
                disk_full=self.disk_full,
                storage_failed=self.storage_failed,
            )
            if self._on_read_only_change is not None:
                self._on_read_only_change(self.read_only)

    def measure_disk_usage(self) -> list[DiskUsage]:
        """The usage of the shard's disks (blocking, statvfs: run it in an executor)."""
        return self.storage.disk_usage()

    def apply_disk_usage(self, usages: list[DiskUsage]) -> None:
        """Flip read-only when a disk passes `disk_read_only_fraction`, back below the low mark
        (GET_BOOKIE_INFO answers from `space`, which the same disk check measures)."""
        highest = max((usage.fraction for usage in usages), default=0.0)
        self.disk_usage_fraction_max = highest
        thresholds = self.config.read_only
        # Said once per crossing, before adds are refused (BookKeeper's diskUsageWarnThreshold).
        almost_full = highest >= thresholds.disk_warn_fraction
        if almost_full and not self.disk_almost_full:
            self.log.warning("disk_almost_full", usage_fraction=round(highest, 4))
        self.disk_almost_full = almost_full
        if not self.disk_full and highest >= thresholds.disk_read_only_fraction:
            self.log.warning("disk_full", usage_fraction=round(highest, 4))
            self.set_read_only(disk_full=True)
        elif self.disk_full and highest < thresholds.disk_writable_fraction:
            self.log.info("disk_writable_again", usage_fraction=round(highest, 4))
            self.set_read_only(disk_full=False)

    # --- dispatch ----------------------------------------------------------------------------

    def hello(self, request: HelloRequest) -> tuple[Response, bool]:
        """The reply to a HELLO and whether the connection may continue."""
        if request.protocol_version != PROTOCOL_VERSION:
            return request.error_response(Status.UNSUPPORTED_VERSION), False
        token = self.limits.auth_token
        if token and not tokens_equal(request.auth_token, token):  # Never logged.
            self.metrics.requests_rejected.labels(reason="bad_auth_token").inc()
            self.metrics.auth_failures.inc()
            return request.error_response(Status.UNAUTHORIZED), False
        response = HelloResponse(
            request.request_id,
            Status.OK,
            PROTOCOL_VERSION,
            self.config.bookie_id,
            self.shard_index,
            self.shard_count,
            FEATURES
            if self.limits.max_frame_bytes >= ADD_ENTRIES_MIN_FRAME_BYTES
            else _FEATURES_WITHOUT_ADD_ENTRIES,
        )
        return response, True

    def open_connection(self, peer: Peer) -> str | None:
        """Admit a new connection, or say why not (it is then closed at once)."""
        if self.stopping:
            return "stopping"
        if len(self.connections) >= self.limits.max_connections:
            self.metrics.limit_hit("max_connections")
            return "max_connections"
        self.connections.add(peer)
        if self.write_cache_full:
            peer.pause_for_room()
        return None

    def close_connection(self, peer: Peer) -> None:
        self.connections.discard(peer)
        self.memory_paused.discard(peer)
        self.read_memory.connection_lost(peer)

    def writing_resumed(self, peer: Peer) -> None:
        self.read_memory.connection_writable(peer)

    def refusal_delay(self, host: str, now: float) -> float:
        """How long a HELLO with a wrong token from `host` waits for its answer (grows with
        the host's recent failures: token guessing gets slow)."""
        delay = self.auth_throttle.failed(host, now)
        if delay > 0:
            self.metrics.limit_hit("auth_failure_delay")
        return delay

    def dispatch(self, peer: Peer, request: Request) -> None:
        """Answer `request` (not an add: `add`) on `peer`: now when it needs no I/O, else from
        a task."""
        op = request.op
        handler = self._handlers.get(op)
        if handler is None:
            started = time.perf_counter()
            response = self._immediate(request)
            peer.respond(response)
            self.metrics.observe_request(
                _OP_NAMES[op], time.perf_counter() - started, response.status is Status.OK
            )
            return
        if not peer.claim(request.request_id, 1):
            # Two answers under one id would be ambiguous: the duplicate is refused at once
            # and not executed; the first one's answer follows as usual.
            self.metrics.requests_rejected.labels(reason="duplicate_request_id").inc()
            peer.respond(request.error_response(Status.BAD_REQUEST))
            return
        size = REQUEST_OVERHEAD_BYTES
        self.inflight_requests += 1
        self.inflight_bytes += size
        if self.inflight_bytes > self.limits.max_memory_bytes:
            if peer not in self.memory_paused:
                self.metrics.limit_hit("max_memory_bytes")
            self.memory_paused.add(peer)
            peer.pause_for_memory()
        started = time.perf_counter()
        task = self._loop.create_task(self._run(peer, request, handler, size, started))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if op is Op.READ_LAC or op is Op.READ_ENTRIES:
            peer.track_long_poll(task)

    def _write_cache_full(self, full: bool) -> None:
        """Storage's write cache has adds waiting for room (`full`), or none any more.

        While it is full no connection of the shard is read: the adds already read wait in
        order for the room a flush makes, the flush gets the CPU the loop would spend taking
        more, and clients feel it as TCP backpressure (a ledger client holds its appends
        back), as with BookKeeper's blocking of adds on a full write cache. Without this, a
        bookie that fell behind kept reading, so that adds waited seconds for room.
        """
        self.write_cache_full = full
        if full:
            self.metrics.limit_hit("write_cache_bytes")
            for connection in self.connections:
                connection.pause_for_room()
        else:
            for connection in list(self.connections):
                connection.resume_after_room()

    def _immediate(self, request: Request) -> Response:
        if isinstance(request, PingRequest):
            return PingResponse(request.request_id, Status.OK)
        if isinstance(request, GetBookieInfoRequest):
            space = self.space  # Measured off the loop by the worker's disk check (space.py).
            return GetBookieInfoResponse(
                request.request_id,
                Status.OK,
                space.total_bytes,
                space.free_bytes,
                self.shard_index,
                self.shard_count,
                self.read_only,
            )
        if isinstance(request, HelloRequest):
            return request.error_response(Status.BAD_REQUEST)  # A second HELLO.
        raise AssertionError(f"no immediate handler for {request!r}")

    async def _run(
        self,
        peer: Peer,
        request: Any,
        handler: Callable[[Any, Peer], Awaitable[Response]],
        size: int,
        started: float,
    ) -> None:
        try:
            response = await handler(request, peer)
        except BKError as error:
            response = request.error_response(error.status)
            self.log.debug("request_failed", op=request.op.name, error=str(error))
        except asyncio.CancelledError:
            self.read_memory.release(asyncio.current_task())
            self._finish(peer, request.request_id, size)
            raise
        except Exception as crash:  # Answered, and reported: a bug, not a bad request.
            loop_supervisor().report(f"request_{request.op.name.lower()}", crash)
            response = request.error_response(Status.INTERNAL_ERROR)
        self._finish(peer, request.request_id, size)
        peer.respond(response)
        if self.read_memory.held:  # A read's answer: given back once flushed (queued before).
            self._loop.call_soon(self.read_memory.release, asyncio.current_task())
        self.metrics.observe_request(
            _OP_NAMES[request.op], time.perf_counter() - started, response.status is Status.OK
        )

    def _finish(self, peer: Peer, request_id: int, size: int) -> None:
        self.inflight_requests -= 1
        self.inflight_bytes -= size
        peer.release(request_id, 1)
        self._resume_after_memory()

    def _resume_after_memory(self) -> None:
        if self.memory_paused and self.inflight_bytes <= self.limits.max_memory_bytes * 3 // 4:
            paused, self.memory_paused = self.memory_paused, set()
            for waiting in paused:
                waiting.resume_after_memory()
        if self.read_memory.waiting:
            self.read_memory.admit()

    def _check_shard(self, ledger_id: int) -> None:
        if ledger_id % self.shard_count != self.shard_index:
            self.metrics.requests_rejected.labels(reason="wrong_shard").inc()
            raise WrongShardError(
                f"ledger {ledger_id} belongs to shard {ledger_id % self.shard_count} of "
                f"{self.config.bookie_id}, not shard {self.shard_index}"
            )

    def _lac_of(self, ledger_id: int) -> int:
        try:
            return self.storage.last_add_confirmed(ledger_id)
        except NoSuchLedgerError:
            return -1

    async def _check_ledger_key(self, ledger_id: int, master_key: bytes) -> None:
        """A ledger this shard has no key for yet: the key must match the ledger's metadata.

        The one ledger-key check of the shard (adds, fences, WRITE_LAC); once storage holds the
        key it compares every later request itself.
        """
        verifier = self.key_verifier
        if verifier is None or self.storage.holds_key(ledger_id):
            return
        checks = self.metrics.ledger_key_checks
        try:
            await verifier.verify(ledger_id, master_key)
        except LedgerKeyRefusedError as refused:
            self.metrics.requests_rejected.labels(reason="unauthorized_ledger_key").inc()
            checks.labels(result=refused.reason).inc()
            raise
        except BKError:
            checks.labels(result="lookup_failed").inc()
            raise
        checks.labels(result="accepted").inc()

    async def _fence(self, ledger_id: int, master_key: bytes | None) -> None:
        if master_key is None:
            raise UnauthorizedError(f"ledger {ledger_id}: a fencing read needs the master key")
        await self._check_ledger_key(ledger_id, master_key)
        await self.storage.fence(ledger_id, master_key)
        if self.lac_waiters:
            self.lac_waiters.wake_ledger(ledger_id, self._lac_of(ledger_id))

    # --- operations other than adds (bkaio/bookie/adds.py) -----------------------------------

    async def _read_entry(self, request: ReadEntryRequest, peer: Peer) -> Response:
        """A READ_ENTRY is a read of a range of one (`_read`)."""
        ledger_id = request.ledger_id
        try:
            (stored,) = await self._read(
                peer, ledger_id, request.flags, request.master_key, request.entry_id, 1, _NO_LIMIT
            )
        except NoSuchEntryError:
            return ReadEntryResponse(
                request.request_id,
                Status.NO_SUCH_ENTRY,
                ledger_id,
                request.entry_id,
                self._lac_of(ledger_id),
                None,
            )
        wire = WireEntry(stored.entry_id, stored.lac, stored.length, stored.digest, stored.payload)
        return ReadEntryResponse(
            request.request_id, Status.OK, ledger_id, stored.entry_id, self._lac_of(ledger_id), wire
        )

    async def _read_range(self, request: ReadRangeRequest, peer: Peer) -> Response:
        ledger_id = request.ledger_id
        max_count = min(request.max_count, self.limits.max_read_range_count)
        max_bytes = min(request.max_bytes, self.limits.max_read_range_bytes)
        if max_count < request.max_count:
            self.metrics.limit_hit("max_read_range_count")
        if max_bytes < request.max_bytes:
            self.metrics.limit_hit("max_read_range_bytes")
        stored = await self._read(
            peer,
            ledger_id,
            request.flags,
            request.master_key,
            request.first_entry_id,
            max_count,
            max_bytes,
        )
        entries = tuple(WireEntry(e.entry_id, e.lac, e.length, e.digest, e.payload) for e in stored)
        status = Status.OK if entries or max_count == 0 else Status.NO_SUCH_ENTRY
        return ReadRangeResponse(
            request.request_id, status, ledger_id, self._lac_of(ledger_id), entries
        )

    async def _read(
        self,
        peer: Peer,
        ledger_id: int,
        flags: Flag,
        master_key: bytes | None,
        first_entry_id: int,
        max_count: int,
        max_bytes: int,
    ) -> list[StoredEntry]:
        """The one read of the shard (READ_ENTRY, READ_RANGE): routing, the fence a recovery
        read asks for, the answer's memory, then storage's `read_range`."""
        await self._route_and_fence(ledger_id, flags, master_key)
        payload_bytes = 0 if max_bytes == _NO_LIMIT else max_bytes  # The first entry's: any.
        await self.read_memory.reserve(peer, answer_bound(self.limits, payload_bytes, max_count))
        try:
            stored = await self.storage.read_range(ledger_id, first_entry_id, max_count, max_bytes)
        except (NoSuchEntryError, NoSuchLedgerError) as missing:
            self._refuse_if_in_limbo(ledger_id, missing)
            raise
        self.metrics.read_entry_bytes.inc(sum(len(entry.payload) for entry in stored))
        return stored

    def _refuse_if_in_limbo(self, ledger_id: int, missing: BKError) -> None:
        """A shard with the ledger in limbo may have acknowledged what it lacks before its
        disks were reformatted: DataUnknownError, never "no such entry" / "no such ledger"."""
        if self.limbo_ids and ledger_id in self.limbo_ids:
            self.metrics.requests_rejected.labels(reason="limbo_data_unknown").inc()
            raise DataUnknownError(
                f"ledger {ledger_id} is in limbo on {self.config.bookie_id}: {missing}"
            ) from missing

    async def _route_and_fence(self, ledger_id: int, flags: Flag, master_key: bytes | None) -> None:
        """What every read-side request does first: the shard check, and FENCE when asked."""
        self._check_shard(ledger_id)
        if flags & Flag.FENCE:
            await self._fence(ledger_id, master_key)

    async def _read_entries(self, request: ReadEntriesRequest, peer: Peer) -> Response:
        self._check_shard(request.ledger_id)
        # An answer leaves out the entries a shard lacks, which a reader takes for "not
        # stored": in limbo that is not known, so the whole request is DATA_UNKNOWN (the
        # reader asks another bookie, or reads entry by entry, which limbo answers per entry).
        self._refuse_if_in_limbo(request.ledger_id, BKError("its range answers are incomplete"))
        return await read_entries(self, request, peer)

    async def _read_lac(self, request: ReadLacRequest, peer: Peer) -> Response:
        ledger_id = request.ledger_id
        await self._route_and_fence(ledger_id, request.flags, request.master_key)
        long_poll = bool(request.flags & Flag.LONG_POLL)
        if not long_poll and self.storage.ledger_state(ledger_id) is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not on {self.config.bookie_id}")
        if long_poll:
            lac = await wait_for_lac(
                self, ledger_id, request.previous_lac, request.timeout_ms, peer
            )
        else:
            lac = self._lac_of(ledger_id)
        state = self.storage.ledger_state(ledger_id)
        last_entry_id = state.last_entry_id if state is not None else -1
        return ReadLacResponse(request.request_id, Status.OK, ledger_id, lac, last_entry_id)

    async def _write_lac(self, request: WriteLacRequest, _peer: Peer) -> Response:
        ledger_id = request.ledger_id
        self._check_shard(ledger_id)
        if self.read_only:  # It is journaled: a full disk takes no more (BookKeeper: EREADONLY).
            self.metrics.requests_rejected.labels(reason="read_only").inc()
            raise ReadOnlyBookieError(f"shard {self.shard_index} is read-only")
        await self._check_ledger_key(ledger_id, request.master_key)
        if self.lac_waiters:  # Long polls learn the LAC now, not once it is journaled.
            notify_lac_early(
                self.storage, self.lac_waiters, ledger_id, request.master_key, request.lac
            )
        await self.storage.write_lac(ledger_id, request.master_key, request.lac)
        if self.lac_waiters:
            self.lac_waiters.notify(ledger_id, self._lac_of(ledger_id))
        return WriteLacResponse(request.request_id, Status.OK, ledger_id)

    async def _force(self, request: ForceRequest, _peer: Peer) -> Response:
        self._check_shard(request.ledger_id)
        await self.storage.force(request.ledger_id)
        return ForceResponse(request.request_id, Status.OK, request.ledger_id)

    async def _list_entries(self, request: ListEntriesRequest, _peer: Peer) -> Response:
        self._check_shard(request.ledger_id)
        # What a shard in limbo holds of the ledger says nothing about what it acknowledged.
        self._refuse_if_in_limbo(request.ledger_id, BKError("its entry list is incomplete"))
        ranges = await self.storage.list_entries(request.ledger_id)
        return ListEntriesResponse(
            request.request_id,
            Status.OK,
            request.ledger_id,
            tuple(map(tuple, ranges)),  # type: ignore[arg-type]
        )

    # --- lifecycle ---------------------------------------------------------------------------

    async def drain(self, timeout_seconds: float) -> None:
        """Stop reading, answer long polls, let in-flight requests finish (up to the timeout)."""
        self.stopping = True
        for peer in list(self.connections):
            peer.stop_reading()
        self.lac_waiters.wake_all()
        # Journaled adds are waited for too (answered when durable), never cancelled.
        pending: set[asyncio.Future[Any]] = set(self.tasks)
        if self._adds_in_flight:
            self._adds_idle = self._loop.create_future()
            pending.add(self._adds_idle)
        if pending:
            _, still_running = await asyncio.wait(pending, timeout=timeout_seconds)
            if still_running:
                self.log.warning(
                    "drain_timed_out",
                    unfinished_requests=len(still_running),
                    unanswered_add_batches=self._adds_in_flight,
                )
                tasks = [task for task in still_running if task in self.tasks]
                for task in tasks:
                    task.cancel()
                if tasks:
                    await asyncio.wait(tasks, timeout=1.0)
        for peer in list(self.connections):
            peer.close_after_flush()
        await asyncio.sleep(0)  # Let the flush callbacks run.

    def sweep(self, now: float) -> None:
        """Close connections past their HELLO, partial-frame or idle deadline."""
        limits = self.limits
        for connection in list(self.connections):
            connection.check_deadlines(
                now,
                hello_timeout=limits.hello_timeout_seconds,
                frame_timeout=limits.frame_read_timeout_seconds,
                idle_timeout=limits.idle_timeout_seconds,
            )
