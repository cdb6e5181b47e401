"""Range reads of one ledger, for every ensemble shape (docs/client.md "Reads").

A *piece* is a run of consecutive entries inside one segment, read as a unit and returned in
entry order. It is read as *streams*, each one range request (READ_ENTRIES) to one bookie at a
time:
- ensemble == write quorum (every bookie holds every entry): one stream, the whole piece,
  asked first of the reader's *sticky* bookie (`ClientConfig.sticky_reads`: one bookie per
  ledger, so the others keep their CPU and disk for the writer's ack quorum and a bookie's
  read-ahead serves the next request), else of a different bookie for each consecutive piece
  (a sequential read uses the whole ensemble);
- ensemble > write quorum (striped: entry e is on ensemble indexes (e + k) % E, k < Qw): E
  streams, stream j being the piece's entries first + j, first + j + E, ... (a stride-E
  request), asked of the first bookie of their write set. The streams' answers are merged.
A stream's bookie answers with the entries it holds; a limit may cut the answer short and the
stream continues where it stopped. A request that fails or times out goes to the next bookie
of the write set for the rest of the stream; with `speculative_read_timeout`, a bookie slower
than that is raced by the next one and the first answer wins. Entries a bookie lacks (Qa < Qw
lets one miss some) or holds corrupt (digest mismatch) are read one by one through
`EntryReader.read_entry`, that bookie asked last: absence and failure are then decided by the
quorum rules, exactly as for a single read.
Imports no transport code (bookies are reached through `ClientContext.ops`).
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, TypeVar, cast

import structlog

from bkaio.errors import BKError, NoSuchLedgerError, ProtocolError
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.quorum import Segment, write_set
from bkaio.ledger_client.reads import EntryReader, cancel_all
from bkaio.ledger_client.types import ClientConfig, EntriesAnswer, Entry
from bkaio.protocol.records import scan_records

log = structlog.get_logger(__name__)

# `Entry` from a (ledger_id, entry_id, payload) tuple without a Python call: `map` over `zip`.
_new_entry = cast(
    Callable[[tuple[int, int, bytes]], Entry], functools.partial(tuple.__new__, Entry)
)
# A range request asks for at least this many payload bytes, however small the estimate.
MIN_REQUEST_BYTES = 64 * 1024
# A paced read makes up at most this much lateness (a timer firing late, a short pause of the
# loop): a longer hold-up (a slow consumer, a stall) is not made up with a burst, which would
# load the bookies at full speed, what the pace is there to prevent.
_PACE_SLACK_SECONDS = 0.02
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Piece:
    """Entries first..last (inclusive) of one segment, read as one unit."""

    first_entry_id: int
    last_entry_id: int
    bookies: tuple[str, ...]  # The segment's ensemble.
    turn: int  # Ensemble == write quorum: the ensemble index asked first.

    @property
    def entry_count(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1

    def streams(self, write_quorum: int) -> int:
        """Range requests the piece has in flight at once."""
        size = len(self.bookies)
        return 1 if size == write_quorum else min(size, self.entry_count)


def plan_pieces(
    ensembles: Sequence[Segment],
    write_quorum: int,
    first_entry_id: int,
    last_entry_id: int,
    entries_per_request: int,
    sticky: int | None = None,
) -> Iterator[Piece]:
    """The pieces of first..last in entry order: each within one segment, of at most
    `entries_per_request` entries per stream. A segment whose every bookie holds every entry
    asks ensemble index `sticky` % E first for each of its pieces, or (`sticky` None) the
    next index for each consecutive piece."""
    turn = 0
    for index, (segment_start, bookies) in enumerate(ensembles):
        segment_end = ensembles[index + 1][0] - 1 if index + 1 < len(ensembles) else last_entry_id
        first = max(first_entry_id, segment_start)
        last = min(last_entry_id, segment_end)
        size = len(bookies)
        per_piece = entries_per_request * (1 if size == write_quorum else size)
        while first <= last:
            end = min(last, first + per_piece - 1)
            yield Piece(first, end, bookies, (turn if sticky is None else sticky) % size)
            turn += 1
            first = end + 1


class _StreamFailed(Exception):
    """Internal: every bookie that holds a stream failed its request."""


class ReadAheadBytes:
    """The payload bytes a read-ahead window holds: asked for by its requests in flight, or
    received and not yet handed out, at most `limit` but for the window's head (the next
    batch, which the consumer cannot go on without: its requests are never held back)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._pieces: deque[PieceBytes] = deque()  # In entry order: the head first.

    def open(self, reserved: int) -> PieceBytes:
        """The account of a piece joining the window, its first requests' `reserved` bytes
        counted now."""
        piece = PieceBytes(self, reserved)
        self._pieces.append(piece)
        self.held += reserved
        return piece

    def close(self, piece: PieceBytes) -> None:
        """The piece left the window (handed out, or cancelled): its bytes no longer count."""
        self._pieces.remove(piece)
        self.held -= piece.counted
        piece.counted = 0
        piece.in_window = False
        self.grant()

    def grant(self) -> None:
        """Let the waiting requests go, in entry order, while they fit (the head's always)."""
        for index, piece in enumerate(self._pieces):
            waiting = piece.waiting
            while waiting:
                future, size = waiting[0]
                if future.done():  # Cancelled while it waited.
                    waiting.popleft()
                    continue
                if index and self.held + size > self.limit:
                    return  # No later piece goes before this one.
                waiting.popleft()
                piece.counted += size
                self.held += size
                future.set_result(None)


class PieceBytes:
    """One piece's share of a `ReadAheadBytes`: what its requests may bring, then what they
    brought. A range request of the piece takes its `max_bytes` from the bytes reserved for
    its first requests, else waits for room in the window (`ask`); its answer's payload then
    counts instead (`answered`)."""

    def __init__(self, window: ReadAheadBytes, reserved: int) -> None:
        self._window = window
        self._credit = reserved  # Counted, not yet asked for.
        self.counted = reserved
        self.in_window = True
        self.waiting: deque[tuple[asyncio.Future[None], int]] = deque()

    async def ask(self, max_bytes: int) -> None:
        """Wait until a request of `max_bytes` may go."""
        if self._credit >= max_bytes:
            self._credit -= max_bytes
            return
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((future, max_bytes))
        self._window.grant()
        await future

    def answered(self, max_bytes: int, payload_bytes: int) -> None:
        """A request of `max_bytes` brought `payload_bytes` (0: it failed)."""
        self.took(payload_bytes - max_bytes)

    def took(self, payload_bytes: int) -> None:
        """Bytes the piece received beyond its range answers (entries read one by one), or
        (negative) a request's reserve it did not use."""
        if self.in_window:
            self.counted += payload_bytes
            self._window.held += payload_bytes
            if payload_bytes < 0:
                self._window.grant()


class RangeReader:
    """Reads pieces of one ledger (see the module docstring)."""

    def __init__(
        self, context: ClientContext, ledger_id: int, write_quorum: int, entries: EntryReader
    ) -> None:
        self._ctx = context
        self.ledger_id = ledger_id
        self._write_quorum = write_quorum
        self._entries = entries
        # Entries read one by one (`_fill_holes`), for every piece and stride of this reader
        # at once: the read-ahead window's pieces would otherwise each have `read_window`.
        self._one_by_one = asyncio.Semaphore(context.config.read_window)

    async def read_piece(self, piece: Piece, max_bytes: int, budget: PieceBytes) -> list[Entry]:
        """The piece's entries in order, asking at most about `max_bytes` of payload at once,
        each request once `budget` lets it go.

        NoSuchEntryError / BookieUnavailableError as for single reads (the first entry that
        cannot be read decides).
        """
        bookies = piece.bookies
        size = len(bookies)
        first = piece.first_entry_id
        last = piece.last_entry_id
        if size == self._write_quorum:
            order = tuple((piece.turn + k) % size for k in range(size))
            payloads = await self._read_stream(bookies, order, first, 1, last, max_bytes, budget)
        else:
            streams = piece.streams(self._write_quorum)
            results = await self._read_strides(piece, range(streams), max_bytes, budget)
            merged: list[Any] = [None] * piece.entry_count
            for j, stream_payloads in enumerate(results):
                merged[j::size] = stream_payloads
            payloads = merged
        return list(map(_new_entry, zip(repeat(self.ledger_id), range(first, last + 1), payloads)))

    async def _read_strides(
        self,
        piece: Piece,
        strides: Sequence[int],
        max_bytes: int,
        budget: PieceBytes,
    ) -> list[list[Any]]:
        """Streams j of `strides` at once (entries first + j, first + j + E, ...)."""
        bookies = piece.bookies
        size = len(bookies)
        first = piece.first_entry_id
        share = max(1, max_bytes // max(1, len(strides)))
        tasks = []
        for j in strides:
            order = write_set(first + j, size, self._write_quorum)
            tasks.append(
                asyncio.ensure_future(
                    self._read_stream(
                        bookies,
                        order,
                        first + j,
                        size,
                        piece.last_entry_id,
                        share,
                        budget,
                    )
                )
            )
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            await cancel_all(tasks)

    async def _read_stream(
        self,
        bookies: tuple[str, ...],
        order: Sequence[int],
        first: int,
        stride: int,
        last: int,
        max_bytes: int,
        budget: PieceBytes,
    ) -> list[Any]:
        """Payloads of entries first, first + stride, ... <= last, in order."""
        payloads: list[Any] = []
        holes: list[tuple[int, int, int]] = []  # (index in payloads, entry id, ensemble index)
        position = 0  # In `order`: the bookie asked next.
        next_id = first
        while next_id <= last:
            remaining = (last - next_id) // stride + 1
            await budget.ask(max_bytes)
            try:
                answer, position = await self._ask(
                    bookies, order, position, next_id, stride, last, remaining, max_bytes
                )
            except _StreamFailed:
                budget.answered(max_bytes, 0)
                # Nobody served the rest as a range: entry by entry, the quorum rules decide.
                for entry_id in range(next_id, last + 1, stride):
                    holes.append((len(payloads), entry_id, -1))
                    payloads.append(None)
                break
            bookie_index = order[position]
            scan = scan_records(answer.records, self.ledger_id, next_id, stride, last)
            budget.answered(max_bytes, sum(map(len, scan.payloads)))
            end = answer.next_entry_id
            if scan.problem is not None or scan.corrupt:
                log.warning(
                    "range_read_bad_records",
                    ledger_id=self.ledger_id,
                    bookie_id=bookies[bookie_index],
                    corrupt=scan.corrupt[:10],
                    problem=scan.problem,
                )
            if scan.problem is not None:
                # Trust what came before the bad record; the next bookie goes on from there.
                seen = scan.entry_ids[-1] if scan.entry_ids else next_id - stride
                if scan.corrupt:
                    seen = max(seen, scan.corrupt[-1])
                end = seen + stride
                position += 1
            elif end <= next_id:
                log.warning(
                    "range_read_no_progress",
                    ledger_id=self.ledger_id,
                    bookie_id=bookies[bookie_index],
                    first_entry_id=next_id,
                    next_entry_id=end,
                )
                position += 1
                if position >= len(order):
                    end = next_id  # Read the rest entry by entry.
                    for entry_id in range(next_id, last + 1, stride):
                        holes.append((len(payloads), entry_id, -1))
                        payloads.append(None)
                    break
                continue
            end = min(end, last + 1)
            covered = (end - next_id + stride - 1) // stride  # Entries looked at.
            items: list[Any] = scan.payloads
            # Every entry looked at came, and none from past `end`: a bookie breaking the
            # protocol (records beyond where it says it stopped, as an older bookie's READ_RANGE
            # with a gap becomes) would otherwise shift later entries into earlier places.
            if len(scan.entry_ids) == covered and (not covered or scan.entry_ids[-1] < end):
                payloads += items
            else:
                found = dict(zip(scan.entry_ids, items, strict=True))
                for entry_id in range(next_id, next_id + covered * stride, stride):
                    payload = found.get(entry_id)
                    if payload is None:
                        holes.append((len(payloads), entry_id, bookie_index))
                    payloads.append(payload)
            next_id += covered * stride
            if position >= len(order) and next_id <= last:
                for entry_id in range(next_id, last + 1, stride):
                    holes.append((len(payloads), entry_id, -1))
                    payloads.append(None)
                break
        if holes:
            await self._fill_holes(bookies, payloads, holes, budget)
        return payloads

    async def _ask(
        self,
        bookies: tuple[str, ...],
        order: Sequence[int],
        position: int,
        first: int,
        stride: int,
        last: int,
        max_count: int,
        max_bytes: int,
    ) -> tuple[EntriesAnswer, int]:
        """One range request, from `order[position]` on: the first answer, and the position of
        the bookie that gave it. Fails over on errors; races a slow bookie with the next one
        after `speculative_read_timeout`. _StreamFailed when every bookie left failed."""
        ops = self._ctx.ops
        delay = self._ctx.config.speculative_read_timeout
        running: dict[asyncio.Future[EntriesAnswer], int] = {}
        failures: list[str] = []

        def launch() -> None:
            nonlocal position
            bookie_id = bookies[order[position]]
            future = asyncio.ensure_future(
                ops.read_entries(
                    bookie_id,
                    self.ledger_id,
                    first,
                    last,
                    stride=stride,
                    max_count=max_count,
                    max_bytes=max_bytes,
                )
            )
            running[future] = position
            position += 1

        try:
            while True:
                if not running:
                    if position >= len(order):
                        raise _StreamFailed("; ".join(failures))
                    launch()
                more = position < len(order)
                done, _ = await asyncio.wait(
                    running,
                    timeout=delay if delay is not None and more else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    launch()  # The slow bookie keeps its chance; the next one races it.
                    continue
                for future in sorted(done, key=running.__getitem__):
                    at = running.pop(future)
                    error = future.exception()
                    if error is None:
                        return future.result(), at
                    if not isinstance(error, BKError):
                        raise error
                    if not isinstance(error, NoSuchLedgerError | ProtocolError):
                        log.debug(
                            "range_read_failed",
                            ledger_id=self.ledger_id,
                            bookie_id=bookies[order[at]],
                            first_entry_id=first,
                            error=str(error),
                        )
                    failures.append(f"{bookies[order[at]]}: {type(error).__name__}: {error}")
        finally:
            await cancel_all(list(running))

    async def _fill_holes(
        self,
        bookies: tuple[str, ...],
        payloads: list[Any],
        holes: list[tuple[int, int, int]],
        budget: PieceBytes,
    ) -> None:
        """Read the `holes` entry by entry (at most `read_window` at once for the reader),
        each from its write set with the bookie that lacked it last, into their places in
        `payloads`."""
        size = len(bookies)
        limit = self._one_by_one

        async def fill(index: int, entry_id: int, lacking: int) -> None:
            indexes = write_set(entry_id, size, self._write_quorum)
            ordered = [i for i in indexes if i != lacking]
            if lacking >= 0:
                ordered.append(lacking)
            async with limit:
                copy = await self._entries.read_entry([bookies[i] for i in ordered], entry_id)
            budget.took(len(copy.payload))
            payloads[index] = copy.payload

        tasks = [asyncio.ensure_future(fill(*hole)) for hole in holes]
        try:
            await asyncio.gather(*tasks)
        finally:
            await cancel_all(tasks)


async def read_ahead(
    pieces: Iterator[Piece],
    write_quorum: int,
    config: ClientConfig,
    request_bytes: Callable[[int], int],
    fetch: Callable[[Piece, int, PieceBytes], Awaitable[list[_T]]],
) -> AsyncGenerator[list[_T], None]:
    """`fetch(piece, max_bytes, budget)` of each piece, in order, with the next pieces in
    flight while the consumer works: at most `read_ahead_requests` range requests and
    `read_ahead_bytes` of payload asked for or fetched and not yet handed out (`ReadAheadBytes`:
    a piece joins with its first requests' `request_bytes(entries per request)` each; each
    request reserves its `max_bytes`, replaced by its answer's payload once received; a
    further request of a piece waits for room unless the piece is next to be handed out);
    always at least one piece. With `read_ahead_entries_per_second`, a piece is asked for only
    once the entries asked for before it fit that rate (paced where the bookies' work starts,
    so it comes evenly spread); time the read was held up (a slow consumer, a stall) earns no
    burst to catch up, beyond `_PACE_SLACK_SECONDS`. Closing the generator early cancels what
    is in flight."""
    window: deque[tuple[asyncio.Future[list[_T]], int, PieceBytes]] = deque()
    requests = 0  # Range requests of the pieces in the window.
    held = ReadAheadBytes(config.read_ahead_bytes)
    rate = config.read_ahead_entries_per_second
    clock = asyncio.get_running_loop().time  # The loop's clock (virtual in the simulation).
    due = clock()  # When the pace lets the next piece be asked for.
    piece = next(pieces, None)
    try:
        while piece is not None or window:
            while piece is not None:
                streams = piece.streams(write_quorum)
                max_bytes = request_bytes(piece.entry_count // streams + 1) * streams
                if window and (
                    requests + streams > config.read_ahead_requests
                    or held.held + max_bytes > held.limit
                ):
                    break
                if rate is not None:
                    now = clock()
                    due = max(due, now - _PACE_SLACK_SECONDS)
                    if due > now:
                        if window:
                            break  # Hand out what is in flight; this piece goes when due.
                        await asyncio.sleep(due - now)
                    due += piece.entry_count / rate
                budget = held.open(max_bytes)
                window.append(
                    (asyncio.ensure_future(fetch(piece, max_bytes, budget)), streams, budget)
                )
                requests += streams
                piece = next(pieces, None)
            head, streams, budget = window[0]
            batch = await head
            window.popleft()
            requests -= streams
            held.close(budget)
            yield batch
    finally:
        await cancel_all([fetch_ for fetch_, _, _ in window])
