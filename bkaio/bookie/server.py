"""One shard's request handling: routing checks, read-only mode, the operations of protocol v1.

`ShardServer` owns the shard's storage handle, its connections, the long-poll waiters and the
global memory bound. Connections (bkaio/bookie/connection.py) hand it decoded requests; each
operation is a coroutine returning its response, run as one task and answered through the
connection's batched writer. Semantics follow BookKeeper (reference 1.5): an add is answered only
after `add_entry` returned (journal synced); a fencing read is answered only after the fence is
durable. Imports protocol and storage types; never the ledger client or sockets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from bkaio.config import BookieConfig
from bkaio.entrylog.types import DiskUsage, LedgerState, StoredEntry
from bkaio.errors import (
    BadDigestError,
    BKError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadOnlyBookieError,
    TooManyRequestsError,
    UnauthorizedError,
    WrongShardError,
)
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.encoder import ADD_ENTRIES_BATCH_BYTES
from bkaio.protocol.messages import (
    ADD_ENTRIES_ENTRY_FIELDS,
    ADD_ENTRIES_HEAD_FIELDS,
    I64_MAX,
    PROTOCOL_VERSION,
    U32_MAX,
    U64_MAX,
    AddEntryRequest,
    AddEntryResponse,
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
from bkaio.protocol.status import Status
from bkaio.security.ledger_keys import LedgerKeyRefusedError, LedgerKeyVerifier
from bkaio.security.tokens import AuthFailureThrottle, tokens_equal

from .lac_waiters import LacWaiters
from .metrics import ShardMetrics

if TYPE_CHECKING:
    from .connection import BookieServerProtocol

log = structlog.get_logger(__name__)

FEATURES = ("read_range", "long_poll", "fence", "write_lac", "list_entries", "add_entries")
# Clients fill ADD_ENTRIES frames up to `ADD_ENTRIES_BATCH_BYTES` of entries without knowing
# this bookie's frame limit: a bookie with a smaller limit than this does not offer them.
ADD_ENTRIES_MIN_FRAME_BYTES = 4 * ADD_ENTRIES_BATCH_BYTES
_FEATURES_WITHOUT_ADD_ENTRIES = tuple(f for f in FEATURES if f != "add_entries")
# Memory charged for a request beyond its payload: the decoded message and its bookkeeping.
REQUEST_OVERHEAD_BYTES = 256
_OP_NAMES = {op: op.name.lower() for op in Op}
_ADD_ENTRIES_HEAD_FIELDS = ADD_ENTRIES_HEAD_FIELDS
_ADD_ENTRIES_ENTRY_FIELDS = ADD_ENTRIES_ENTRY_FIELDS
_BATCH_ANSWER_FIELDS = 7  # `take_add_batch`'s answer record; a single add's has 8 fields.


def _each_add(answers: list[Any]) -> Iterator[tuple[Any, ...]]:
    """The answers of a journal group, one 8-field record per add (batches listed add by add)."""
    for answer in answers:
        if len(answer) != _BATCH_ANSWER_FIELDS:
            yield answer
            continue
        connection, request_id, ledger_id, entry_id, _, started, sizes = answer
        for index, payload_bytes in enumerate(sizes):
            yield (
                connection, request_id + index, ledger_id, entry_id + index,
                REQUEST_OVERHEAD_BYTES + payload_bytes, started, payload_bytes, True,
            )  # fmt: skip


# Plain ints for the add path: `IntFlag.__and__` is Python code (~1 µs), `int & int` is not.
_RECOVERY_ADD_BIT = int(Flag.RECOVERY_ADD)
_OP_ADD_ENTRY = int(Op.ADD_ENTRY)
_STATUS_OK = int(Status.OK)


class Storage(Protocol):
    """The part of `bkaio.entrylog.shard_storage.ShardStorage` the server uses."""

    async def add_entry(
        self, entry: StoredEntry, master_key: bytes, *, recovery: bool = False
    ) -> None: ...
    async def fence(self, ledger_id: int, master_key: bytes) -> None: ...
    async def write_lac(self, ledger_id: int, master_key: bytes, lac: int) -> None: ...
    async def force(self, ledger_id: int) -> None: ...
    async def read_entry(self, ledger_id: int, entry_id: int) -> StoredEntry: ...
    async def read_range(
        self, ledger_id: int, first_entry_id: int, max_count: int, max_bytes: int
    ) -> list[StoredEntry]: ...
    def ledger_state(self, ledger_id: int) -> LedgerState | None: ...
    def last_add_confirmed(self, ledger_id: int) -> int: ...
    async def list_entries(self, ledger_id: int) -> list[tuple[int, int]]: ...
    def disk_usage(self) -> list[DiskUsage]: ...
    async def close(self) -> None: ...


class ShardServer:
    """The request handling of one shard; every method runs on the shard's event loop."""

    def __init__(
        self,
        config: BookieConfig,
        shard_index: int,
        storage: Storage,
        metrics: ShardMetrics,
        *,
        on_read_only_change: Callable[[bool], None] | None = None,
        key_verifier: LedgerKeyVerifier | None = None,
    ) -> None:
        assert 0 <= shard_index < config.shard_count, (shard_index, config.shard_count)
        self.config = config
        self.limits = config.server
        self.shard_index = shard_index
        self.shard_count = config.shard_count
        self.storage = storage
        self.metrics = metrics
        self.log = log.bind(bookie_id=config.bookie_id, shard=shard_index)
        self.connections: set[BookieServerProtocol] = set()
        self.lac_waiters = LacWaiters(config.server.max_long_poll_waiters)
        self.tasks: set[asyncio.Task[None]] = set()
        self.inflight_requests = 0
        self.inflight_bytes = 0
        self.memory_paused: set[BookieServerProtocol] = set()
        self.forced_read_only = config.read_only.start_read_only
        self.disk_full = False
        self.disk_usage_fraction_max = 0.0
        self.stopping = False
        self._on_read_only_change = on_read_only_change
        # None: "first_sight" (storage records the first key); else checked against metadata.
        self.key_verifier = key_verifier
        self._loop = asyncio.get_running_loop()  # Cached: get_running_loop costs a getpid.
        # The add fast path (no task per entry) when the storage offers it (ShardStorage does).
        self._add_nowait: Callable[..., asyncio.Future[Any] | None] | None = getattr(
            storage, "add_entry_nowait", None
        )
        self._fast_adds: set[asyncio.Future[Any]] = set()  # Journaled, not yet answered.
        self._on_adds_durable = self._adds_durable  # One bound method: batches compare by `is`.
        # The add loop (`take_add`) when the storage offers the field-wise add (ShardStorage).
        self._add_fields: Callable[..., asyncio.Future[Any] | None] | None = getattr(
            storage, "add_entry_fields", None
        )
        # ... and `take_add_batch`, when it offers the batched one.
        self._add_entries_fields: Callable[..., asyncio.Future[Any] | None] | None = getattr(
            storage, "add_entries_fields", None
        )
        # A full write cache stops the reading of requests (`_write_cache_full`).
        self.write_cache_full = False
        if hasattr(storage, "room_pressure_listener"):
            storage.room_pressure_listener = self._write_cache_full
        self.auth_throttle = AuthFailureThrottle(
            config.server.auth_failure_delay_seconds, config.server.auth_failure_max_delay_seconds
        )
        self._handlers: dict[Op, Callable[[Any], Awaitable[Response]]] = {
            Op.ADD_ENTRY: self._add_entry,
            Op.READ_ENTRY: self._read_entry,
            Op.READ_RANGE: self._read_range,
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
        return self.forced_read_only or self.disk_full

    def set_read_only(self, *, forced: bool | None = None, disk_full: bool | None = None) -> None:
        before = self.read_only
        if forced is not None:
            self.forced_read_only = forced
        if disk_full is not None:
            self.disk_full = disk_full
        if self.read_only != before:
            self.log.warning(
                "shard_read_only_changed",
                read_only=self.read_only,
                forced=self.forced_read_only,
                disk_full=self.disk_full,
            )
            if self._on_read_only_change is not None:
                self._on_read_only_change(self.read_only)

    def measure_disk_usage(self) -> float:
        """The highest usage fraction of the shard's disks (blocking: run it in an executor)."""
        return max((usage.fraction for usage in self.storage.disk_usage()), default=0.0)

    def apply_disk_usage(self, highest: float) -> None:
        """Flip read-only when a disk passes `disk_read_only_fraction`; back below the low mark."""
        self.disk_usage_fraction_max = highest
        thresholds = self.config.read_only
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

    def dispatch(self, connection: BookieServerProtocol, request: Request) -> None:
        """Answer `request` on `connection`: now when it needs no I/O, else from a task."""
        op = request.op
        handler = self._handlers.get(op)
        if handler is None:
            started = time.perf_counter()
            response = self._immediate(request)
            connection.respond(response)
            self.metrics.observe_request(
                _OP_NAMES[op], time.perf_counter() - started, response.status is Status.OK
            )
            return
        request_id = request.request_id
        if request_id in connection.inflight_ids:
            # Two answers under one id would be ambiguous: the duplicate is refused at once
            # and not executed; the first one's answer follows as usual.
            self.metrics.requests_rejected.labels(reason="duplicate_request_id").inc()
            connection.respond(request.error_response(Status.BAD_REQUEST))
            return
        size = REQUEST_OVERHEAD_BYTES
        if op is Op.ADD_ENTRY:
            size += len(request.payload)  # type: ignore[union-attr]
        connection.inflight_ids.add(request_id)
        connection.request_started(size)
        self.inflight_requests += 1
        self.inflight_bytes += size
        if self.inflight_bytes > self.limits.max_memory_bytes:
            if connection not in self.memory_paused:
                self.metrics.limit_hit("max_memory_bytes")
            self.memory_paused.add(connection)
            connection.pause_for_memory()
        started = time.perf_counter()
        if op is Op.ADD_ENTRY and self._add_nowait is not None:
            handler = self._add_fast(connection, request, size, started)  # type: ignore[arg-type]
            if handler is None:
                return
        task = self._loop.create_task(self._run(connection, request, handler, size, started))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if op is Op.READ_LAC:
            connection.long_polls.add(task)
            task.add_done_callback(connection.long_polls.discard)

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
            usages = self.storage.disk_usage()
            total = sum(u.total_bytes for u in usages if u.kind == "ledger") or sum(
                u.total_bytes for u in usages
            )
            used = sum(u.used_bytes for u in usages if u.kind == "ledger") or sum(
                u.used_bytes for u in usages
            )
            return GetBookieInfoResponse(
                request.request_id,
                Status.OK,
                total,
                max(total - used, 0),
                self.shard_index,
                self.shard_count,
                self.read_only,
            )
        if isinstance(request, HelloRequest):
            return request.error_response(Status.BAD_REQUEST)  # A second HELLO.
        raise AssertionError(f"no immediate handler for {request!r}")

    async def _run(
        self,
        connection: BookieServerProtocol,
        request: Any,
        handler: Callable[[Any], Awaitable[Response]],
        size: int,
        started: float,
    ) -> None:
        try:
            response = await handler(request)
        except BKError as error:
            response = request.error_response(error.status)
            self.log.debug("request_failed", op=request.op.name, error=str(error))
        except asyncio.CancelledError:
            connection.inflight_ids.discard(request.request_id)
            self._finish(connection, size)
            raise
        except Exception:
            self.log.exception("request_crashed", op=request.op.name)
            response = request.error_response(Status.INTERNAL_ERROR)
        connection.inflight_ids.discard(request.request_id)
        self._finish(connection, size)
        connection.respond(response)
        self.metrics.observe_request(
            _OP_NAMES[request.op], time.perf_counter() - started, response.status is Status.OK
        )

    def _finish(self, connection: BookieServerProtocol, size: int) -> None:
        self.inflight_requests -= 1
        self.inflight_bytes -= size
        connection.request_finished(size)
        self._resume_after_memory()

    def _resume_after_memory(self) -> None:
        if self.memory_paused and self.inflight_bytes <= self.limits.max_memory_bytes * 3 // 4:
            paused, self.memory_paused = self.memory_paused, set()
            for waiting in paused:
                waiting.resume_after_memory()

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

        Once storage holds the key it compares every later request itself.
        """
        verifier = self.key_verifier
        if verifier is None:
            return
        state = self.storage.ledger_state(ledger_id)
        if state is not None and state.master_key:
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

    # --- operations --------------------------------------------------------------------------

    def take_add(self, connection: BookieServerProtocol, body: list[Any]) -> bool:
        """Journal a plain ADD_ENTRY body straight from its fields; False to take the full path.

        The common add costs no request object, no entry checks spread over calls and no
        callback of its own: it is decoded, checked and journaled here, and answered with the
        rest of its journal group by `_adds_durable`. Anything unusual (a field of the wrong
        type or range, a recovery add, a read-only shard, the wrong shard, an oversized or
        corrupt payload, a duplicate request id, memory or cache pressure, a ledger storage
        cannot take at once) returns False having changed nothing; `dispatch` then decodes the
        body the usual way and answers with the precise error. The caller checked that `body`
        has 10 items and is an ADD_ENTRY after HELLO.
        """
        op, request_id, ledger_id, entry_id, flags, master_key, lac, length, digest, payload = body
        if type(op) is not int:
            return False
        return self.take_add_fields(
            connection, request_id, ledger_id, entry_id, flags, master_key, lac, length, digest,
            payload, False,
        )  # fmt: skip

    def take_add_fields(
        self,
        connection: BookieServerProtocol,
        request_id: Any,
        ledger_id: Any,
        entry_id: Any,
        flags: Any,
        master_key: Any,
        lac: Any,
        length: Any,
        digest: Any,
        payload: Any,
        coalesce: bool,  # Positional on purpose: called once per add.
    ) -> bool:
        """`take_add` given the fields, unchecked: one add of an ADD_ENTRY or ADD_ENTRIES body.

        With `coalesce` (the add came in an ADD_ENTRIES frame, so the client reads
        ADD_ENTRIES answers), its OK answer may be one `AddEntriesResponse` with the adds of
        the same frame or connection journaled next to it.
        """
        add_fields = self._add_fields
        if add_fields is None:
            return False
        # The decoder's checks (`decode_request`) for these fields, in one expression; flags
        # other than 0 (a recovery add) take the full path.
        if not (
            type(flags) is int
            and flags == 0
            and type(request_id) is int
            and type(ledger_id) is int
            and type(entry_id) is int
            and type(lac) is int
            and type(length) is int
            and type(digest) is int
            and type(master_key) is bytes
            and type(payload) is bytes
            and 0 <= request_id <= U64_MAX
            and 0 <= ledger_id <= I64_MAX
            and 0 <= entry_id <= I64_MAX
            and -1 <= lac <= I64_MAX
            and 0 <= length <= I64_MAX
            and 0 <= digest <= U32_MAX
        ):
            return False
        size = REQUEST_OVERHEAD_BYTES + len(payload)
        if (
            ledger_id % self.shard_count != self.shard_index
            or self.forced_read_only
            or self.disk_full
            or len(payload) > self.limits.max_entry_bytes
            or request_id in connection.inflight_ids
            or self.inflight_bytes + size > self.limits.max_memory_bytes
            or entry_digest(ledger_id, entry_id, lac, length, payload) != digest
        ):
            return False
        started = time.perf_counter()
        answer = (
            connection, request_id, ledger_id, entry_id, size, started, len(payload), coalesce
        )  # fmt: skip
        future = add_fields(
            ledger_id, entry_id, lac, length, digest, payload, master_key,
            self._on_adds_durable, answer,
        )  # fmt: skip
        if future is None:
            return False
        self._fast_adds.add(future)
        connection.inflight_ids.add(request_id)
        self.inflight_requests += 1
        self.inflight_bytes += size
        connection.request_started(size)  # Last: it may pause reading.
        return True

    def take_add_batch(self, connection: BookieServerProtocol, body: list[Any], count: int) -> bool:
        """Journal every add of an ADD_ENTRIES body at once, or none (False).

        The same checks as `take_add_fields` for each add, with the ledger's done once; the
        adds are journaled by one storage call and answered like the loop's. Anything that
        would make one of them leave the fast path (or make reading pause within the frame)
        returns False having changed nothing: the caller then takes them one by one. The
        caller checked the frame's shape (`count` entries) and its request ids.
        """
        add_entries = self._add_entries_fields
        if add_entries is None:
            return False
        request_id = body[1]
        ledger_id = body[2]
        flags = body[3]
        master_key = body[4]
        if not (
            type(ledger_id) is int
            and type(flags) is int
            and flags == 0
            and type(master_key) is bytes
            and 0 <= ledger_id <= I64_MAX
        ):
            return False
        end_id = request_id + count
        if (
            ledger_id % self.shard_count != self.shard_index
            or self.forced_read_only
            or self.disk_full
            or connection.inflight + count >= self.limits.max_inflight_per_connection
            or not connection.inflight_ids.isdisjoint(range(request_id, end_id))
        ):
            return False
        max_entry_bytes = self.limits.max_entry_bytes
        entries: list[list[Any]] = []
        payload_sizes: list[int] = []
        first_entry_id = body[_ADD_ENTRIES_HEAD_FIELDS]
        expected_id = first_entry_id
        for start in range(_ADD_ENTRIES_HEAD_FIELDS, len(body), _ADD_ENTRIES_ENTRY_FIELDS):
            entry = body[start : start + _ADD_ENTRIES_ENTRY_FIELDS]
            entry_id, lac, length, digest, payload = entry
            # `take_add_fields`'s checks of one add, in one expression; and consecutive ids,
            # so that one record answers the batch.
            if not (
                type(entry_id) is int
                and type(lac) is int
                and type(length) is int
                and type(digest) is int
                and type(payload) is bytes
                and entry_id == expected_id
                and 0 <= entry_id <= I64_MAX
                and -1 <= lac <= I64_MAX
                and 0 <= length <= I64_MAX
                and 0 <= digest <= U32_MAX
                and len(payload) <= max_entry_bytes
                and entry_digest(ledger_id, entry_id, lac, length, payload) == digest
            ):
                return False
            expected_id += 1
            payload_sizes.append(len(payload))
            entries.append(entry)
        size = sum(payload_sizes) + count * REQUEST_OVERHEAD_BYTES
        if self.inflight_bytes + size > self.limits.max_memory_bytes:
            return False
        # One answer record for the batch (7 fields; a single add's has 8): `_adds_durable`
        # answers it as a whole, `_each_add` lists its adds where they are answered one by one.
        answers = [
            (connection, request_id, ledger_id, first_entry_id, count, time.perf_counter(),
             payload_sizes)
        ]  # fmt: skip
        future = add_entries(ledger_id, master_key, entries, self._on_adds_durable, answers)
        if future is None:
            return False
        self._fast_adds.add(future)
        connection.inflight_ids.update(range(request_id, end_id))
        self.inflight_requests += count
        self.inflight_bytes += size
        connection.requests_started(count)
        return True

    def _adds_durable(self, future: asyncio.Future[Any], answers: list[Any]) -> None:
        """Answer the adds `take_add` journaled in one group, now durable (or failed)."""
        self._fast_adds.discard(future)
        if future.cancelled():  # The journal closed under them: nobody answers (as tasks).
            for connection, request_id, _, _, size, _, _, _ in _each_add(answers):
                connection.inflight_ids.discard(request_id)
                self._finish(connection, size)
            return
        error = future.exception()
        if error is not None:
            if isinstance(error, BKError):
                self.log.debug("request_failed", op="ADD_ENTRY", error=str(error))
                status = error.status
            else:
                self.log.error("request_crashed", op="ADD_ENTRY", error=repr(error))
                status = Status.INTERNAL_ERROR
            for connection, request_id, ledger_id, entry_id, size, started, _, _ in _each_add(
                answers
            ):
                response = AddEntryResponse(request_id, status, ledger_id, entry_id)
                connection.inflight_ids.discard(request_id)
                self._finish(connection, size)
                connection.respond(response)
                self.metrics.observe_request("add_entry", time.perf_counter() - started, False)
            return
        lac_waiters = self.lac_waiters
        observe_add = self.metrics.observe_add
        now = time.perf_counter()
        added_bytes = 0
        freed_bytes = 0
        finished: dict[BookieServerProtocol, int] = {}  # Adds answered per connection.
        # Per connection, the OK answers being coalesced: [first request id, ledger id, first
        # entry id, count], extended while the next add continues both id sequences.
        runs: dict[BookieServerProtocol, list[int]] = {}
        observe_adds = self.metrics.observe_adds
        for answer in answers:
            if len(answer) == _BATCH_ANSWER_FIELDS:  # All the adds of an ADD_ENTRIES frame.
                connection, request_id, ledger_id, entry_id, count, started, sizes = answer
                payload_bytes = sum(sizes)
                added_bytes += payload_bytes
                freed_bytes += payload_bytes + count * REQUEST_OVERHEAD_BYTES
                if lac_waiters:
                    lac_waiters.notify(ledger_id, self._lac_of(ledger_id))
                connection.inflight_ids.difference_update(range(request_id, request_id + count))
                finished[connection] = finished.get(connection, 0) + count
                observe_adds(now - started, count)
            else:
                (
                    connection, request_id, ledger_id, entry_id, size, started, payload_bytes,
                    coalesce,
                ) = answer  # fmt: skip
                added_bytes += payload_bytes
                freed_bytes += size
                if lac_waiters:
                    lac_waiters.notify(ledger_id, self._lac_of(ledger_id))
                connection.inflight_ids.discard(request_id)
                finished[connection] = finished.get(connection, 0) + 1
                observe_add(now - started)
                if not coalesce:
                    connection.respond_add_ok(request_id, ledger_id, entry_id)
                    continue
                count = 1
            run = runs.get(connection)
            if run is not None:
                ran = run[3]
                if run[0] + ran == request_id and run[2] + ran == entry_id and run[1] == ledger_id:
                    run[3] = ran + count
                    continue
                connection.respond_adds_ok(run[0], run[1], run[2], ran)
            runs[connection] = [request_id, ledger_id, entry_id, count]
        for connection, (request_id, ledger_id, entry_id, count) in runs.items():
            connection.respond_adds_ok(request_id, ledger_id, entry_id, count)
        self.metrics.add_entry_bytes.inc(added_bytes)
        # `_finish` for the whole batch: one update per connection, not one per add.
        self.inflight_requests -= sum(finished.values())
        self.inflight_bytes -= freed_bytes
        for connection, count in finished.items():
            connection.requests_finished(count)
        self._resume_after_memory()

    def _add_fast(
        self, connection: BookieServerProtocol, request: AddEntryRequest, size: int, started: float
    ) -> Callable[[Any], Awaitable[Response]] | None:
        """Journal an add without a task; None when answered or in flight, else a handler.

        The answer is queued by a done-callback of the journal future: after the group's
        fdatasync, and after storage applied the entry (its callback was added first). An add
        the fast path cannot take (first of its ledger, possible duplicate, full cache or
        journal group) gets the returned handler, run as a task like every other request.
        """
        assert self._add_nowait is not None
        try:
            entry, recovery = self._prepare_add(request)
            # Only a ledger whose key storage holds takes the fast path: for it,
            # `_check_ledger_key` has nothing to verify, and storage compares the key.
            on_done = partial(self._add_durable, connection, request, size, started)
            future = self._add_nowait(entry, request.master_key, recovery=recovery, on_done=on_done)
        except BKError as error:
            self.log.debug("request_failed", op=request.op.name, error=str(error))
            self._answer(connection, request, size, started, request.error_response(error.status))
            return None
        except Exception:
            self.log.exception("request_crashed", op=request.op.name)
            self._answer(
                connection, request, size, started, request.error_response(Status.INTERNAL_ERROR)
            )
            return None
        if future is None:
            return partial(self._add_prepared, entry, recovery)
        self._fast_adds.add(future)
        return None

    def _add_durable(
        self,
        connection: BookieServerProtocol,
        request: AddEntryRequest,
        size: int,
        started: float,
        future: asyncio.Future[Any],
    ) -> None:
        self._fast_adds.discard(future)
        if future.cancelled():  # The journal closed under it: nobody answers (as a task).
            connection.inflight_ids.discard(request.request_id)
            self._finish(connection, size)
            return
        error = future.exception()
        if error is None:
            self._add_ok(connection, request, size, started)
            return
        if isinstance(error, BKError):
            self.log.debug("request_failed", op=request.op.name, error=str(error))
            response = request.error_response(error.status)
        else:
            self.log.error("request_crashed", op=request.op.name, error=repr(error))
            response = request.error_response(Status.INTERNAL_ERROR)
        self._answer(connection, request, size, started, response)

    def _add_ok(
        self,
        connection: BookieServerProtocol,
        request: AddEntryRequest,
        size: int,
        started: float,
    ) -> None:
        """`_added` + `_answer` for a durable fast-path add, without a response object."""
        ledger_id = request.ledger_id
        request_id = request.request_id
        self.metrics.add_entry_bytes.inc(len(request.payload))
        if self.lac_waiters:
            self.lac_waiters.notify(ledger_id, self._lac_of(ledger_id))
        connection.inflight_ids.discard(request_id)
        self._finish(connection, size)
        connection.respond_add_ok(request_id, ledger_id, request.entry_id)
        self.metrics.observe_add(time.perf_counter() - started)

    def _answer(
        self,
        connection: BookieServerProtocol,
        request: AddEntryRequest,
        size: int,
        started: float,
        response: Response,
    ) -> None:
        connection.inflight_ids.discard(request.request_id)
        self._finish(connection, size)
        connection.respond(response)
        self.metrics.observe_request(
            "add_entry", time.perf_counter() - started, response.status is Status.OK
        )

    def _prepare_add(self, request: AddEntryRequest) -> tuple[StoredEntry, bool]:
        """The checks of an add that need no I/O; the entry to store and the recovery flag."""
        ledger_id = request.ledger_id
        self._check_shard(ledger_id)
        recovery = int.__and__(request.flags, _RECOVERY_ADD_BIT) != 0
        if not recovery and self.read_only:
            self.metrics.requests_rejected.labels(reason="read_only").inc()
            raise ReadOnlyBookieError(f"{self.config.bookie_id} shard {self.shard_index}")
        payload = request.payload
        if len(payload) > self.limits.max_entry_bytes:
            self.metrics.limit_hit("max_entry_bytes")
            raise InvalidArgumentError(
                f"ledger {ledger_id}: entry {request.entry_id} has a {len(payload)}-byte payload, "
                f"above server.max_entry_bytes={self.limits.max_entry_bytes}"
            )
        digest = entry_digest(ledger_id, request.entry_id, request.lac, request.length, payload)
        if digest != request.digest:
            self.metrics.requests_rejected.labels(reason="bad_digest").inc()
            raise BadDigestError(
                f"ledger {ledger_id}: entry {request.entry_id} digest {request.digest:#010x} "
                f"does not match its bytes ({digest:#010x})"
            )
        entry = StoredEntry(
            ledger_id, request.entry_id, request.lac, request.length, request.digest, payload
        )
        return entry, recovery

    async def _add_entry(self, request: AddEntryRequest) -> Response:
        entry, recovery = self._prepare_add(request)
        return await self._add_prepared(entry, recovery, request)

    async def _add_prepared(
        self, entry: StoredEntry, recovery: bool, request: AddEntryRequest
    ) -> Response:
        await self._check_ledger_key(entry.ledger_id, request.master_key)
        await self.storage.add_entry(entry, request.master_key, recovery=recovery)
        return self._added(request)

    def _added(self, request: AddEntryRequest) -> Response:
        """The OK answer to a durable add, and what it tells metrics and long polls."""
        ledger_id = request.ledger_id
        self.metrics.add_entry_bytes.inc(len(request.payload))
        if self.lac_waiters:
            self.lac_waiters.notify(ledger_id, self._lac_of(ledger_id))
        return AddEntryResponse(request.request_id, Status.OK, ledger_id, request.entry_id)

    async def _read_entry(self, request: ReadEntryRequest) -> Response:
        ledger_id = request.ledger_id
        self._check_shard(ledger_id)
        if request.flags & Flag.FENCE:
            await self._fence(ledger_id, request.master_key)
        try:
            stored = await self.storage.read_entry(ledger_id, request.entry_id)
        except NoSuchEntryError:
            return ReadEntryResponse(
                request.request_id,
                Status.NO_SUCH_ENTRY,
                ledger_id,
                request.entry_id,
                self._lac_of(ledger_id),
                None,
            )
        self.metrics.read_entry_bytes.inc(len(stored.payload))
        wire = WireEntry(stored.entry_id, stored.lac, stored.length, stored.digest, stored.payload)
        return ReadEntryResponse(
            request.request_id, Status.OK, ledger_id, stored.entry_id, self._lac_of(ledger_id), wire
        )

    async def _read_range(self, request: ReadRangeRequest) -> Response:
        ledger_id = request.ledger_id
        self._check_shard(ledger_id)
        if request.flags & Flag.FENCE:
            await self._fence(ledger_id, request.master_key)
        max_count = min(request.max_count, self.limits.max_read_range_count)
        max_bytes = min(request.max_bytes, self.limits.max_read_range_bytes)
        if max_count < request.max_count:
            self.metrics.limit_hit("max_read_range_count")
        if max_bytes < request.max_bytes:
            self.metrics.limit_hit("max_read_range_bytes")
        stored = await self.storage.read_range(
            ledger_id, request.first_entry_id, max_count, max_bytes
        )
        entries = tuple(WireEntry(e.entry_id, e.lac, e.length, e.digest, e.payload) for e in stored)
        self.metrics.read_entry_bytes.inc(sum(len(e.payload) for e in entries))
        status = Status.OK if entries or max_count == 0 else Status.NO_SUCH_ENTRY
        return ReadRangeResponse(
            request.request_id, status, ledger_id, self._lac_of(ledger_id), entries
        )

    async def _read_lac(self, request: ReadLacRequest) -> Response:
        ledger_id = request.ledger_id
        self._check_shard(ledger_id)
        if request.flags & Flag.FENCE:
            await self._fence(ledger_id, request.master_key)
        long_poll = bool(request.flags & Flag.LONG_POLL)
        if not long_poll and self.storage.ledger_state(ledger_id) is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not on {self.config.bookie_id}")
        lac = self._lac_of(ledger_id)
        if long_poll and lac <= request.previous_lac and not self.stopping:
            future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            try:
                self.lac_waiters.add(ledger_id, request.previous_lac, future)
            except TooManyRequestsError:
                self.metrics.limit_hit("max_long_poll_waiters")
                raise
            try:
                async with asyncio.timeout(request.timeout_ms / 1000):
                    await future
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():  # Our task was cancelled, not
                    raise  # just the waiter (which wake_all cancels at shutdown).
            finally:
                self.lac_waiters.remove(ledger_id, future)
            lac = self._lac_of(ledger_id)
        state = self.storage.ledger_state(ledger_id)
        last_entry_id = state.last_entry_id if state is not None else -1
        return ReadLacResponse(request.request_id, Status.OK, ledger_id, lac, last_entry_id)

    async def _write_lac(self, request: WriteLacRequest) -> Response:
        ledger_id = request.ledger_id
        self._check_shard(ledger_id)
        await self._check_ledger_key(ledger_id, request.master_key)
        await self.storage.write_lac(ledger_id, request.master_key, request.lac)
        if self.lac_waiters:
            self.lac_waiters.notify(ledger_id, self._lac_of(ledger_id))
        return WriteLacResponse(request.request_id, Status.OK, ledger_id)

    async def _force(self, request: ForceRequest) -> Response:
        self._check_shard(request.ledger_id)
        await self.storage.force(request.ledger_id)
        return ForceResponse(request.request_id, Status.OK, request.ledger_id)

    async def _list_entries(self, request: ListEntriesRequest) -> Response:
        self._check_shard(request.ledger_id)
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
        for connection in list(self.connections):
            connection.stop_reading()
        self.lac_waiters.wake_all()
        # Journaled fast-path adds are waited for too (answered when durable), never cancelled.
        pending: set[asyncio.Future[Any]] = set(self.tasks) | self._fast_adds
        if pending:
            _, still_running = await asyncio.wait(pending, timeout=timeout_seconds)
            if still_running:
                self.log.warning("drain_timed_out", unfinished_requests=len(still_running))
                tasks = [task for task in still_running if task in self.tasks]
                for task in tasks:
                    task.cancel()
                if tasks:
                    await asyncio.wait(tasks, timeout=1.0)
        for connection in list(self.connections):
            connection.close_after_flush()
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
