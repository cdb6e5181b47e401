"""The state of a writer's ledger handle, shared by the modules `LedgerHandle` is made of.

`LedgerHandle` (ledger_handle.py: appends, answers from bookies, in-order completion, failure)
is assembled from one part per responsibility, each a mixin over `HandleState`: the batching of
sends (add_batching.py), the replacement of failed bookies (bookie_replacement.py), explicit
LAC pushes (explicit_lac.py) and close (sealing.py). `HandleState` names the attributes they
share and the methods one part calls in another; the attributes are set by
`LedgerHandle.__init__`. `PendingAdd` is the one record of an entry in flight they all handle.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError, LedgerFencedError, UnauthorizedError
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.ensemble_change import BookieFailures
from bkaio.meta.ledger_metadata import LedgerMetadata

# Errors after which the same bookie can never take this ledger's adds: the handle stops.
FATAL_ADD_ERRORS = (LedgerFencedError, UnauthorizedError)


class PendingAdd:
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


# Handles one bookie's answer to one add: None for OK, else the error
# (see `LedgerHandle._answer_handler`).
AnswerHandler = Callable[[PendingAdd, BKError | None], None]


class HandleState:
    """What the parts of `LedgerHandle` share (set by `LedgerHandle.__init__`)."""

    ledger_id: int
    _ctx: ClientContext
    _loop: asyncio.AbstractEventLoop
    _md: LedgerMetadata
    _master_key: bytes
    _ensemble_size: int
    _write_quorum: int
    _ack_quorum: int
    _write_set_masks: list[int]
    _ensemble: list[str]
    _answer_handlers: list[AnswerHandler]
    _blocked_on: set[str]
    _when_writable: Callable[[str, int, Callable[[], None]], bool]  # `BookieOps.when_writable`
    _lac: int
    _acked_length: int
    _pending: deque[PendingAdd]
    _waiting: deque[PendingAdd]
    _idle: asyncio.Event
    _failed: dict[int, str]
    _failures: BookieFailures
    _down_mask: int
    _change_backoff: Backoff
    _last_change_at: float | None
    _changing: bool
    _change_task: asyncio.Task[None] | None
    _error: BKError | None
    _closing: bool
    _closed: bool
    _close_lock: asyncio.Lock
    _max_piggybacked_lac: int
    _lac_timer: asyncio.TimerHandle | None
    _lac_tasks: set[asyncio.Task[None]]
    _lac_stopped: bool  # No more LAC pushes: the handle is closing, or its client closed.
    _lac_push_due: bool
    _log: structlog.typing.FilteringBoundLogger
    _add_entries: Any  # `BookieOps.add_entries`, bound (generic in the add type).
    _batches_adds: bool  # E = Qw: appends leave in batches (`_send_unsent`).
    _unsent: list[PendingAdd]
    _defer_send: Callable[[Callable[[], None]], None]
    _batch_wait_seconds: float
    _batch_timer: asyncio.TimerHandle | None
    _batch_waited: bool
    _batch_wait_backoff: int

    # Methods one part calls in another (defined by `LedgerHandle` or one of its parts).
    def _send(self, add: PendingAdd, mask: int) -> None:
        raise NotImplementedError

    def _send_unsent(self, *, now: bool = False) -> None:
        raise NotImplementedError

    def _writable_again(self, bookie_id: str) -> None:
        raise NotImplementedError

    def _set_ensemble(self, ensemble: list[str]) -> None:
        raise NotImplementedError

    def _drain(self) -> None:
        raise NotImplementedError

    def _fail(self, error: BKError) -> None:
        raise NotImplementedError

    def _job_failed(self, error: BaseException) -> None:
        raise NotImplementedError

    def _stop_explicit_lac(self) -> None:
        raise NotImplementedError
