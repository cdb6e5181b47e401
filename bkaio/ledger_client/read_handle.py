"""A read-only handle of one ledger: reads up to the LAC (open) or the last entry (closed).

Returned by `BookKeeper.open_ledger`. With recovery the ledger is closed by the time the handle
exists; without, the handle reads what the bookies confirm (READ_LAC, long polls for tailing)
and notices a close or an ensemble change by re-reading the metadata when it gets stuck.
Imports no transport code.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator
from operator import itemgetter
from types import TracebackType

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError, BookieUnavailableError, NoSuchEntryError
from bkaio.ledger_client.acknowledged import last_acknowledged_entry
from bkaio.ledger_client.arguments import check_count, check_entry_id, check_timeout
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.errors import InvalidArgumentError
from bkaio.ledger_client.range_reads import (
    MIN_REQUEST_BYTES,
    Piece,
    PieceBytes,
    RangeReader,
    plan_pieces,
    read_ahead,
)
from bkaio.ledger_client.reads import EntryReader
from bkaio.ledger_client.tailing import TailPoller
from bkaio.ledger_client.types import Entry
from bkaio.meta.ledger_metadata import LedgerMetadata
from bkaio.protocol.codes import LONG_POLL_ROUND_SECONDS

log = structlog.get_logger(__name__)

# A tail's long poll is cut into rounds of LONG_POLL_ROUND_SECONDS (bkaio/protocol/codes.py);
# between rounds the handle re-reads the metadata, so a close or an ensemble change is noticed
# within one round.
_payload_of = itemgetter(2)  # Of an `Entry` (a NamedTuple), without a Python call.
# Payload bytes per entry assumed until the handle has read some (an open ledger's metadata has
# no length): generous, so a first request is rarely cut short.
_GUESS_ENTRY_BYTES = 4096.0


class ReadHandle:
    """Reads of one ledger (no writes). Not fencing unless it was opened with recovery."""

    def __init__(self, context: ClientContext, metadata: LedgerMetadata) -> None:
        self._ctx = context
        self._md = metadata
        self.ledger_id: int = metadata.ledger_id
        self._reader = EntryReader(
            context, metadata.ledger_id, metadata.write_quorum, metadata.ack_quorum
        )
        self._ranges = RangeReader(context, metadata.ledger_id, metadata.write_quorum, self._reader)
        self._poller = TailPoller(context, metadata.ledger_id, metadata.write_quorum)
        config = context.config
        self._tail_pause = Backoff(
            config.tail_backoff_min, config.tail_backoff_max, rng=context.rng
        )
        # The ensemble index an E = Qw segment's range reads ask first (`sticky_reads`).
        self._sticky = metadata.ledger_id if context.config.sticky_reads else None
        # Entries a tail poll brought beyond what `wait_for_entries` returned (contiguous).
        self._tail: deque[Entry] = deque()
        self._lac = metadata.last_entry_id if metadata.is_closed else -1
        # Expected payload bytes per entry, for sizing range requests: exact for a closed
        # ledger, then followed as entries are read.
        count = metadata.last_entry_id + 1 if metadata.is_closed else 0
        self._entry_bytes = metadata.length / count if count > 0 else _GUESS_ENTRY_BYTES

    # ----------------------------------------------------------------- state

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger metadata as last read (ensembles, quorums, state, ...)."""
        return self._md

    @property
    def is_closed(self) -> bool:
        """True when the metadata (as last read) says the ledger is sealed."""
        return self._md.is_closed

    @property
    def last_entry_id(self) -> int:
        """Last entry of a closed ledger; for an open one, the last LAC this handle learned."""
        return self._md.last_entry_id if self._md.is_closed else self._lac

    @property
    def last_add_confirmed(self) -> int:
        """The highest entry id known readable (-1 when none)."""
        return self._lac

    @property
    def length(self) -> int:
        """Ledger length in bytes once closed (0 while open)."""
        return self._md.length

    async def refresh_metadata(self) -> LedgerMetadata:
        """Re-read the metadata (notices a close or an ensemble change)."""
        self._md = await self._ctx.ledgers.get(self.ledger_id)
        if self._md.is_closed:
            self._lac = self._md.last_entry_id
        return self._md

    # ----------------------------------------------------------------- LAC

    async def read_last_add_confirmed(self) -> int:
        """The LAC as the bookies know it (works while the writer is still open).

        For a closed ledger, its last entry id. Asks every bookie of the last segment and
        answers once every write set has Qw - Qa + 1 answers (BookieUnavailableError if not).
        The bookies' LAC lags the writer's by up to one entry until its explicit LAC is sent.
        """
        if not self._md.is_closed:
            await self.refresh_metadata()
        if self._md.is_closed:
            return self._lac
        lac = await self._reader.read_lac(self._md.ensembles[-1][1])
        self._lac = max(self._lac, lac)
        return self._lac

    async def read_last_acknowledged(self) -> int:
        """The last entry the writer may have acknowledged, exactly (the bookies' LAC lags it):
        entries up to it are durable, and this handle reads up to it from now on.

        For a closed ledger, its last entry. Reads every entry past the bookies' LAC from its
        whole write set (bkaio/ledger_client/acknowledged.py); fences nothing.
        """
        await self.refresh_metadata()
        if not self._md.is_closed:
            self._lac = max(self._lac, await last_acknowledged_entry(self._ctx, self._md))
        return self._lac

    async def wait_for_entry(self, entry_id: int, timeout: float = 1.0) -> Entry | None:  # noqa: ASYNC109
        """Tail: wait until `entry_id` <= LAC (long-polling the bookies), then read it.

        None when `timeout` seconds pass first. NoSuchEntryError when the ledger is closed
        before `entry_id`: that entry will never exist. The entries after it that the same
        poll brought are kept for the next calls (`wait_for_entries`).
        """
        entries = await self.wait_for_entries(entry_id, timeout, max_entries=1)
        return entries[0] if entries else None

    async def wait_for_entries(
        self,
        entry_id: int,
        timeout: float = 1.0,  # noqa: ASYNC109
        *,
        max_entries: int | None = None,
    ) -> list[Entry]:
        """Tail: entries entry_id, entry_id + 1, ... as soon as they are confirmed (<= LAC):
        at least one, at most `max_entries`; [] when `timeout` seconds pass first (also while
        no bookie answers: a poll round that every bookie failed is followed by a jittered
        pause, `tail_backoff_min`..`tail_backoff_max`, within the timeout).

        A long poll answers with the entries themselves (tailing.py: one round trip from the
        writer's acknowledgement to the reader); entries it brought beyond what is returned
        are kept for the next call. NoSuchEntryError when the ledger is closed before
        `entry_id`; InvalidArgumentError, before any request, unless `entry_id` is an int in
        [0, 2**63 - 1] and `timeout` a finite number of seconds >= 0.
        """
        check_entry_id(self.ledger_id, entry_id)
        check_timeout(timeout)
        if max_entries is not None:
            check_count(max_entries, "max_entries")
        clock = asyncio.get_running_loop().time  # The loop's clock (virtual in the simulation).
        deadline = clock() + timeout
        while True:
            if self._md.is_closed and entry_id > self._md.last_entry_id:
                raise NoSuchEntryError(
                    f"ledger {self.ledger_id} is closed at entry {self._md.last_entry_id}; "
                    f"entry {entry_id} will never exist"
                )
            tail = self._tail
            if tail and tail[0].entry_id != entry_id:
                tail.clear()  # Kept for another position: the caller moved on.
            if tail:
                count = len(tail) if max_entries is None else min(max_entries, len(tail))
                return [tail.popleft() for _ in range(count)]
            if entry_id <= self._lac:
                last = min(
                    self._lac, entry_id + (max_entries or self._ctx.config.read_batch_entries) - 1
                )
                return await self.read(entry_id, last)
            remaining = deadline - clock()
            if remaining <= 0:
                return []
            wait = min(remaining, LONG_POLL_ROUND_SECONDS)
            polled = await self._poller.poll(self._md.ensembles[-1][1], entry_id - 1, wait)
            # A round's LAC is at least its previous_lac (entry_id - 1) even when no bookie's
            # is: only one past it is news.
            if polled.lac >= entry_id:
                self._lac = polled.lac
                tail.extend(polled.entries)  # From entry_id on (what the poll asked for).
            else:
                await self.refresh_metadata()  # Stuck: closed, or a new ensemble?
            if not polled.cut_short:
                self._tail_pause.reset()
            elif not self._md.is_closed:
                # No bookie waited (all down, or answering at once): not again at once.
                pause = self._tail_pause.next_delay()
                await asyncio.sleep(min(pause, max(0.0, deadline - clock())))

    # ----------------------------------------------------------------- entries

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[Entry]:
        """Entries first..last (inclusive), all readable (<= LAC, or <= last entry if closed).

        NoSuchEntryError when `last_entry_id` is beyond that bound; BookieUnavailableError
        when too few bookies answer; a corrupt copy is skipped for another one.
        InvalidArgumentError, before any request, unless both are ints with
        0 <= first <= last <= 2**63 - 1.
        """
        entries: list[Entry] = []
        async for batch in self.read_batches(first_entry_id, last_entry_id):
            entries += batch
        return entries

    async def read_iter(
        self, first_entry_id: int, last_entry_id: int
    ) -> AsyncGenerator[Entry, None]:
        """Like `read`, one entry at a time, reading ahead (`read_batches`)."""
        async for batch in self.read_batches(first_entry_id, last_entry_id):
            for entry in batch:
                yield entry

    async def read_batches(
        self, first_entry_id: int, last_entry_id: int, *, batch_entries: int | None = None
    ) -> AsyncGenerator[list[Entry], None]:
        """Entries first..last in order, in batches (one range-read piece each), reading ahead.

        A batch holds `batch_entries` (default: the client's `read_batch_entries`) entries per
        bookie asked: so many with ensemble == write quorum, E times so many when striped.

        The next pieces are requested while the consumer works on this one: at most
        `read_ahead_requests` range requests in flight and `read_ahead_bytes` of payload
        asked for or fetched and not yet handed out (a request counts its `max_bytes`, then
        what it brought, until its piece is handed out; a piece's further requests wait for
        room unless it is the next to hand out); always at least one piece. Errors as for `read`,
        raised at the batch they concern. Closing the iterator early cancels what is in flight.
        """
        if batch_entries is not None:
            check_count(batch_entries, "batch_entries")
        await self._check_range(first_entry_id, last_entry_id)
        config = self._ctx.config
        md = self._md
        pieces = plan_pieces(
            md.ensembles,
            md.write_quorum,
            first_entry_id,
            last_entry_id,
            batch_entries or config.read_batch_entries,
            self._sticky,
        )
        batches = read_ahead(pieces, md.write_quorum, config, self._request_bytes, self._read_piece)
        try:
            async for batch in batches:
                self._learn_entry_bytes(batch)
                yield batch
        finally:
            await batches.aclose()

    def _request_bytes(self, entries: int) -> int:
        """Payload bytes to ask for with a range request of `entries` entries: their expected
        size with a margin, within [MIN_REQUEST_BYTES, read_batch_bytes]."""
        expected = int(entries * self._entry_bytes * 1.25)
        return max(MIN_REQUEST_BYTES, min(self._ctx.config.read_batch_bytes, expected))

    def _learn_entry_bytes(self, batch: list[Entry]) -> None:
        """Follow the payload size the ledger's entries have (for `_request_bytes`)."""
        if batch:
            average = sum(map(len, map(_payload_of, batch))) / len(batch)
            self._entry_bytes = max(1.0, (self._entry_bytes + average) / 2)

    async def _check_range(self, first_entry_id: int, last_entry_id: int) -> None:
        check_entry_id(self.ledger_id, first_entry_id, "first entry id")
        check_entry_id(self.ledger_id, last_entry_id, "last entry id")
        if last_entry_id < first_entry_id:
            raise InvalidArgumentError(
                f"ledger {self.ledger_id}: bad range {first_entry_id}..{last_entry_id} "
                f"(need 0 <= first <= last)"
            )
        if last_entry_id <= self._lac:
            return
        if not self._md.is_closed:
            try:
                await self.read_last_add_confirmed()
            except BookieUnavailableError:
                if not self._md.is_closed:
                    raise
        if last_entry_id > self._lac:
            bound = "last entry" if self._md.is_closed else "LAC"
            raise NoSuchEntryError(
                f"ledger {self.ledger_id}: entry {last_entry_id} is beyond its {bound} {self._lac}"
            )

    async def _read_piece(self, piece: Piece, max_bytes: int, budget: PieceBytes) -> list[Entry]:
        try:
            return await self._ranges.read_piece(piece, max_bytes, budget)
        except BKError:
            if self._md.is_closed:
                raise
            # An open ledger may have changed ensemble since this handle read its metadata.
            fresh = await self.refresh_metadata()
            again = list(
                plan_pieces(
                    fresh.ensembles,
                    fresh.write_quorum,
                    piece.first_entry_id,
                    piece.last_entry_id,
                    piece.entry_count,
                    self._sticky,
                )
            )
            if [p.bookies for p in again] == [piece.bookies]:
                raise
            entries: list[Entry] = []
            for part in again:
                entries += await self._ranges.read_piece(part, max_bytes, budget)
            return entries

    async def close(self) -> None:
        """Release the handle: cancels the long polls a tail sent ahead (else they end within
        a poll round, at most a second; closing is optional)."""
        self._poller.close()
        self._tail.clear()

    async def __aenter__(self) -> ReadHandle:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
