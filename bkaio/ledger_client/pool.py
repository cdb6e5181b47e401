"""`BookiePool`: the wire implementation of `BookieOps` (bkaio/ledger_client/types.py).

One `BookieConnection` (bookie_connection.py) per (bookie, shard), created on first use; the
pool turns each operation into requests on the right connection and their answers into results
or errors, and runs the deferred add batches of every ledger in one callback per loop iteration.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence
from types import MethodType
from typing import Any

import structlog

from bkaio.errors import (
    BKError,
    BookieUnavailableError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
    error_for_status,
)
from bkaio.ledger_client.bookie_connection import (
    _ADD_ENTRY_FIELDS,
    _ADD_FLAGS,
    _OP_ADD_ENTRY,
    _RECOVERY_ADD_FLAGS,
    _T,
    BookieConnection,
)
from bkaio.ledger_client.connection_lifecycle import BookieAddress
from bkaio.ledger_client.types import (
    AddCallback,
    ClientConfig,
    EntriesAnswer,
    LacAnswer,
    StoredCopy,
)
from bkaio.protocol import (
    Flag,
    FrameEncoder,
    ListEntriesResponse,
    Op,
    ReadEntriesResponse,
    ReadEntryResponse,
    ReadLacResponse,
    ReadRangeResponse,
    Response,
    Status,
    WireEntry,
)
from bkaio.protocol.records import pack_record
from bkaio.supervision import loop_supervisor

log = structlog.get_logger(__name__)


class BookiePool:
    """`BookieOps` over the wire: routes each request to the connection of its ledger's shard."""

    def __init__(
        self,
        config: ClientConfig,
        resolve: Callable[[str], BookieAddress | None],
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._config = config
        self._resolve = resolve
        self._tls = tls
        self._connections: dict[tuple[str, int], BookieConnection] = {}
        self._loop = asyncio.get_running_loop()
        self._packer = FrameEncoder(config.max_frame_bytes)  # Only its pack_fields is used.
        # `defer_send`: the ledger handles' batches of this loop iteration, sent together at
        # its end, and the connections they went to, written at once after them.
        self._deferred: list[Callable[[], None]] = []
        self._touched: set[BookieConnection] = set()
        self._closed = False  # `close` ran: no connection is made any more.

    def defer_send(self, send: Callable[[], None]) -> None:
        """Run `send` (a ledger handle's `_send_unsent`) once this loop iteration's callbacks
        ran, with every other one deferred meanwhile; then write the connections they used.

        Batches of many ledgers to one bookie go out in one write, and none waits for a
        further loop iteration (which would add a poll and whatever it brings in first).
        """
        deferred = self._deferred
        deferred.append(send)
        if len(deferred) == 1:
            self._loop.call_soon(self._send_deferred)

    def _send_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for send in deferred:
            try:
                send()
            except Exception as error:  # One handle's failure must not hold the others back.
                loop_supervisor().report("deferred_send", error)
        touched, self._touched = self._touched, set()
        for connection in touched:
            connection.flush_now()

    def _connection(self, bookie_id: str, ledger_id: int) -> BookieConnection:
        if self._closed:  # A connection made now would outlive its client, never closed.
            raise BookieUnavailableError(f"bookie {bookie_id}: the client is closed")
        address = self._resolve(bookie_id)
        if address is None:
            raise BookieUnavailableError(f"bookie {bookie_id} is not registered (never seen)")
        shard = ledger_id % address.shard_count
        key = (bookie_id, shard)
        connection = self._connections.get(key)
        if connection is None:
            connection = BookieConnection(
                bookie_id=bookie_id,
                host=address.host,
                port=address.port + shard,
                shard_index=shard,
                config=self._config,
                tls=self._tls,
                resolve=self._resolve,
            )
            self._connections[key] = connection
        return connection

    def _call(
        self, bookie_id: str, ledger_id: int, op: Op, fields: tuple[Any, ...], timeout: float
    ) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = self._loop.create_future()

        def done(result: Response | BKError) -> None:
            if future.done():
                return
            if isinstance(result, BKError):
                future.set_exception(result)
            else:
                future.set_result(result)

        try:
            connection = self._connection(bookie_id, ledger_id)
        except BKError as error:
            future.set_exception(error)
            return future
        connection.send(op, fields, done, timeout)
        return future

    async def _call_ok(
        self,
        bookie_id: str,
        ledger_id: int,
        op: Op,
        fields: tuple[Any, ...],
        deadline_seconds: float,
        what: str,
    ) -> Response:
        """`_call`, raising the error a status other than OK maps to (`what` names the call)."""
        response = await self._call(bookie_id, ledger_id, op, fields, deadline_seconds)
        if response.status is not Status.OK:
            raise error_for_status(
                response.status, f"bookie {bookie_id}: {what}: {response.status.name}"
            )
        return response

    def add_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        recovery: bool,
        master_key: bytes,
        lac: int,
        length: int,
        digest: int,
        payload: bytes,
        callback: AddCallback,
    ) -> None:
        """Send one ADD_ENTRY; `callback(None)` once the bookie made it durable."""
        try:
            connection = self._connection(bookie_id, ledger_id)
        except BKError as error:
            self._loop.call_soon(callback, error)
            return
        flags = _RECOVERY_ADD_FLAGS if recovery else _ADD_FLAGS
        body = [_OP_ADD_ENTRY, 0, ledger_id, entry_id, flags, master_key, lac, length, digest]
        body.append(payload)
        connection.send_body(body, callback, self._config.add_timeout)

    def add_entries(
        self,
        bookie_id: str,
        ledger_id: int,
        recovery: bool,
        master_key: bytes,
        handler: Callable[[_T, BKError | None], None],
        adds: Sequence[_T],
        frames: Sequence[tuple[int, int, list[bytes], int]],
    ) -> bool:
        """Send `adds` to `bookie_id` as ADD_ENTRIES `frames` (`BookieConnection.send_adds`).

        False, having sent nothing, when that bookie's connection does not take ADD_ENTRIES
        frames now (not connected yet, an older bookie): the caller sends them one by one.
        """
        address = self._resolve(bookie_id)
        connection = (
            None
            if address is None
            else self._connections.get((bookie_id, ledger_id % address.shard_count))
        )
        if connection is None or not connection.batches_adds:
            return False
        flags = _RECOVERY_ADD_FLAGS if recovery else _ADD_FLAGS
        connection.send_adds(
            ledger_id, flags, master_key, handler, adds, frames, self._config.add_timeout
        )
        self._touched.add(connection)  # Written by `_send_deferred` (else by its own flush).
        return True

    def when_writable(self, bookie_id: str, ledger_id: int, callback: Callable[[], None]) -> bool:
        """`BookieConnection.when_writable` of the connection `ledger_id`'s adds to
        `bookie_id` use; False when there is none (nothing to wait for)."""
        address = self._resolve(bookie_id)
        connection = (
            None
            if address is None
            else self._connections.get((bookie_id, ledger_id % address.shard_count))
        )
        return connection is not None and connection.when_writable(callback)

    def add_entry_many(
        self,
        targets: Sequence[tuple[str, Callable[[_T, BKError | None], None]]],
        add: _T,
        ledger_id: int,
        entry_id: int,
        recovery: bool,  # Positional on purpose: called once per append.
        master_key: bytes,
        lac: int,
        length: int,
        digest: int,
        payload: bytes,
    ) -> None:
        """`add_entry` to each (bookie, handler) of `targets`, the fields packed only once.

        A bookie's answer calls `handler(add, None)` for OK, else `handler(add, error)`: the
        caller keeps one handler per bookie instead of making a callback per add and bookie.
        """
        flags = _RECOVERY_ADD_FLAGS if recovery else _ADD_FLAGS
        packed_entry = packed = None  # Packed on first use: ADD_ENTRIES or ADD_ENTRY fields.
        timeout = self._config.add_timeout
        resolve = self._resolve
        connections = self._connections
        for bookie_id, handler in targets:
            callback = MethodType(handler, add)
            # `_connection` written out: the shard's connection is found without a call.
            address = resolve(bookie_id)
            connection = (
                None
                if address is None
                else connections.get((bookie_id, ledger_id % address.shard_count))
            )
            if connection is None:
                try:
                    connection = self._connection(bookie_id, ledger_id)
                except BKError as error:
                    self._loop.call_soon(callback, error)
                    continue
            if connection.batches_adds:
                if packed_entry is None:
                    packed_entry = self._packer.pack_fields(
                        [entry_id, lac, length, digest, payload]
                    )
                connection.send_add_to_entries(
                    ledger_id, flags, master_key, packed_entry, callback, timeout
                )
                continue
            if packed is None:
                packed = self._packer.pack_fields(
                    [ledger_id, entry_id, flags, master_key, lac, length, digest, payload]
                )
            connection.send_prepacked(_OP_ADD_ENTRY, _ADD_ENTRY_FIELDS, packed, callback, timeout)

    async def read_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
    ) -> StoredCopy:
        """READ_ENTRY from one bookie; raises the error its status maps to."""
        flags = int(Flag.FENCE) if fence else 0
        response = await self._call_ok(
            bookie_id,
            ledger_id,
            Op.READ_ENTRY,
            (ledger_id, entry_id, flags, master_key),
            self._config.read_timeout,
            f"read of ledger {ledger_id} entry {entry_id}",
        )
        assert isinstance(response, ReadEntryResponse)
        entry = response.entry
        if entry is None:
            raise ProtocolError(f"bookie {bookie_id}: OK read of entry {entry_id} with no entry")
        return StoredCopy(entry.entry_id, entry.lac, entry.length, entry.digest, entry.payload)

    async def read_entries(
        self,
        bookie_id: str,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        stride: int = 1,
        max_count: int,
        max_bytes: int,
        previous_lac: int | None = None,
        long_poll_seconds: float = 0.0,
    ) -> EntriesAnswer:
        """READ_ENTRIES to one bookie (`BookieOps.read_entries`); digests are not checked here.

        A bookie without the feature is asked with the older requests instead
        (`_read_entries_by_older_ops`); a new connection's HELLO answer, which says, is waited
        for first.
        """
        connection = self._connection(bookie_id, ledger_id)
        await connection.wait_ready()
        if not connection.reads_entries:
            return await self._read_entries_by_older_ops(
                bookie_id, ledger_id, first_entry_id, last_entry_id, stride, max_count, max_bytes,
                previous_lac, long_poll_seconds,
            )  # fmt: skip
        flags = Flag.NONE
        timeout_ms = 0
        if previous_lac is not None:
            flags = Flag.LONG_POLL
            timeout_ms = max(1, int(long_poll_seconds * 1000))
        response = await self._call_ok(
            bookie_id,
            ledger_id,
            Op.READ_ENTRIES,
            (
                ledger_id,
                first_entry_id,
                last_entry_id,
                stride,
                max_count,
                max_bytes,
                int(flags),
                -1 if previous_lac is None else previous_lac,
                timeout_ms,
            ),
            self._config.read_timeout + timeout_ms / 1000,
            f"read of ledger {ledger_id} entries {first_entry_id}..{last_entry_id}",
        )
        assert isinstance(response, ReadEntriesResponse)
        return EntriesAnswer(response.lac, response.next_entry_id, response.records_bytes)

    async def _read_entries_by_older_ops(
        self,
        bookie_id: str,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        stride: int,
        max_count: int,
        max_bytes: int,
        previous_lac: int | None,
        long_poll_seconds: float,
    ) -> EntriesAnswer:
        """`read_entries` through READ_LAC, READ_RANGE and READ_ENTRY, for bookies that predate
        READ_ENTRIES: a long poll answers with the LAC only, a stride read with one entry."""
        if previous_lac is not None:
            answer = await self.read_lac(
                bookie_id,
                ledger_id,
                previous_lac=previous_lac,
                long_poll_seconds=long_poll_seconds,
            )
            return EntriesAnswer(answer.lac, first_entry_id, b"")
        try:
            if stride == 1:
                count = min(max_count, last_entry_id - first_entry_id + 1)
                response = await self._call_ok(
                    bookie_id,
                    ledger_id,
                    Op.READ_RANGE,
                    (ledger_id, first_entry_id, count, max_bytes, 0, None),
                    self._config.read_timeout,
                    f"range read of ledger {ledger_id} from entry {first_entry_id}",
                )
                assert isinstance(response, ReadRangeResponse)
                entries = response.entries
                lac = response.lac
            else:
                copy = await self.read_entry(bookie_id, ledger_id, first_entry_id)
                entries = (
                    WireEntry(copy.entry_id, copy.lac, copy.length, copy.digest, copy.payload),
                )
                lac = -1
        except NoSuchEntryError:  # The first one is missing: the answer covers it alone.
            return EntriesAnswer(-1, first_entry_id + stride, b"")
        parts: list[bytes] = []
        for e in entries:
            parts += pack_record(ledger_id, e.entry_id, e.lac, e.length, e.digest, e.payload)
        next_entry_id = first_entry_id + stride * max(1, len(entries))
        return EntriesAnswer(lac, next_entry_id, b"".join(parts))

    async def read_lac(
        self,
        bookie_id: str,
        ledger_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
        previous_lac: int | None = None,
        long_poll_seconds: float = 0.0,
    ) -> LacAnswer:
        """READ_LAC (optionally fencing, optionally long-polling past `previous_lac`)."""
        flags = Flag.FENCE if fence else Flag.NONE
        timeout_ms = 0
        if previous_lac is not None:
            flags |= Flag.LONG_POLL
            timeout_ms = max(1, int(long_poll_seconds * 1000))
        response = await self._call_ok(
            bookie_id,
            ledger_id,
            Op.READ_LAC,
            (
                ledger_id,
                int(flags),
                master_key,
                -1 if previous_lac is None else previous_lac,
                timeout_ms,
            ),
            self._config.read_timeout + timeout_ms / 1000,
            f"READ_LAC of ledger {ledger_id}",
        )
        assert isinstance(response, ReadLacResponse)
        return LacAnswer(response.lac, response.last_entry_id)

    async def list_entries(self, bookie_id: str, ledger_id: int) -> list[tuple[int, int]]:
        """LIST_ENTRIES: the entries of the ledger the bookie holds, as ascending inclusive
        ranges (empty when it has none of the ledger). DataUnknownError from a bookie with the
        ledger in limbo: its list proves nothing."""
        try:
            response = await self._call_ok(
                bookie_id,
                ledger_id,
                Op.LIST_ENTRIES,
                (ledger_id,),
                self._config.read_timeout,
                f"LIST_ENTRIES of ledger {ledger_id}",
            )
        except NoSuchLedgerError:
            return []
        assert isinstance(response, ListEntriesResponse)
        return [(first, last) for first, last in response.ranges]

    async def write_lac(self, bookie_id: str, ledger_id: int, master_key: bytes, lac: int) -> None:
        """WRITE_LAC to one bookie."""
        response = await self._call(
            bookie_id,
            ledger_id,
            Op.WRITE_LAC,
            (ledger_id, master_key, lac),
            self._config.add_timeout,
        )
        if response.status is not Status.OK:
            raise error_for_status(
                response.status,
                f"bookie {bookie_id}: WRITE_LAC of ledger {ledger_id}: {response.status.name}",
            )

    async def close(self) -> None:
        """Close every connection; later requests fail at once with BookieUnavailableError."""
        self._closed = True
        connections, self._connections = self._connections, {}
        for connection in connections.values():
            await connection.close()
