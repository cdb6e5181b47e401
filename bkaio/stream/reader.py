"""Reading a stream: across segments, tailing the live one, with an optional durable cursor.

A reader keeps the next seq it will deliver and the stream record as last seen; a metadata
watch on the record keeps that view fresh (new segments, seals, truncation, deletion). Sealed
segments are read in batches up to their last entry. The open segment is read up to its LAC
and then tailed with the ledger's long poll (`wait_for_entry`), raced against the watch so a
roll is noticed at once rather than after a long-poll round. When the writer dies, the open
ledger stays open until a new writer recovers it; the reader sees the ledger sealed and the
next segment appear, and carries on. No busy polling anywhere: every wait is a long poll or a
watch.

"The end" of a stream is exact: the seq after the last record acknowledged to its writer
(`end_seq`), not after the bookies' LAC, which lags the writer by whatever it had in flight
(ReadHandle.read_last_acknowledged). A reader from "latest" starts there, so it delivers none of
the records acknowledged before it opened; `acknowledged_end()` tells a reader where the end is
now, and the reader then delivers every record before it even while the bookies' LAC lags (a
dead writer, explicit LAC off). A segment that cannot be read fails the reader with
StreamSegmentUnreadableError naming the segment.

Durable cursors: `ack(position)` records the position and writes it to
`/cursors/<ns>/<stream>/<name>`; acks that arrive while a write is in flight share the next
write (group commit), and `ack` returns once a write covering its position landed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Literal

import structlog

from bkaio.errors import BKError, MetadataError, NoSuchEntryError, NoSuchLedgerError
from bkaio.ledger_client.errors import copy_error
from bkaio.meta.errors import WatchCompactedError
from bkaio.meta.store import MAX_METADATA_ATTEMPTS
from bkaio.stream.ends import (
    check_position,
    check_start,
    check_written,
    end_seq,
    truncated_error,
)
from bkaio.stream.errors import (
    InvalidStreamArgumentError,
    StreamNotFoundError,
    StreamSegmentUnreadableError,
)
from bkaio.stream.model import CursorState, Segment, StreamMeta, StreamPosition, StreamRecord
from bkaio.stream.segments import STREAM_PASSWORD
from bkaio.stream.store import StreamStore, now_ms
from bkaio.supervision import spawn_job

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from bkaio.ledger_client import BookKeeper, Entry, ReadHandle

log = structlog.get_logger(__name__)

Start = Literal["earliest", "latest"] | StreamPosition


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderOptions:
    # Entries per range request (per bookie) when reading a sealed or confirmed range; the
    # client reads ahead of the consumer (ClientConfig.read_ahead_requests/_bytes).
    batch_entries: int = 256
    long_poll_seconds: float = 1.0  # One tailing long poll; the watch cuts it short.

    def __post_init__(self) -> None:
        if self.batch_entries < 1:
            raise InvalidStreamArgumentError(f"batch_entries={self.batch_entries} must be >= 1")
        if not self.long_poll_seconds > 0:
            raise InvalidStreamArgumentError(
                f"long_poll_seconds={self.long_poll_seconds} must be > 0"
            )


class StreamReader:
    """An async iterator of `StreamRecord`s, in seq order, each exactly once; tails forever."""

    def __init__(
        self,
        *,
        bk: BookKeeper,
        store: StreamStore,
        namespace: str,
        stream: str,
        meta: StreamMeta,
        next_seq: int,
        cursor: str | None,
        acked: StreamPosition | None,
        options: ReaderOptions,
    ) -> None:
        self._bk = bk
        self._store = store
        self.namespace = namespace
        self.stream = stream
        self.cursor = cursor
        self._meta = meta
        self._next_seq = next_seq
        self._options = options
        self._buffer: deque[StreamRecord] = deque()
        self._handle: ReadHandle | None = None  # ReadHandle of the segment being read.
        self._handle_ledger_id = -1
        # The read-ahead over a range of that ledger (`ReadHandle.read_batches`), the entry
        # it yields next and the range's last entry; None when no range is being read.
        self._batches: AsyncGenerator[list[Entry], None] | None = None
        self._batches_next = -1
        self._batches_last = -1
        self._meta_changed = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self._watch_error: BaseException | None = None
        self._acked = acked
        self._persisted = acked
        self._ack_task: asyncio.Task[None] | None = None
        self._cursor_error: BKError | None = None  # Why the last cursor write failed.
        self._closed = False
        self._where = f"{namespace}/{stream}"
        # Records before this seq were acknowledged (`acknowledged_end`): read them even past
        # the bookies' lagging LAC.
        self._acknowledged_end = next_seq

    @property
    def next_seq(self) -> int:
        """The seq of the next record this reader will deliver."""
        return self._next_seq - len(self._buffer)  # Records read ahead are not delivered yet.

    async def acknowledged_end(self) -> int:
        """The seq after the last record acknowledged by now (`end_seq`). The reader delivers
        every record before it, even while the bookies' LAC lags behind the writer's."""
        end = await end_seq(self._bk, await self.refresh())
        self._acknowledged_end = max(self._acknowledged_end, end)
        return end

    @property
    def acked_position(self) -> StreamPosition | None:
        """The cursor's last acknowledged position (None: no cursor or nothing acked)."""
        return self._acked

    def start_watch(self, start_revision: int) -> None:
        """Follow the stream record from `start_revision` (read it after taking the revision)."""
        self._watch_task = spawn_job(
            f"stream-{self._where}-reader-watch",
            partial(self._watch, start_revision),
            kind="stream_reader_watch",
            on_failure=self._watch_failed,
        )

    def _watch_failed(self, error: BaseException) -> None:
        """The watch broke (a bug, logged by the supervisor): the reader fails, not hangs."""
        failure = BKError(f"stream {self._where}: reader watch failed: {type(error).__name__}")
        failure.__cause__ = error
        self._watch_error = failure
        self._meta_changed.set()

    # ------------------------------------------------------------------ iteration

    def __aiter__(self) -> StreamReader:
        return self

    async def __anext__(self) -> StreamRecord:
        if self._closed:
            raise StopAsyncIteration
        while not self._buffer:
            await self._fill()
        return self._buffer.popleft()

    async def read_next(self, timeout: float | None = None) -> StreamRecord | None:  # noqa: ASYNC109
        """The next record, or None when none arrives within `timeout` seconds."""
        if self._buffer:
            return self._buffer.popleft()
        try:
            async with asyncio.timeout(timeout):
                return await self.__anext__()
        except TimeoutError:
            return None

    async def read_batch(
        self,
        max_records: int,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[StreamRecord]:
        """Up to `max_records` records; waits (up to `timeout`) only when none is available."""
        if not self._buffer:
            first = await self.read_next(timeout)
            if first is None:
                return []
            self._buffer.appendleft(first)
        count = min(max_records, len(self._buffer))
        return [self._buffer.popleft() for _ in range(count)]

    # ------------------------------------------------------------------ filling

    async def _fill(self) -> None:
        """Put at least one record in the buffer, waiting as long as it takes."""
        while not self._buffer:
            if self._watch_error is not None:
                raise self._watch_error
            # A change of the record after this view sets `changed`: the waits below return
            # at once for a change that came while this view was being acted on (a ledger
            # opened, a long poll set up), instead of waiting for the change after it.
            meta, changed = self._meta, self._meta_changed
            seq = self._next_seq
            if seq < meta.first_seq:
                raise truncated_error(self._where, seq, meta)
            index = meta.segment_index_for(seq)
            if index is None:
                await changed.wait()  # Past the end of a stream with no writer.
                continue
            segment = meta.segments[index]
            assert segment.first_seq <= seq, (segment, seq)
            try:
                await self._fill_from(segment, seq, changed)
            except (NoSuchLedgerError, NoSuchEntryError) as error:
                # The segment may have been truncated away under us: the record decides.
                fresh = await self._read_record()
                self._adopt(fresh)
                if seq < fresh.first_seq:
                    raise truncated_error(self._where, seq, fresh) from None
                raise self._unreadable(segment, seq, error) from error
            except BKError as error:
                raise self._unreadable(segment, seq, error) from error

    def _unreadable(self, segment: Segment, seq: int, error: BKError) -> BKError:
        last = "(open)" if segment.is_open else str(segment.last_seq)
        records = f"{segment.first_seq}..{last}"
        return StreamSegmentUnreadableError(
            f"stream {self._where}: segment ledger {segment.ledger_id} (records {records}) "
            f"cannot be read at seq {seq}: {type(error).__name__}: {error}",
            segment,
        )

    async def _fill_from(self, segment: Segment, seq: int, changed: asyncio.Event) -> None:
        """Buffer records of `segment` from `seq`; `changed` is set once the record changed
        after the view `segment` came from."""
        handle = await self._open(segment)
        entry_id = seq - segment.first_seq
        if not segment.is_open:
            last = segment.last_seq - segment.first_seq
        elif handle.is_closed:
            last = handle.last_entry_id  # Sealed (recovered or rolled); the record lags.
        else:
            last = handle.last_add_confirmed
            if entry_id > last and seq < self._acknowledged_end:
                # Acknowledged, past the LAC the bookies confirm: find the exact end once.
                last = await handle.read_last_acknowledged()
        if entry_id <= last:
            await self._read_range(segment, entry_id, last)
            return
        # A sealed segment never ends before a seq it was picked for (segment_index_for).
        assert segment.is_open, (segment, seq)
        if handle.is_closed:
            # The ledger was sealed (a roll, or a new writer's recovery) but the record does
            # not say so yet: the watch brings the next segment.
            await changed.wait()
            return
        await self._tail(segment, handle, entry_id, changed)

    async def _read_range(self, segment: Segment, first_entry_id: int, last_entry_id: int) -> None:
        """Buffer the next batch of first..last, from the read-ahead over that range (started
        here when it is not the one under way)."""
        handle = self._handle
        assert handle is not None and self._handle_ledger_id == segment.ledger_id
        if self._batches is None or self._batches_next != first_entry_id:
            await self._stop_batches()
            self._batches = handle.read_batches(
                first_entry_id, last_entry_id, batch_entries=self._options.batch_entries
            )
            self._batches_next = first_entry_id
            self._batches_last = last_entry_id
        try:
            entries = await anext(self._batches)
        except BaseException:
            await self._stop_batches()
            raise
        seq = segment.first_seq + entries[0].entry_id
        assert seq == self._next_seq, (seq, self._next_seq)
        position = segment.position
        self._buffer.extend(
            StreamRecord(position(seq + index), entry.payload)
            for index, entry in enumerate(entries)
        )
        self._next_seq = seq + len(entries)
        self._batches_next = entries[-1].entry_id + 1
        if self._batches_next > self._batches_last:
            await self._stop_batches()

    async def _stop_batches(self) -> None:
        """Close the read-ahead (what it has in flight is cancelled)."""
        batches, self._batches = self._batches, None
        if batches is not None:
            await batches.aclose()

    async def _tail(
        self, segment: Segment, handle: ReadHandle, entry_id: int, changed: asyncio.Event
    ) -> None:
        """Long-poll the open ledger for `entry_id` and whatever follows it, cut short by a
        change of the record; the poll's answer carries the entries themselves."""
        poll = asyncio.ensure_future(
            handle.wait_for_entries(entry_id, timeout=self._options.long_poll_seconds)
        )
        change = asyncio.ensure_future(changed.wait())
        try:
            await asyncio.wait((poll, change), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (poll, change):
                if not task.done():
                    task.cancel()
            await asyncio.gather(poll, change, return_exceptions=True)
        if poll.cancelled():
            return
        error = poll.exception()
        if isinstance(error, NoSuchEntryError) and handle.is_closed:
            return  # Sealed before entry_id: the loop sees it and waits for the next segment.
        if error is not None:
            raise error
        entries = poll.result()
        if entries:
            assert entries[0].entry_id == entry_id
            seq = self._next_seq
            position = segment.position
            self._buffer.extend(
                StreamRecord(position(seq + index), entry.payload)
                for index, entry in enumerate(entries)
            )
            self._next_seq = seq + len(entries)

    async def _open(self, segment: Segment) -> ReadHandle:
        if self._handle_ledger_id != segment.ledger_id:
            await self._stop_batches()
            if self._handle is not None:
                await self._handle.close()
            self._handle = await self._bk.open_ledger(
                segment.ledger_id, password=STREAM_PASSWORD, recovery=False
            )
            self._handle_ledger_id = segment.ledger_id
        assert self._handle is not None
        return self._handle

    # ------------------------------------------------------------------ the record

    def _adopt(self, meta: StreamMeta) -> None:
        if meta.version >= self._meta.version:
            self._meta = meta

    async def _watch(self, start_revision: int) -> None:
        revision, restarts = start_revision, 0
        try:
            while True:
                try:
                    watch = self._store.watch_stream(self.namespace, self.stream, revision)
                    async for meta in watch:
                        restarts = 0
                        self._seen(meta)
                    return
                except WatchCompactedError as error:
                    # The changes after `revision` were compacted away (a watch cut off for
                    # longer than the store keeps them): read the record as it is now and
                    # watch from after that read, as the error asks; a bounded number of
                    # times in a row without a change seen in between.
                    restarts += 1
                    if restarts > MAX_METADATA_ATTEMPTS:
                        raise
                    log.info("stream_reader_watch_restarted", stream=self._where, error=str(error))
                    revision = await self._store.current_revision() + 1
                    fresh = await self._store.find_stream(self.namespace, self.stream)
                    same = fresh is not None and fresh.ctime_ms == self._meta.ctime_ms
                    self._seen(fresh if same else None)  # Another stream of the name: deleted.
        except BKError as error:
            self._watch_error = error
            log.warning("stream_reader_watch_failed", stream=self._where, error=str(error))
            self._meta_changed.set()

    def _seen(self, meta: StreamMeta | None) -> None:
        """A version of the record (None: deleted) from the watch: adopt it, wake the reader."""
        if meta is None:
            raise StreamNotFoundError(f"stream {self._where} was deleted")
        self._adopt(meta)
        changed, self._meta_changed = self._meta_changed, asyncio.Event()
        changed.set()

    async def refresh(self) -> StreamMeta:
        """Re-read the stream record now (the watch does this on its own)."""
        self._adopt(await self._read_record())
        return self._meta

    async def _read_record(self) -> StreamMeta:
        """The record now. StreamNotFoundError when the stream is gone, also when another
        stream of the name replaced it (another creation time): its segments, seqs and
        versions have nothing to do with this reader's."""
        meta = await self._store.get_stream(self.namespace, self.stream)
        if meta.ctime_ms != self._meta.ctime_ms:
            raise StreamNotFoundError(
                f"stream {self._where} was deleted (a new stream of that name exists)"
            )
        return meta

    # ------------------------------------------------------------------ cursor

    async def ack(self, position: StreamPosition) -> None:
        """Persist `position` as the cursor's last consumed record; returns once it is durable.

        Acks arriving while a write is in flight are folded into the next write (batched).
        An ack behind the cursor is a no-op; one past what this reader delivered is an error.
        """
        if self.cursor is None:
            raise InvalidStreamArgumentError(f"stream {self._where}: this reader has no cursor")
        if position.seq >= self.next_seq:
            raise InvalidStreamArgumentError(
                f"stream {self._where}: cannot ack {position}: this reader has delivered only "
                f"up to seq {self.next_seq - 1}"
            )
        if self._acked is None or position.seq > self._acked.seq:
            self._acked = position
        while self._persisted != self._acked:
            if self._ack_task is None:
                self._cursor_error = None
                self._ack_task = spawn_job(
                    f"stream-{self._where}-cursor-{self.cursor}",
                    self._write_cursor,
                    kind="stream_cursor_write",
                    on_failure=self._cursor_write_failed,
                )
            await asyncio.shield(self._ack_task)
            if self._cursor_error is not None:
                raise copy_error(self._cursor_error)

    async def _write_cursor(self) -> None:
        try:
            target = self._acked
            assert target is not None and self.cursor is not None
            if isinstance(self._watch_error, StreamNotFoundError):
                raise copy_error(self._watch_error)
            try:
                await self._store.put_cursor(
                    self.namespace, self.stream, self.cursor, CursorState(target, now_ms())
                )
            except MetadataError:  # It may have landed all the same (a lost reply).
                with contextlib.suppress(MetadataError):
                    await self._check_cursor_outlives_nothing()
                raise
            await self._check_cursor_outlives_nothing()
            self._persisted = target
        except BKError as error:
            self._cursor_error = error  # The acks waiting for this write raise it.
        finally:
            self._ack_task = None

    async def _check_cursor_outlives_nothing(self) -> None:
        """StreamNotFoundError, and the cursor just written removed, when the stream this
        reader reads is gone. `delete_stream` removes the record, then the cursors: a cursor
        write landing after that would outlive the stream, and a reader of a new stream of the
        same name would resume after this seq, skipping that stream's records before it.
        Whichever order the deletion and this write land in, one of the two removes the
        cursor. A new stream of the name is told apart by its creation time."""
        assert self.cursor is not None
        fresh = await self._store.find_stream(self.namespace, self.stream)
        if fresh is not None and fresh.ctime_ms == self._meta.ctime_ms:
            return
        await self._store.delete_cursor(self.namespace, self.stream, self.cursor)
        raise StreamNotFoundError(
            f"stream {self._where} was deleted: cursor {self.cursor!r} was not kept"
        )

    def _cursor_write_failed(self, error: BaseException) -> None:
        failure = BKError(f"stream {self._where}: cursor write failed: {type(error).__name__}")
        failure.__cause__ = error
        self._cursor_error = failure

    async def close(self) -> None:
        """Stop watching; pending cursor writes finish first."""
        if self._closed:
            return
        self._closed = True
        if self._ack_task is not None:
            with contextlib.suppress(BKError):
                await asyncio.shield(self._ack_task)
        await self._stop_batches()
        if self._handle is not None:
            await self._handle.close()
        if self._watch_task is not None:
            await cancel_and_wait(self._watch_task)

    async def __aenter__(self) -> StreamReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait for it to end.

    Cancels again while it keeps running: on Python 3.11 a cancellation that lands just as an
    `asyncio.timeout` inside the task expires can be swallowed (the SQLite driver's watch polls
    that way), and a single cancel would then wait forever.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait((task,), timeout=0.1)
    if not task.cancelled() and task.exception() is not None:
        log.debug("stream_task_failed", task=task.get_name(), error=str(task.exception()))


async def open_reader(
    bk: BookKeeper,
    store: StreamStore,
    namespace: str,
    stream: str,
    start: Start,
    cursor: str | None,
    options: ReaderOptions,
) -> StreamReader:
    """A reader from `start`, or from after the cursor's last ack when the cursor exists.

    A start before the first available record is StreamTruncatedError; one past the next seq,
    with a negative field, or whose ledger and entry are not the stream's at its seq,
    InvalidStreamArgumentError (`check_start`, `check_written`, `check_position`), as is a
    cursor past the next seq (left by an earlier stream of the name)."""
    where = f"{namespace}/{stream}"
    check_start(where, start)  # Even when a cursor wins over it: a bad argument either way.
    start_revision = await store.current_revision() + 1
    meta = await store.get_stream(namespace, stream)
    acked: StreamPosition | None = None
    state = None if cursor is None else await store.get_cursor(namespace, stream, cursor)
    if state is not None:
        acked = state.position
        next_seq = acked.seq + 1
    elif start == "earliest":
        next_seq = meta.first_seq
    elif start == "latest":
        next_seq = await end_seq(bk, meta)
    else:
        assert isinstance(start, StreamPosition), start  # check_start
        next_seq = start.seq
    if next_seq < meta.first_seq:
        raise truncated_error(where, next_seq, meta)
    if state is not None:
        await check_written(bk, where, next_seq, meta, cursor=cursor)
    elif isinstance(start, StreamPosition):
        await check_written(bk, where, next_seq, meta)
        check_position(where, start, meta)  # Its ledger and entry, not only its seq.
    reader = StreamReader(
        bk=bk,
        store=store,
        namespace=namespace,
        stream=stream,
        meta=meta,
        next_seq=next_seq,
        cursor=cursor,
        acked=acked,
        options=options,
    )
    reader.start_watch(start_revision)  # Every change after the record was read.
    return reader
