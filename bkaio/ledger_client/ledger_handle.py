"""The writer's handle of one ledger: appends, answers from bookies, in-order completion.

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
- An add refused for what it is (`RequestRefusedError`: BAD_REQUEST, e.g. an entry above a
  bookie's max_entry_bytes): the first bookie to refuse an entry is replaced like a failed one
  (BookKeeper's rule: that bookie's limits differ from the others', as in a rolling change of
  them), a second, different one refusing the same entry fails the handle (the entry itself is
  refused; entry ids are consecutive, none may be skipped). `append` refuses a payload above
  the client's limit (`ClientConfig.max_entry_bytes`) before it takes an entry id, so that one
  oversized append leaves the handle usable.
- Backpressure: at most `max_outstanding_adds` adds and `max_outstanding_add_bytes` payload
  bytes in flight (one larger entry alone); later appends are queued, up to `max_queued_adds`
  (then refused with TooManyRequestsError), and sent as acknowledgements free room.

`LedgerHandle` is assembled from one part per responsibility, each a mixin over `HandleState`
(handle_state.py, with `PendingAdd`): here the public surface, the add path and the handle's
failure; add_batching.py the batched sends of a burst; bookie_replacement.py the ensemble
change; explicit_lac.py the LAC pushes when no add carries the LAC; sealing.py `close`.
Imports no transport code: bookies are reached through `ClientContext.ops`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError, LedgerClosedError, NotEnoughBookiesError, TooManyRequestsError
from bkaio.ledger_client.add_batching import AddBatching
from bkaio.ledger_client.bookie_replacement import BookieReplacement
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.ensemble_change import BookieFailures
from bkaio.ledger_client.errors import InvalidArgumentError, RequestRefusedError, copy_error
from bkaio.ledger_client.explicit_lac import ExplicitLac
from bkaio.ledger_client.handle_state import FATAL_ADD_ERRORS, AnswerHandler, PendingAdd
from bkaio.ledger_client.quorum import write_set
from bkaio.ledger_client.sealing import Sealing
from bkaio.meta.ledger_metadata import LedgerMetadata
from bkaio.protocol.codes import FRAME_ENVELOPE_BYTES
from bkaio.protocol.digest import entry_digest

log = structlog.get_logger(__name__)


class LedgerHandle(AddBatching, BookieReplacement, ExplicitLac, Sealing):
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
        self._when_writable = context.ops.when_writable
        self._answer_handlers: list[AnswerHandler] = []
        self._write_set_targets: list[list[tuple[str, AnswerHandler]]] = []
        self._set_ensemble(list(metadata.ensembles[-1][1]))
        self._lac = -1
        self._acked_length = 0
        self._last_pushed = -1
        self._pushed_length = 0
        self._pending: deque[PendingAdd] = deque()  # Sent, not yet resolved; entry order.
        self._waiting: deque[PendingAdd] = deque()  # Assigned, held back (backpressure/change).
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
        self._close_lock = asyncio.Lock()  # One close() seals; another waits for it (sealing.py).
        self._max_piggybacked_lac = -1
        self._lac_timer: asyncio.TimerHandle | None = None
        self._lac_tasks: set[asyncio.Task[None]] = set()
        self._lac_stopped = False
        self._push_lac = context.config.explicit_lac_on_ack
        self._lac_push_due = False  # A `_lac_pushed` is scheduled.
        self._log = log.bind(ledger_id=self.ledger_id)
        # Entry id -> the first bookie that refused it (BAD_REQUEST): only refusals fill it.
        self._refused_by: dict[int, str] = {}
        # Bound once: called per append.
        self._add_entry_many = context.ops.add_entry_many
        self._add_entries = context.ops.add_entries
        # A ledger whose every add goes to every bookie (E = Qw) sends the appends of one loop
        # iteration as one batch per bookie (`_send_unsent`); a striped one sends each add to
        # its write set (`_send`).
        self._batches_adds = self._ensemble_size == self._write_quorum
        self._unsent: list[PendingAdd] = []  # Appended this loop iteration, not sent yet.
        # When `_send_unsent` runs: with the other ledgers' batches, written at once.
        self._defer_send = context.ops.defer_send
        # Read on every append; the config is frozen.
        self._max_outstanding_adds = context.config.max_outstanding_adds
        self._max_queued_adds = context.config.max_queued_adds
        # Bytes in flight are `_pushed_length - _acked_length` (of `_pending` when nothing
        # waits): the bound costs append no counter of its own.
        self._max_outstanding_add_bytes = context.config.max_outstanding_add_bytes
        self._max_entry_bytes = context.config.max_entry_bytes
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
        NotEnoughBookiesError, ...) once it has failed; InvalidArgumentError, taking no entry
        id (the handle goes on), for a payload that is not bytes-like or is larger than
        `ClientConfig.max_entry_bytes` (max_frame_bytes - 4096).
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
        if len(payload) > self._max_entry_bytes:  # Every bookie would refuse it.
            raise InvalidArgumentError(
                f"ledger {self.ledger_id}: payload of {len(payload)} bytes is above the entry "
                f"limit of {self._max_entry_bytes} (max_frame_bytes - {FRAME_ENVELOPE_BYTES})"
            )
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
        add = PendingAdd(entry_id, lac, self._pushed_length, digest, payload, future)
        if self._is_idle:
            self._is_idle = False
            self._idle.clear()
        if (
            self._changing
            or self._waiting
            or self._blocked_on
            or len(self._pending) >= self._max_outstanding_adds
            # Nothing waits: the bytes in flight with this one. One larger than the bound
            # still goes alone.
            or (
                self._pushed_length - self._acked_length > self._max_outstanding_add_bytes
                and self._pending
            )
        ):
            self._waiting.append(add)
        else:
            self._pending.append(add)
            self._queue_send(add)
        return future

    def _queue_send(self, add: PendingAdd) -> None:
        """Send a new add (in `_pending` already): with this iteration's batch, or now."""
        if self._batches_adds:
            unsent = self._unsent
            unsent.append(add)
            if len(unsent) == 1:
                self._defer_send(self._send_unsent)
            elif self._batch_timer is not None:  # A waiting burst caught this append.
                self._end_batch_wait()
        else:
            self._send(add, self._write_set_masks[add.entry_id % self._ensemble_size])

    async def wait_for_capacity(self) -> None:
        """Return once an append would be sent at once rather than queued (backpressure):
        fewer than `max_outstanding_adds` adds and `max_outstanding_add_bytes` payload bytes
        in flight, none queued (a payload that would pass the bytes bound is still queued)."""
        limit = self._max_outstanding_adds
        max_bytes = self._max_outstanding_add_bytes
        pause = Backoff(0.001, 0.05)  # An ensemble change may wait on metadata for a while.
        while self._error is None and (
            self._waiting
            or len(self._pending) >= limit
            or (self._pending and self._pushed_length - self._acked_length >= max_bytes)
        ):
            oldest = self._pending[0].future if self._pending else None
            if oldest is not None and not oldest.done():
                # The oldest in-flight add completes first: wait for it.
                await asyncio.wait((oldest,))
                pause.reset()
            else:
                # Held back by an ensemble change, which ends by itself, or the oldest add's
                # future was cancelled by its caller (the add goes on, and leaves the queue
                # when acknowledged): a done future would make this loop spin.
                await asyncio.sleep(pause.next_delay())

    async def client_closed(self) -> None:
        """Its client is closing (`BookKeeper.close`, before its connections): the handle
        stops as failed, so that no ensemble change, re-send or LAC push outlives them.

        Adds not acknowledged by then fail with LedgerClosedError, and so do later appends;
        the ledger stays OPEN until a recovery seals it. A sealed handle is left as it is.
        """
        if not self._closed:
            self._fail(
                LedgerClosedError(
                    f"ledger {self.ledger_id}: its client is closed; adds not acknowledged by "
                    f"then never will be, and the ledger stays open (last add confirmed "
                    f"{self._lac}) until a recovery seals it"
                )
            )
        task = self._change_task
        if task is not None:  # Its metadata write would go through a connection being closed.
            task.cancel()
            await asyncio.wait((task,))
        await self.stop_explicit_lac()

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

    def _send(self, add: PendingAdd, mask: int) -> None:
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
        start = add.entry_id % self._ensemble_size
        if mask == self._write_set_masks[start]:  # The whole write set: every new add.
            targets = self._write_set_targets[start]
        else:
            ensemble = self._ensemble
            handlers = self._answer_handlers
            targets = [
                (ensemble[index], handlers[index])
                for index in self._write_sets[start]
                if mask >> index & 1
            ]
        self._add_entry_many(  # Positional: cheaper than matching keywords, once per append.
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

    def _answer_handler(self, index: int, bookie_id: str) -> AnswerHandler:
        """What handles the answers of `bookie_id` in ensemble slot `index` to adds.

        Called with the add and the answer (None for OK, else the error): the bookie ops bind
        the add to it (`add_entry_many`, `add_entries`), which costs less than a partial (with
        its empty kwargs dict) per add and bookie. The
        OK answer of a bookie still in its slot, the one that comes three times per append, is
        handled here; anything else by `_add_done`.
        """
        bit = 1 << index

        def answered(add: PendingAdd, error: BKError | None) -> None:
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

    def _add_done(self, add: PendingAdd, index: int, bookie_id: str, error: BKError | None) -> None:
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
        if isinstance(error, FATAL_ADD_ERRORS):
            self._fail(error)
            return
        if self._closing and self._is_idle:
            return  # Every add resolved: the seal is at the LAC, nothing more depends on it.
        if isinstance(error, RequestRefusedError):
            first = self._refused_by.setdefault(add.entry_id, bookie_id)
            if first != bookie_id:
                # Two bookies refuse the entry itself (or this client its frame, on every
                # connection): another would too, and an entry that cannot be added cannot be
                # skipped (ids are consecutive): the handle stops, close() seals at the LAC.
                failure = RequestRefusedError(
                    f"ledger {self.ledger_id}: bookies {first} and {bookie_id} refused entry "
                    f"{add.entry_id} itself ({error}); entry ids are consecutive: the handle "
                    f"stops, close() seals the ledger at its last add confirmed"
                )
                failure.__cause__ = error
                self._fail(failure)
                return
            # One bookie refusing: its limits differ from the others' (a smaller
            # server.max_entry_bytes, a rolling change of it), replaced like a failed bookie
            # below, as BookKeeper's client replaces a bookie whose add fails.
            self._log.warning(
                "add_refused_by_bookie",
                bookie_id=bookie_id,
                entry_id=add.entry_id,
                error=str(error),
            )
        if self._error is None:
            # Also for an entry that already completed: a slow or dead bookie is swapped
            # out before later entries depend on it (BookKeeper's delayed write failure).
            self._bookie_failed(index, bookie_id, error)

    def _drain(self) -> None:
        """Resolve completed adds from the head of the queue, in entry order."""
        if self._changing:
            return
        pending = self._pending
        last: PendingAdd | None = None
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
        max_bytes = self._max_outstanding_add_bytes
        while (
            self._waiting
            and not self._changing
            and not self._blocked_on
            and self._error is None
            and len(self._pending) < limit
            # The bytes in flight with the next one (its length counts every entry before it).
            and (not self._pending or self._waiting[0].length - self._acked_length <= max_bytes)
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

    def _job_failed(self, error: BaseException) -> None:
        """A background job of this handle broke (a bug, logged by the supervisor): stop."""
        failure = BKError(f"ledger {self.ledger_id}: internal error: {type(error).__name__}")
        failure.__cause__ = error
        self._fail(failure)
