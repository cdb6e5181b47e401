"""The writer's handle of one ledger: pipelined quorum adds, ensemble change, explicit LAC, close.

The add path (BookKeeper's PendingAddOp, docs/client.md):
- `append` assigns the next entry id, computes the digest over (ledger, entry, LAC, cumulative
  length, payload) and sends the entry to its write set at once; it returns a future.
- Each bookie answer is a plain callback (no Task per entry). An add is *complete* when Qa
  distinct bookies of its write set confirmed; futures resolve strictly in entry order, and
  each resolution advances the LAC.
- A bookie that fails an add (error, timeout, lost connection) starts an ensemble change: a
  replacement takes its slot in a new segment starting at LAC + 1 (metadata CAS), and pending
  entries are re-sent to it. Nothing completes while a change is in flight. Which bookie, and
  when there is none so that the handle fails with NotEnoughBookiesError, is
  ensemble_change.py's decision: without progress each bookie is tried once, so a writer that
  cannot write fails after at most as many changes as there are bookies. Changes after the
  first back off (jittered); the change runs as a supervised job.
- Fencing (FENCED from any bookie, or metadata no longer OPEN) is fatal for the handle.
Imports no transport or codec code: bookies are reached through `ClientContext.ops`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque
from collections.abc import Callable
from functools import partial
from types import MethodType, TracebackType

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import (
    BKError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataError,
    MetadataVersionError,
    NotEnoughBookiesError,
    TooManyRequestsError,
    UnauthorizedError,
)
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.ensemble_change import (
    BookieFailures,
    not_enough_bookies,
    plan_replacements,
)
from bkaio.ledger_client.errors import InvalidArgumentError, copy_error
from bkaio.ledger_client.quorum import with_new_segment, write_set
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.ledger_metadata import LedgerMetadata, LedgerState
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.encoder import ADD_ENTRIES_BATCH_BYTES, FIXARRAY_HEADER_BYTES, FrameEncoder
from bkaio.supervision import spawn_job

log = structlog.get_logger(__name__)

# Errors after which the same bookie can never take this ledger's adds: the handle stops.
_FATAL_ADD_ERRORS = (LedgerFencedError, UnauthorizedError)
# Compare-and-swaps one ensemble change may try: each lost one means another client changed
# the record (a recovery, which fences this writer) or the store lost the answer.
_MAX_METADATA_ATTEMPTS = 8
# After a batching wait that caught nothing, this many bursts go at once (then waiting is
# tried again): a closed loop pays the wait once in this many sends, not every time.
_BATCH_WAIT_BACKOFF_SENDS = 256


class _PendingAdd:
    """One entry between `append` and its in-order completion."""

    __slots__ = ("acked", "completed", "digest", "entry_id", "future", "lac", "length", "payload")

    def __init__(
        self,
        entry_id: int,
        lac: int,
        length: int,
        digest: int,
        payload: bytes,
        future: asyncio.Future[int],
    ) -> None:
        self.entry_id = entry_id
        self.lac = lac  # Piggybacked LAC; in the digest: re-sends reuse it (`_carry_lac`: unsent).
        self.length = length  # Ledger length after this entry.
        self.digest = digest
        self.payload = payload
        self.future = future
        self.acked = 0  # Bit i set: the bookie at ensemble index i confirmed.
        self.completed = False  # Qa distinct confirmations (may still wait for earlier entries).


# Handles one bookie's answer to one add: None for OK, else the error (see `_answer_handler`).
_AnswerHandler = Callable[[_PendingAdd, BKError | None], None]
# (first index, end index, packed entries, their bytes): one ADD_ENTRIES frame of a batch.
_Frame = tuple[int, int, list[bytes], int]
# The fields of an ADD_ENTRIES entry, packed once per append for every bookie: `pack_fields`
# done inline (`FrameEncoder.fields_packer`).
_pack_list = FrameEncoder.fields_packer()


def _frames_of(packed: list[bytes]) -> list[_Frame]:
    """`packed` cut into frames of at most ADD_ENTRIES_BATCH_BYTES (a larger entry alone)."""
    total = sum(map(len, packed))
    if total <= ADD_ENTRIES_BATCH_BYTES:
        return [(0, len(packed), packed, total)]
    frames: list[_Frame] = []
    start = 0
    size = 0
    for index, entry_bytes in enumerate(map(len, packed)):
        if size and size + entry_bytes > ADD_ENTRIES_BATCH_BYTES:
            frames.append((start, index, packed[start:index], size))
            start = index
            size = 0
        size += entry_bytes
    frames.append((start, len(packed), packed[start:], size))
    return frames


class LedgerHandle:
    """A ledger open for writing by its one writer (returned by `BookKeeper.create_ledger`)."""

    def __init__(self, context: ClientContext, metadata: LedgerMetadata, master_key: bytes) -> None:
        self._ctx = context
        self._loop = asyncio.get_running_loop()
        self._md = metadata
        self._master_key = master_key
        self.ledger_id: int = metadata.ledger_id
        self._ensemble_size = metadata.ensemble_size
        self._write_quorum = metadata.write_quorum
        self._ack_quorum = metadata.ack_quorum
        self._write_sets = [
            write_set(start, self._ensemble_size, self._write_quorum)
            for start in range(self._ensemble_size)
        ]
        self._write_set_masks = [sum(1 << i for i in ws) for ws in self._write_sets]
        self._ensemble: list[str] = []
        # Bookies whose connection takes no writes now (they read too slowly): new appends
        # wait until each is writable again or counts as failed, so that a bookie that falls
        # behind the ack quorum is not buried under requests it can never answer in time.
        self._blocked_on: set[str] = set()
        self._when_writable = getattr(context.ops, "when_writable", None)
        self._answer_handlers: list[_AnswerHandler] = []
        self._write_set_targets: list[list[tuple[str, _AnswerHandler]]] = []
        self._set_ensemble(list(metadata.ensembles[-1][1]))
        self._lac = -1
        self._acked_length = 0
        self._last_pushed = -1
        self._pushed_length = 0
        self._pending: deque[_PendingAdd] = deque()  # Sent, not yet resolved; entry order.
        self._waiting: deque[_PendingAdd] = deque()  # Assigned, held back (backpressure/change).
        self._idle = asyncio.Event()
        self._idle.set()
        self._is_idle = True  # Mirrors `_idle`, so that `append` calls no Event method.
        self._failed: dict[int, str] = {}  # Ensemble index -> bookie to replace.
        self._failures = BookieFailures(context.config.bookie_quarantine_seconds)
        self._down_mask = 0  # Indexes that failed with no replacement; adds skip them.
        self._change_backoff = Backoff(
            context.config.ensemble_change_backoff_min,
            context.config.ensemble_change_backoff_max,
            rng=context.rng,
        )
        self._last_change_at: float | None = None  # Loop time of the last ensemble change.
        self._changing = False
        self._change_task: asyncio.Task[None] | None = None
        self._error: BKError | None = None
        self._closing = False
        self._closed = False
        self._max_piggybacked_lac = -1
        self._lac_timer: asyncio.TimerHandle | None = None
        self._lac_tasks: set[asyncio.Task[None]] = set()
        self._push_lac = context.config.explicit_lac_on_ack
        self._lac_push_due = False  # A `_lac_pushed` is scheduled.
        self._log = log.bind(ledger_id=self.ledger_id)
        # `BookiePool.add_entry_many` when the context has it (test fakes may not).
        self._add_entry_many = getattr(context.ops, "add_entry_many", None)
        # `BookiePool.add_entries`, for a ledger whose every add goes to every bookie: the
        # appends of one loop iteration leave as one batch per bookie (`_send_unsent`).
        add_entries = getattr(context.ops, "add_entries", None)
        self._add_entries = add_entries if self._ensemble_size == self._write_quorum else None
        self._unsent: list[_PendingAdd] = []  # Appended this loop iteration, not sent yet.
        # When `_send_unsent` runs: the pool's `defer_send` (with the other ledgers' batches,
        # written at once), else at the loop's next turn.
        self._defer_send: Callable[[Callable[[], None]], object] = (
            getattr(context.ops, "defer_send", None) or self._loop.call_soon
        )
        # Read on every append; the config is frozen.
        self._max_outstanding_adds = context.config.max_outstanding_adds
        self._max_queued_adds = context.config.max_queued_adds
        # The adaptive batching wait of a burst (`_send_unsent`, ClientConfig.add_batch_wait_us).
        self._batch_wait_seconds = context.config.add_batch_wait_us / 1e6
        self._batch_timer: asyncio.TimerHandle | None = None  # The unsent burst waits.
        self._batch_waited = False  # It waited already: it goes at the next `_send_unsent`.
        self._batch_wait_backoff = 0  # Bursts still to send at once after a fruitless wait.

    # ----------------------------------------------------------------- public surface

    @property
    def last_add_confirmed(self) -> int:
        """Highest entry id acknowledged together with every entry before it; -1 when none."""
        return self._lac

    @property
    def last_add_pushed(self) -> int:
        """Highest entry id assigned by `append` (acknowledged or not); -1 when none."""
        return self._last_pushed

    @property
    def length(self) -> int:
        """Payload bytes of the acknowledged entries 0..LAC."""
        return self._acked_length

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger metadata as this handle last wrote or read it."""
        return self._md

    @property
    def is_closed(self) -> bool:
        """True once `close` sealed the ledger (or failed for good)."""
        return self._closed

    def append(self, payload: bytes) -> asyncio.Future[int]:
        """Add `payload` as the next entry; returns a future of its entry id.

        The entry id is assigned and the requests are sent now; the future resolves after Qa
        bookies of the entry's write set confirmed it and every earlier entry resolved.
        Raises LedgerClosedError after `close`, and the handle's failure (LedgerFencedError,
        NotEnoughBookiesError, ...) once it has failed.
        """
        if self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id}: append after close")
        if self._error is not None:
            raise copy_error(self._error)
        if type(payload) is not bytes:  # Checked and copied: the caller may reuse its buffer.
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise InvalidArgumentError(
                    f"ledger {self.ledger_id}: payload must be bytes, got {type(payload).__name__}"
                )
            payload = bytes(payload)
        if len(self._waiting) >= self._max_queued_adds:
            raise TooManyRequestsError(
                f"ledger {self.ledger_id}: {len(self._waiting)} appends already queued behind "
                f"{len(self._pending)} in flight; await earlier appends or wait_for_capacity()"
            )
        entry_id = self._last_pushed + 1
        self._last_pushed = entry_id
        self._pushed_length += len(payload)
        lac = self._lac
        digest = entry_digest(self.ledger_id, entry_id, lac, self._pushed_length, payload)
        future: asyncio.Future[int] = self._loop.create_future()
        add = _PendingAdd(entry_id, lac, self._pushed_length, digest, payload, future)
        if self._is_idle:
            self._is_idle = False
            self._idle.clear()
        if (
            self._changing
            or self._waiting
            or self._blocked_on
            or len(self._pending) >= self._max_outstanding_adds
        ):
            self._waiting.append(add)
        else:
            self._pending.append(add)
            self._queue_send(add)
        return future

    def _queue_send(self, add: _PendingAdd) -> None:
        """Send a new add (in `_pending` already): with this iteration's batch, or now."""
        if self._add_entries is not None:
            unsent = self._unsent
            unsent.append(add)
            if len(unsent) == 1:
                self._defer_send(self._send_unsent)
            elif self._batch_timer is not None:  # A waiting burst caught this append.
                self._end_batch_wait()
        else:
            self._send(add, self._write_set_masks[add.entry_id % self._ensemble_size])

    async def wait_for_capacity(self) -> None:
        """Return once an append would be sent at once rather than queued (backpressure)."""
        limit = self._max_outstanding_adds
        pause = Backoff(0.001, 0.05)  # An ensemble change may wait on metadata for a while.
        while self._error is None and (self._waiting or len(self._pending) >= limit):
            if self._pending:  # The oldest in-flight add completes first: wait for it.
                await asyncio.wait((self._pending[0].future,))
                pause.reset()
            else:  # Held back by an ensemble change only; it ends by itself.
                await asyncio.sleep(pause.next_delay())

    async def close(self) -> None:
        """Wait for pending adds, then seal the ledger: metadata CLOSED at the LAC.

        Idempotent. Raises LedgerFencedError when another client recovered (or closed) the
        ledger meanwhile; the ledger's end is then whatever that client sealed.
        """
        if self._closed:
            return
        self._closing = True
        if self._batch_timer is not None:  # A waiting burst goes now: nothing else will come.
            self._send_unsent(now=True)
        await self._idle.wait()
        if self._change_task is not None:
            with contextlib.suppress(BKError):
                await asyncio.shield(self._change_task)
        self._stop_explicit_lac()
        if isinstance(self._error, _FATAL_ADD_ERRORS):
            self._closed = True
            raise copy_error(self._error)
        try:
            await self._seal()
        finally:
            self._closed = True
        self._log.info("ledger_closed", last_entry_id=self._lac, length=self._acked_length)

    async def __aenter__(self) -> LedgerHandle:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # ----------------------------------------------------------------- the add path

    def _send(self, add: _PendingAdd, mask: int) -> None:
        """Send `add` to the ensemble indexes in `mask` (skipping bookies known down)."""
        down_mask = self._down_mask
        if down_mask:  # With every slot up the write set (Qw >= Qa bookies) is reachable.
            live = self._write_set_masks[add.entry_id % self._ensemble_size] & ~down_mask
            if (live | add.acked).bit_count() < self._ack_quorum:
                down = self._down_bookies()
                error = NotEnoughBookiesError(
                    f"ledger {self.ledger_id}: entry {add.entry_id} can reach only "
                    f"{(live | add.acked).bit_count()} of ack quorum {self._ack_quorum}: "
                    f"bookies {down} failed and no writable bookie replaces them. Why: "
                    f"{self._failures.describe(down) or 'unknown'}"
                )
                error.__cause__ = self._failures.last_cause
                self._fail(error)
                return
            mask &= ~down_mask
        if add.lac > self._max_piggybacked_lac:
            self._max_piggybacked_lac = add.lac
        ensemble = self._ensemble
        add_entry_many = self._add_entry_many
        start = add.entry_id % self._ensemble_size
        if add_entry_many is not None:  # The wire pool: the entry is packed once for all.
            if mask == self._write_set_masks[start]:  # The whole write set: every new add.
                targets = self._write_set_targets[start]
            else:
                handlers = self._answer_handlers
                targets = [
                    (ensemble[index], handlers[index])
                    for index in self._write_sets[start]
                    if mask >> index & 1
                ]
            add_entry_many(  # Positional: cheaper than matching keywords, once per append.
                targets,
                add,
                self.ledger_id,
                add.entry_id,
                False,  # recovery
                self._master_key,
                add.lac,
                add.length,
                add.digest,
                add.payload,
            )
            return
        for index in self._write_sets[start]:
            if not mask >> index & 1:
                continue
            self._ctx.ops.add_entry(
                ensemble[index],
                self.ledger_id,
                add.entry_id,
                recovery=False,
                master_key=self._master_key,
                lac=add.lac,
                length=add.length,
                digest=add.digest,
                payload=add.payload,
                callback=MethodType(self._answer_handlers[index], add),
            )

    def _send_unsent(self, *, now: bool = False) -> None:
        """Send this loop iteration's appends: one batch of ADD_ENTRIES frames per bookie.

        Only for a ledger whose write set is the whole ensemble (E = Qw), so every add goes
        to every bookie. The entries are packed once and each bookie's connection takes the
        batch in one call; a bookie down, or one whose connection takes no ADD_ENTRIES now,
        gets the adds one by one through `_send` instead.

        With `add_batch_wait_us`, a burst (two appends or more) waits for the next append
        first (`_wait_for_more`), unless `now` (an ensemble change, close).
        """
        adds = self._unsent
        if not adds:
            return
        if self._batch_timer is not None:
            if not now:
                return  # Waiting: the next append or the timer sends it.
            self._batch_timer.cancel()
            self._batch_timer = None
        elif (
            not (now or self._batch_waited)
            and self._batch_wait_seconds
            and len(adds) > 1
            and self._wait_for_more()
        ):
            return
        self._batch_waited = False
        self._unsent = []
        if self._error is not None:
            return  # `_fail` resolved them already.
        mask = self._write_set_masks[0]  # E = Qw: every write set is every slot.
        if self._down_mask:
            for add in adds:
                self._send(add, mask)
            return
        lac = adds[-1].lac  # The LAC only grows: the last add carries the highest.
        if lac > self._max_piggybacked_lac:
            self._max_piggybacked_lac = lac
        pack = _pack_list
        skip = FIXARRAY_HEADER_BYTES
        frames = _frames_of(
            [
                pack([add.entry_id, add.lac, add.length, add.digest, add.payload])[skip:]
                for add in adds
            ]
        )
        add_entries = self._add_entries
        assert add_entries is not None
        ledger_id = self.ledger_id
        master_key = self._master_key
        handlers = self._answer_handlers
        for index, bookie_id in enumerate(self._ensemble):
            if not add_entries(
                bookie_id, ledger_id, False, master_key, handlers[index], adds, frames
            ):
                for add in adds:
                    self._send(add, 1 << index)
        when_writable = self._when_writable
        if when_writable is not None:
            blocked = self._blocked_on
            for bookie_id in self._ensemble:
                if bookie_id not in blocked and when_writable(
                    bookie_id, ledger_id, partial(self._writable_again, bookie_id)
                ):
                    blocked.add(bookie_id)

    def _wait_for_more(self) -> bool:
        """Let the unsent burst wait for the next append (at most `add_batch_wait_us`), unless
        waiting is paused after a fruitless wait, or the handle is closing. True: it waits.

        Only a burst waits: a lone append (a serial writer, a slow rate) goes at once, and so
        does everything while a wait that caught nothing is recent (a closed loop whose next
        append needs this one's answer would pay the whole wait every time)."""
        if self._batch_wait_backoff > 0:
            self._batch_wait_backoff -= 1
            return False
        if self._closing or self._error is not None:
            return False
        self._batch_timer = self._loop.call_later(self._batch_wait_seconds, self._batch_wait_over)
        return True

    def _end_batch_wait(self) -> None:
        """An append joined the waiting burst: both go once this loop iteration's appends are
        in (the pool's deferred send, with the other ledgers' batches)."""
        timer = self._batch_timer
        assert timer is not None
        timer.cancel()
        self._batch_timer = None
        self._batch_waited = True
        self._defer_send(self._send_unsent)

    def _batch_wait_over(self) -> None:
        """Nothing came while the burst waited: it goes now; the next bursts go at once."""
        self._batch_timer = None
        self._batch_waited = True
        self._batch_wait_backoff = _BATCH_WAIT_BACKOFF_SENDS
        self._defer_send(self._send_unsent)

    def _writable_again(self, bookie_id: str) -> None:
        """`bookie_id` takes writes again (or failed): held-back appends go on when no other
        bookie holds them."""
        blocked = self._blocked_on
        blocked.discard(bookie_id)
        if not blocked and self._waiting and self._error is None:
            self._send_waiting()

    def _set_ensemble(self, ensemble: list[str]) -> None:
        """Adopt `ensemble` (the newest segment's), with an answer handler per slot."""
        self._ensemble = ensemble
        self._blocked_on.intersection_update(ensemble)  # Replaced bookies hold nothing back.
        handlers = [self._answer_handler(index, bookie) for index, bookie in enumerate(ensemble)]
        self._answer_handlers = handlers
        self._write_set_targets = [
            [(ensemble[i], handlers[i]) for i in write_set] for write_set in self._write_sets
        ]

    def _answer_handler(self, index: int, bookie_id: str) -> _AnswerHandler:
        """What handles the answers of `bookie_id` in ensemble slot `index` to adds.

        Called with the add and the answer (None for OK, else the error): the pool binds the
        add to it (`BookiePool.add_entry_many`), the other ops get it bound with MethodType;
        either costs less than a partial (with its empty kwargs dict) per add and bookie. The
        OK answer of a bookie still in its slot, the one that comes three times per append, is
        handled here; anything else by `_add_done`.
        """
        bit = 1 << index

        def answered(add: _PendingAdd, error: BKError | None) -> None:
            if error is not None or self._closed or self._ensemble[index] != bookie_id:
                self._add_done(add, index, bookie_id, error)
                return
            if add.completed or (add.future.done() and add.entry_id <= self._lac):
                return
            acked = add.acked | bit
            add.acked = acked
            if acked.bit_count() >= self._ack_quorum:
                add.completed = True
                pending = self._pending
                if pending and pending[0] is add:
                    self._drain()

        return answered

    def _add_done(
        self, add: _PendingAdd, index: int, bookie_id: str, error: BKError | None
    ) -> None:
        if self._ensemble[index] != bookie_id or self._closed:
            return  # That bookie was replaced meanwhile: its answer no longer counts.
        if error is None:
            if add.completed or (add.future.done() and add.entry_id <= self._lac):
                return
            add.acked |= 1 << index
            if add.acked.bit_count() >= self._ack_quorum:
                add.completed = True
                if self._pending and self._pending[0] is add:
                    self._drain()
            return
        if isinstance(error, _FATAL_ADD_ERRORS):
            self._fail(error)
            return
        if self._error is None and not (self._closing and self._is_idle):
            # Also for an entry that already completed: a slow or dead bookie is swapped
            # out before later entries depend on it (BookKeeper's delayed write failure).
            self._bookie_failed(index, bookie_id, error)

    def _drain(self) -> None:
        """Resolve completed adds from the head of the queue, in entry order."""
        if self._changing:
            return
        pending = self._pending
        last: _PendingAdd | None = None
        while pending and pending[0].completed:
            last = pending.popleft()
            future = last.future
            if not future.done():
                future.set_result(last.entry_id)  # Its callbacks run later, not in this loop.
            last.payload = b""
        if last is not None:
            self._lac = last.entry_id
            self._acked_length = last.length
            if self._failures.since_progress:
                self._failures.progress()
            if self._lac_timer is None:
                self._schedule_explicit_lac()
            if self._push_lac and not self._lac_push_due:
                self._lac_push_due = True
                self._loop.call_soon(self._lac_pushed)
        if self._waiting:
            self._send_waiting()
        if not pending and not self._waiting:
            self._set_idle()

    def _set_idle(self) -> None:
        self._is_idle = True
        self._idle.set()

    def _send_waiting(self) -> None:
        limit = self._max_outstanding_adds
        while (
            self._waiting
            and not self._changing
            and not self._blocked_on
            and self._error is None
            and len(self._pending) < limit
        ):
            add = self._waiting.popleft()
            self._pending.append(add)
            self._queue_send(add)

    def _fail(self, error: BKError) -> None:
        """Stop the handle: every unresolved add fails with `error`; later appends raise it."""
        if self._error is not None:
            return
        self._error = error
        self._log.warning(
            "ledger_handle_failed",
            error=str(error),
            error_type=type(error).__name__,
            last_add_confirmed=self._lac,
            unresolved_adds=len(self._pending) + len(self._waiting),
        )
        for add in (*self._pending, *self._waiting):
            if not add.future.done():
                add.future.set_exception(copy_error(error))
        self._pending.clear()
        self._waiting.clear()
        self._set_idle()

    def _down_bookies(self) -> list[str]:
        return [b for i, b in enumerate(self._ensemble) if self._down_mask >> i & 1]

    # ----------------------------------------------------------------- ensemble change

    def _bookie_failed(self, index: int, bookie_id: str, error: BKError) -> None:
        self._note_failed(index, bookie_id, error)
        if bookie_id in self._blocked_on:  # It failed: nothing to wait for from it. Held
            # appends go on now, or when the ensemble change just started has ended.
            self._writable_again(bookie_id)

    def _note_failed(self, index: int, bookie_id: str, error: BKError) -> None:
        if index in self._failed or self._down_mask >> index & 1:
            return
        self._log.warning(
            "bookie_add_failed",
            bookie_id=bookie_id,
            ensemble_index=index,
            error=str(error),
            error_type=type(error).__name__,
        )
        self._failed[index] = bookie_id
        self._failures.failed(bookie_id, error, self._loop.time())
        if self._change_task is None:
            self._changing = True
            self._change_task = spawn_job(
                f"ledger-{self.ledger_id}-ensemble-change",
                self._change_ensemble,
                kind="ensemble_change",
                on_failure=self._job_failed,
            )

    def _job_failed(self, error: BaseException) -> None:
        """A background job of this handle broke (a bug, logged by the supervisor): stop."""
        failure = BKError(f"ledger {self.ledger_id}: internal error: {type(error).__name__}")
        failure.__cause__ = error
        self._fail(failure)

    async def _change_ensemble(self) -> None:
        try:
            while self._failed and self._error is None:
                await self._back_off_before_change()
                if self._error is None:
                    await self._change_ensemble_once(dict(self._failed))
        except BKError as error:
            self._fail(error)
        finally:
            self._changing = False
            self._change_task = None
            if self._error is None:
                self._drain()

    async def _back_off_before_change(self) -> None:
        """The first change in a quarantine period goes at once; later ones wait a jittered,
        growing delay, so a flapping cluster cannot make a writer rewrite its metadata fast."""
        now = self._loop.time()
        last = self._last_change_at
        if last is None or now - last >= self._failures.quarantine_seconds:
            self._change_backoff.reset()
        else:
            await asyncio.sleep(self._change_backoff.next_delay())
        self._last_change_at = self._loop.time()

    async def _change_ensemble_once(self, failed: dict[int, str]) -> None:
        # Appends not sent yet go to the ensemble they were appended under, like the rest:
        # the re-send below then covers them as it covers every pending add.
        self._send_unsent(now=True)
        plan = plan_replacements(
            placement=self._ctx.placement,
            bookies=self._ctx.bookies(),
            ensemble=self._ensemble,
            failed=failed.keys(),
            down_mask=self._down_mask,
            write_quorum=self._write_quorum,
            ack_quorum=self._ack_quorum,
            failures=self._failures,
            now=self._loop.time(),
        )
        for index in sorted(failed):
            if plan.down_mask >> index & 1:
                self._log.warning(
                    "bookie_not_replaced", bookie_id=failed[index], ensemble_index=index
                )
        if not plan.ack_quorum_reachable(self._write_quorum, self._ack_quorum):
            # Fail before writing anything: no metadata version for a change that cannot help.
            raise not_enough_bookies(self.ledger_id, plan, self._ack_quorum, self._failures)
        replaced = plan.replaced
        self._down_mask = plan.down_mask
        if replaced:
            old = self._ensemble
            await self._write_ensemble(list(plan.ensemble))
            self._log.info(
                "ensemble_changed",
                first_entry_id=self._lac + 1,
                replaced={old[i]: plan.ensemble[i] for i in replaced},
            )
        for index, bookie_id in failed.items():
            if self._failed.get(index) == bookie_id:
                del self._failed[index]
        replaced_mask = sum(1 << i for i in replaced)
        for add in list(self._pending):
            if self._error is not None:
                return
            resend = self._write_set_masks[add.entry_id % self._ensemble_size] & replaced_mask
            if resend:
                # The new segment names the newcomer for this slot: readers look there, so
                # an ack from the bookie it replaced no longer counts.
                add.acked &= ~resend
                add.completed = add.acked.bit_count() >= self._ack_quorum
            self._send(add, resend)

    async def _write_ensemble(self, new_ensemble: list[str]) -> None:
        """CAS a segment starting at LAC + 1 with `new_ensemble` into the metadata."""
        ledgers = self._ctx.ledgers
        md = self._md
        first_entry_id = self._lac + 1
        for _attempt in range(_MAX_METADATA_ATTEMPTS):
            if md.state is not LedgerState.OPEN:
                raise LedgerFencedError(
                    f"ledger {self.ledger_id} is {md.state.name} in metadata: another client "
                    f"recovered or closed it during an ensemble change"
                )
            target = dataclasses.replace(
                md, ensembles=with_new_segment(md.ensembles, first_entry_id, new_ensemble)
            )
            try:
                updated = await ledgers.update(target)
            except MetadataVersionError:
                md = await ledgers.get(self.ledger_id)
                continue
            except MetadataOutcomeUnknownError:
                md = await ledgers.get(self.ledger_id)
                if md.state is LedgerState.OPEN and tuple(md.ensembles) == tuple(target.ensembles):
                    updated = md
                else:
                    continue
            self._md = updated
            self._set_ensemble(new_ensemble)
            return
        raise MetadataError(
            f"ledger {self.ledger_id}: ensemble change not recorded after "
            f"{_MAX_METADATA_ATTEMPTS} compare-and-swap attempts"
        )

    # ----------------------------------------------------------------- explicit LAC

    def _schedule_explicit_lac(self) -> None:
        interval = self._ctx.config.explicit_lac_interval
        if interval > 0 and self._lac_timer is None and not self._closed:
            self._lac_timer = self._loop.call_later(interval, self._explicit_lac_due)

    def _lac_pushed(self) -> None:
        """`explicit_lac_on_ack`: once the loop iteration whose acks moved the LAC is done,
        WRITE_LAC unless an add sent or queued since carries the LAC (tailing readers then
        learn of the entry without waiting for the next add)."""
        self._lac_push_due = False
        lac = self._lac
        if self._batch_timer is not None and self._error is None:
            # A burst waits for company: it leaves now carrying the new LAC, which costs
            # no request beside it (a WRITE_LAC is three more requests, each journaled).
            self._carry_lac(self._unsent, lac)
            self._send_unsent(now=True)
        latest = (
            self._waiting[-1] if self._waiting else self._pending[-1] if self._pending else None
        )
        carried = max(self._max_piggybacked_lac, -1 if latest is None else latest.lac)
        if lac <= carried or self._error is not None or self._closed:
            return
        self._max_piggybacked_lac = lac
        task = self._loop.create_task(self._write_lac(lac), name=f"ledger-{self.ledger_id}-lac")
        self._lac_tasks.add(task)
        task.add_done_callback(self._lac_tasks.discard)

    def _carry_lac(self, adds: list[_PendingAdd], lac: int) -> None:
        """Piggyback `lac` on adds no bookie has seen yet (their digest covers it)."""
        ledger_id = self.ledger_id
        for add in adds:
            if add.lac < lac:
                add.lac = lac
                add.digest = entry_digest(ledger_id, add.entry_id, lac, add.length, add.payload)

    def _explicit_lac_due(self) -> None:
        self._lac_timer = None
        lac = self._lac
        if lac <= self._max_piggybacked_lac or self._error is not None or self._closed:
            return
        self._max_piggybacked_lac = lac
        task = spawn_job(
            f"ledger-{self.ledger_id}-lac",
            partial(self._write_lac, lac),
            kind="explicit_lac",
            on_failure=self._job_failed,
        )
        self._lac_tasks.add(task)
        task.add_done_callback(self._lac_tasks.discard)

    async def _write_lac(self, lac: int) -> None:
        """WRITE_LAC to the live bookies of the current ensemble; failures only delay readers."""
        bookies = [b for i, b in enumerate(self._ensemble) if not self._down_mask >> i & 1]
        results = await asyncio.gather(
            *(self._ctx.ops.write_lac(b, self.ledger_id, self._master_key, lac) for b in bookies),
            return_exceptions=True,
        )
        for bookie_id, result in zip(bookies, results, strict=True):
            if isinstance(result, BaseException):
                self._log.debug("explicit_lac_failed", bookie_id=bookie_id, error=str(result))

    def _stop_explicit_lac(self) -> None:
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None
        for task in self._lac_tasks:
            task.cancel()

    # ----------------------------------------------------------------- close

    async def _seal(self) -> None:
        """CAS the metadata to CLOSED at (LAC, length); adopt nothing but our own close."""
        ledgers = self._ctx.ledgers
        md = self._md
        outcome_unknown = False
        while True:
            if md.state is LedgerState.CLOSED:
                if outcome_unknown and (md.last_entry_id, md.length) == (
                    self._lac,
                    self._acked_length,
                ):
                    self._md = md
                    return  # Our own close landed before the store's answer was lost.
                raise LedgerFencedError(
                    f"ledger {self.ledger_id} was closed by another client at entry "
                    f"{md.last_entry_id} (this writer's LAC {self._lac})"
                )
            if md.state is not LedgerState.OPEN:
                raise LedgerFencedError(
                    f"ledger {self.ledger_id} is {md.state.name}: another client is recovering it"
                )
            target = md.closed(self._lac, self._acked_length)
            try:
                self._md = await ledgers.update(target)
                return
            except MetadataVersionError:
                md = await ledgers.get(self.ledger_id)
            except MetadataOutcomeUnknownError:
                outcome_unknown = True
                md = await ledgers.get(self.ledger_id)
