"""The one writer of a stream: pipelined writes, transparent ledger rolls. Opening it
(fencing the last one) is bkaio/stream/opening.py's.

Rolling: once the current segment reaches `roll_bytes` or `roll_seconds`, the writer seals its
ledger (after every pending add resolved), creates the next one and CASes both changes into the
record *before* writing to the new ledger, so nothing acknowledged ever sits in a ledger the
record does not name. Writes that arrive meanwhile wait in order and go to the new ledger. A
CAS that finds another epoch (or no record) means the writer was fenced.

Backpressure is the ledger handle's (ClientConfig.max_outstanding_adds + max_queued_adds, what a
fresh handle takes at once): past it a write is refused with TooManyRequestsError, whether the
handle refuses it or it would be held during a roll, and the writer goes on. Held writes go to
the new ledger as far as it takes them; the rest stay held, in order, until it has room again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import structlog

from bkaio.errors import (
    BKError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    QuotaExceededError,
    TooManyRequestsError,
)
from bkaio.ledger_client.errors import copy_error
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, metadata_attempts_exhausted
from bkaio.stream.errors import InvalidStreamArgumentError, StreamNotFoundError
from bkaio.stream.model import NamespaceSettings, Segment, SegmentState, StreamMeta, StreamPosition
from bkaio.stream.segments import (
    STREAM_PASSWORD,
    namespace_sealed_bytes,
    stream_ledger_metadata,
)
from bkaio.stream.store import StreamStore, now_ms
from bkaio.supervision import spawn_job

if TYPE_CHECKING:
    from bkaio.ledger_client import BookKeeper, LedgerHandle

log = structlog.get_logger(__name__)

_QUOTA_REFRESH_SECONDS = 1.0  # How stale the namespace's sealed-bytes figure may get.


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterOptions:
    roll_bytes: int = 256 << 20
    roll_seconds: float = 600.0
    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2

    def __post_init__(self) -> None:
        if self.roll_bytes < 1:
            raise InvalidStreamArgumentError(f"roll_bytes={self.roll_bytes} must be >= 1")
        if not self.roll_seconds > 0:
            raise InvalidStreamArgumentError(f"roll_seconds={self.roll_seconds} must be > 0")
        if not 1 <= self.ack_quorum <= self.write_quorum <= self.ensemble_size:
            raise InvalidStreamArgumentError(
                f"need ensemble_size ({self.ensemble_size}) >= write_quorum "
                f"({self.write_quorum}) >= ack_quorum ({self.ack_quorum}) >= 1"
            )


class StreamWriter:
    """The writer of one stream (from `Namespace.open_writer`). Not safe to share between loops."""

    def __init__(
        self,
        *,
        bk: BookKeeper,
        store: StreamStore,
        namespace: str,
        stream: str,
        settings: NamespaceSettings,
        options: WriterOptions,
        meta: StreamMeta,
        handle: LedgerHandle,
        sealed_namespace_bytes: int,
    ) -> None:
        segment = meta.open_segment
        assert segment is not None and segment.ledger_id == handle.ledger_id, (meta, handle)
        self._bk = bk
        self._store = store
        self.namespace = namespace
        self.stream = stream
        self._settings = settings
        self._options = options
        self._meta = meta
        self.epoch = meta.epoch
        self._handle = handle
        self._segment = segment
        self._segment_started = time.monotonic()
        self._segment_bytes = 0  # Bytes handed to the current ledger.
        self._held: deque[tuple[bytes, asyncio.Future[StreamPosition]]] = deque()
        self._held_bytes = 0
        # As many writes as a ledger handle takes at once: the held ones all fit the next one.
        # Counted, not bounded in bytes while held (a roll is short; quota_bytes counts held
        # bytes); once handed over, the handle bounds its bytes in flight
        # (ClientConfig.max_outstanding_add_bytes) and queues the rest.
        self._max_held = bk.config.max_outstanding_adds + bk.config.max_queued_adds
        self._max_entry_bytes = bk.config.max_entry_bytes
        # Set while writes go straight to the handle: no roll, nothing held (wait_for_capacity).
        self._not_holding = asyncio.Event()
        self._not_holding.set()
        self._resend_task: asyncio.Task[None] | None = None
        self._roll_task: asyncio.Task[None] | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._sealed_namespace_bytes = sealed_namespace_bytes
        self._usage_checked = time.monotonic()
        self._unresolved = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._error: BaseException | None = None
        self._closing = False
        self._closed = False
        self._last_position: StreamPosition | None = None
        self._loop = asyncio.get_running_loop()
        self._where = f"{namespace}/{stream}"
        self._log = log.bind(stream=self._where, epoch=self.epoch)

    # ------------------------------------------------------------------ public surface

    @property
    def last_position(self) -> StreamPosition | None:
        """The position of the last acknowledged record this writer wrote (None: none yet)."""
        return self._last_position

    @property
    def segment(self) -> Segment:
        """The open segment this writer currently appends to."""
        return self._segment

    def write(self, payload: bytes) -> asyncio.Future[StreamPosition]:
        """Append `payload` as the stream's next record; returns a future of its position.

        Sent at once (pipelined like `LedgerHandle.append`); futures resolve in write order
        once the ack quorum confirmed the record. Raises QuotaExceededError when the namespace
        quota would be exceeded, LedgerClosedError after `close`, and the writer's failure
        (LedgerFencedError once another writer opened the stream) after it failed.
        InvalidStreamArgumentError (the writer goes on) for a payload above the client's
        `max_entry_bytes` (max_frame_bytes - 4096).
        TooManyRequestsError (the write is refused, the writer goes on) past the ledger
        handle's max_outstanding_adds + max_queued_adds, counting writes held during a roll:
        await earlier writes or `wait_for_capacity()`.
        """
        if self._closing:
            raise LedgerClosedError(f"stream {self._where}: write after close")
        if self._error is not None:
            raise copy_error(self._error)
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise InvalidStreamArgumentError(
                f"stream {self._where}: payload must be bytes, got {type(payload).__name__}"
            )
        payload = bytes(payload)
        # Refused here, not by the ledger handle: `_submit` fails the writer on its refusal.
        if len(payload) > self._max_entry_bytes:
            raise InvalidStreamArgumentError(
                f"stream {self._where}: payload of {len(payload)} bytes is above the entry "
                f"limit of {self._max_entry_bytes} (the client's max_frame_bytes - 4096)"
            )
        self._check_quota(len(payload))
        holding = self._roll_task is not None or bool(self._held)  # Order: behind held ones.
        if holding and len(self._held) >= self._max_held:
            raise TooManyRequestsError(
                f"stream {self._where}: {len(self._held)} writes already held for the next "
                f"ledger (max_outstanding_adds + max_queued_adds = {self._max_held}); await "
                f"earlier writes or wait_for_capacity()"
            )
        future: asyncio.Future[StreamPosition] = self._loop.create_future()
        self._unresolved += 1
        self._idle.clear()
        if holding:
            self._held.append((payload, future))
            self._held_bytes += len(payload)
            return future
        try:
            self._submit(payload, future)
        except TooManyRequestsError:  # Refused before an entry id was assigned: uncount it.
            self._settled()
            raise
        if self._roll_due():
            self._start_roll()
        return future

    async def wait_for_capacity(self) -> None:
        """Return once a write would be sent at once: no roll or earlier write holds it, and
        the ledger handle would not queue it (`LedgerHandle.wait_for_capacity`). Returns at
        once after `close` or a failure (the next write raises it)."""
        while self._error is None and not self._closing:
            if not self._not_holding.is_set():
                await self._not_holding.wait()
                continue
            handle = self._handle
            await handle.wait_for_capacity()
            if handle is self._handle and self._not_holding.is_set():
                return

    async def flush(self) -> None:
        """Wait until every record written so far is acknowledged (or failed)."""
        await self._idle.wait()
        if self._error is not None:
            raise copy_error(self._error)

    async def close(self) -> None:
        """Wait for pending writes, seal the open segment and record it in the stream.

        Idempotent. Raises the writer's failure (LedgerFencedError when fenced) if it failed.
        """
        if self._closed:
            return
        self._closing = True
        try:
            await self._idle.wait()
            while self._roll_task is not None:
                await asyncio.shield(self._roll_task)
                await self._idle.wait()
            if self._error is not None:
                raise copy_error(self._error)
            sealed = await self._seal_handle()
            await self._cas_segments(sealed, None)
            self._log.info("stream_writer_closed", last_seq=sealed.last_seq)
        finally:
            self._closed = True
            await self._stop_refresh()

    async def __aenter__(self) -> StreamWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._error is None:
            await self.close()
        else:
            self._closed = True
            await self._stop_refresh()

    # ------------------------------------------------------------------ writes

    def _submit(self, payload: bytes, future: asyncio.Future[StreamPosition]) -> None:
        """Append to the current ledger. TooManyRequestsError (backpressure: nothing was
        assigned) is the caller's to handle; any other refusal fails the writer."""
        handle = self._handle
        try:
            entry_future = handle.append(payload)
        except TooManyRequestsError:
            raise
        except BKError as error:
            self._fail(error)
            self._resolve(future, error=error)
            return
        entry_id = handle.last_add_pushed
        segment = self._segment
        position = StreamPosition(segment.ledger_id, entry_id, segment.first_seq + entry_id)
        self._segment_bytes += len(payload)
        entry_future.add_done_callback(partial(self._entry_done, future, position))

    def _entry_done(
        self,
        future: asyncio.Future[StreamPosition],
        position: StreamPosition,
        entry_future: asyncio.Future[int],
    ) -> None:
        if entry_future.cancelled():
            error: BaseException = LedgerClosedError(f"stream {self._where}: write cancelled")
        else:
            error_or_none = entry_future.exception()
            if error_or_none is None:
                self._last_position = position
                self._resolve(future, position=position)
                return
            error = error_or_none
        self._fail(error)
        self._resolve(future, error=error)

    def _resolve(
        self,
        future: asyncio.Future[StreamPosition],
        *,
        position: StreamPosition | None = None,
        error: BaseException | None = None,
    ) -> None:
        if not future.done():
            if error is not None:
                future.set_exception(copy_error(error))
            else:
                assert position is not None
                future.set_result(position)
        self._settled()

    def _settled(self) -> None:
        """One write is no longer unresolved (resolved, or refused after it was counted)."""
        self._unresolved -= 1
        assert self._unresolved >= 0, self._unresolved
        if self._unresolved == 0:
            self._idle.set()

    def _fail(self, error: BaseException) -> None:
        """Stop the writer: held writes fail with `error`; later writes raise it."""
        if self._error is not None:
            return
        self._error = error
        self._log.warning("stream_writer_failed", error=str(error), error_type=type(error).__name__)
        held, self._held = self._held, deque()
        self._held_bytes = 0
        self._not_holding.set()  # Wakes `wait_for_capacity`: the next write raises `error`.
        resend, self._resend_task = self._resend_task, None
        if resend is not None:  # Nothing left to send; it would only wait on a dead writer.
            resend.cancel()
        for _, future in held:
            self._resolve(future, error=error)

    # ------------------------------------------------------------------ quota

    def _check_quota(self, size: int) -> None:
        quota = self._settings.quota_bytes
        if quota is None:
            return
        used = self._sealed_namespace_bytes + self._segment_bytes + self._held_bytes
        if used + size > quota:
            raise QuotaExceededError(
                f"namespace {self.namespace}: writing {size} bytes to stream {self.stream} "
                f"would use {used + size} bytes, over its quota_bytes={quota} "
                f"(sealed segments {self._sealed_namespace_bytes}, open segment "
                f"{self._segment_bytes + self._held_bytes})"
            )
        stale = time.monotonic() - self._usage_checked > _QUOTA_REFRESH_SECONDS
        if stale and self._refresh_task is None:
            self._refresh_task = spawn_job(
                f"stream-{self._where}-quota",
                self._refresh_usage,
                kind="stream_quota_refresh",
                on_failure=self._refresh_failed,
            )

    def _refresh_failed(self, error: BaseException) -> None:
        self._refresh_task = None  # Logged by the supervisor; the next write tries again.

    async def _refresh_usage(self) -> None:
        try:
            self._sealed_namespace_bytes = await namespace_sealed_bytes(self._store, self.namespace)
            self._usage_checked = time.monotonic()
        except BKError as error:
            self._log.warning("stream_quota_refresh_failed", error=str(error))
        finally:
            self._refresh_task = None

    async def _stop_refresh(self) -> None:
        task, self._refresh_task = self._refresh_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ rolling

    def _roll_due(self) -> bool:
        return (
            self._segment_bytes >= self._options.roll_bytes
            or time.monotonic() - self._segment_started >= self._options.roll_seconds
        )

    def _start_roll(self) -> None:
        assert self._roll_task is None
        self._not_holding.clear()
        self._roll_task = spawn_job(
            f"stream-{self._where}-roll",
            self._roll,
            kind="stream_roll",
            on_failure=partial(self._job_failed, "roll"),
        )

    def _job_failed(self, job: str, error: BaseException) -> None:
        """A roll or re-send broke (a bug, logged by the supervisor): the writer fails, not
        hangs. The two never run at once: writes are held from a roll's start to its end."""
        self._roll_task = self._resend_task = None
        failure = BKError(f"stream {self._where}: {job} failed: {type(error).__name__}")
        failure.__cause__ = error
        self._fail(failure)

    async def _roll(self) -> None:
        new_handle: LedgerHandle | None = None
        try:
            sealed = await self._seal_handle()
            new_handle = await self._create_ledger()
            meta = await self._cas_segments(sealed, new_handle.ledger_id)
        except BKError as error:
            if isinstance(error, MetadataOutcomeUnknownError) and new_handle is not None:
                # The last copy of the CAS may still land naming it: kept (an orphan at worst).
                self._log.warning("stream_roll_ledger_kept", ledger_id=new_handle.ledger_id)
            elif new_handle is not None:
                await self._drop_unrecorded(new_handle.ledger_id)
            self._fail(error)
            self._roll_task = None
            return
        segment = meta.open_segment
        assert segment is not None and segment.ledger_id == new_handle.ledger_id
        self._sealed_namespace_bytes += sealed.bytes
        self._handle, self._segment = new_handle, segment
        self._segment_started = time.monotonic()
        self._segment_bytes = 0
        self._roll_task = None
        self._log.info(
            "stream_rolled",
            sealed_ledger_id=sealed.ledger_id,
            ledger_id=segment.ledger_id,
            first_seq=segment.first_seq,
        )
        self._send_held()

    async def _drop_unrecorded(self, ledger_id: int) -> None:
        """Delete the failed roll's new ledger unless the record names it: a write whose reply
        was lost may have landed, and a record naming a deleted ledger fails its readers (and
        `end_seq`) until the next writer seals it. Kept when the record cannot be read: an
        orphan ledger (its custom metadata names the stream) is the lesser harm."""
        try:
            meta = await self._store.find_stream(self.namespace, self.stream)
        except BKError as error:
            # Not known whether the record names it: kept (found by its custom metadata).
            self._log.warning("stream_roll_ledger_kept", ledger_id=ledger_id, error=str(error))
            return
        if meta is not None and any(s.ledger_id == ledger_id for s in meta.segments):
            return  # Recorded: the next writer seals it (or deletion, truncation drop it).
        with contextlib.suppress(BKError):
            await self._bk.delete_ledger(ledger_id)

    def _send_held(self) -> None:
        """Send held writes to the current ledger in order, until it is due to roll in its
        turn or has no room (then the rest wait for room, still in order, `_resend_held`)."""
        held = self._held
        while held and self._error is None:
            if self._roll_due():
                self._start_roll()
                return
            payload, future = held.popleft()  # Out first: a failure resolves what is held.
            self._held_bytes -= len(payload)  # Before: a failure (`_fail`) zeroes the count.
            try:
                self._submit(payload, future)
            except TooManyRequestsError:
                held.appendleft((payload, future))
                self._held_bytes += len(payload)
                self._resend_task = spawn_job(
                    f"stream-{self._where}-resend",
                    self._resend_held,
                    kind="stream_resend",
                    on_failure=partial(self._job_failed, "re-sending held writes"),
                )
                return
        if self._error is None and self._roll_due():
            self._start_roll()
        elif not held:
            self._not_holding.set()

    async def _resend_held(self) -> None:
        try:  # Until an add completed (or the handle failed: the next append says so).
            await self._handle.wait_for_capacity()
        finally:
            self._resend_task = None
        self._send_held()

    async def _seal_handle(self) -> Segment:
        """Close the current ledger once its adds resolved; the segment as sealed."""
        handle = self._handle
        await handle.close()  # LedgerFencedError when a newer writer recovered it.
        return self._segment.closed(handle.last_add_confirmed, handle.length, now_ms())

    async def _create_ledger(self) -> LedgerHandle:
        options = self._options
        return await self._bk.create_ledger(
            ensemble_size=options.ensemble_size,
            write_quorum=options.write_quorum,
            ack_quorum=options.ack_quorum,
            password=STREAM_PASSWORD,
            custom_metadata=stream_ledger_metadata(self.namespace, self.stream, self.epoch),
        )

    async def _cas_segments(self, sealed: Segment, next_ledger_id: int | None) -> StreamMeta:
        """Write `sealed` (and a new open segment on `next_ledger_id`) into the stream record,
        in at most MAX_METADATA_ATTEMPTS CASes (then MetadataError: the writer fails). A lost
        answer is resolved below this by reading the record back, which takes only our very
        bytes for ours: a version conflict may still be our write, landed and then changed by
        a truncation, which `_landed` tells. MetadataOutcomeUnknownError (the store lost every
        answer; the last copy may still land) fails the writer."""
        meta = self._meta
        for _attempt in range(MAX_METADATA_ATTEMPTS):
            self._check_owner(meta, sealed.ledger_id)
            segments: tuple[Segment, ...] = (*meta.segments[:-1], sealed)
            if next_ledger_id is not None:
                segments += (
                    Segment(next_ledger_id, sealed.last_seq + 1, -1, SegmentState.OPEN, now_ms()),
                )
            target = replace(meta, segments=segments)
            try:
                self._meta = await self._store.put_stream(self.namespace, self.stream, target)
                return self._meta
            except MetadataVersionError:
                meta = await self._reread()
                if self._landed(meta, target):
                    self._meta = meta
                    return meta
        raise metadata_attempts_exhausted(f"stream {self._where}", "recording its segments")

    def _landed(self, meta: StreamMeta, target: StreamMeta) -> bool:
        """Whether `meta`, read after a write of `target` was refused, shows it applied (a
        lost answer's copy that landed before the record changed again). Only this writer
        closes its segment or opens the next one in its epoch, so the open segment tells (the
        new one, whose ledger no other write names, or none after a close); the sealed segment
        may be gone already, truncated after the write landed."""
        return (
            meta.epoch == self.epoch
            and meta.ctime_ms == self._meta.ctime_ms  # Not a new stream of the same name.
            and meta.open_segment == target.open_segment
        )

    async def _reread(self) -> StreamMeta:
        try:
            return await self._store.get_stream(self.namespace, self.stream)
        except StreamNotFoundError:
            raise LedgerFencedError(f"stream {self._where} was deleted under its writer") from None

    def _check_owner(self, meta: StreamMeta, ledger_id: int) -> None:
        open_segment = meta.open_segment
        if meta.epoch != self.epoch or open_segment is None or open_segment.ledger_id != ledger_id:
            raise LedgerFencedError(
                f"stream {self._where}: writer epoch {self.epoch} was fenced by epoch "
                f"{meta.epoch} (another writer opened the stream)"
            )
