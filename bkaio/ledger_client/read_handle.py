"""A read-only handle of one ledger: reads up to the LAC (open) or the last entry (closed).

Returned by `BookKeeper.open_ledger`. With recovery the ledger is closed by the time the handle
exists; without, the handle reads what the bookies confirm (READ_LAC, long polls for tailing)
and notices a close or an ensemble change by re-reading the metadata when it gets stuck.
Imports no transport code.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType

import structlog

from bkaio.errors import BKError, BookieUnavailableError, NoSuchEntryError
from bkaio.ledger_client.acknowledged import last_acknowledged_entry
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.errors import InvalidArgumentError
from bkaio.ledger_client.quorum import bookies_for_entry
from bkaio.ledger_client.reads import EntryReader, gather_ordered
from bkaio.ledger_client.types import Entry
from bkaio.meta.ledger_metadata import LedgerMetadata

log = structlog.get_logger(__name__)

# A tail's long poll is cut into rounds this long; between rounds the handle re-reads the
# metadata, so a close or an ensemble change is noticed within one round.
_LONG_POLL_ROUND_SECONDS = 1.0


class ReadHandle:
    """Reads of one ledger (no writes). Not fencing unless it was opened with recovery."""

    def __init__(self, context: ClientContext, metadata: LedgerMetadata) -> None:
        self._ctx = context
        self._md = metadata
        self.ledger_id: int = metadata.ledger_id
        self._reader = EntryReader(
            context, metadata.ledger_id, metadata.write_quorum, metadata.ack_quorum
        )
        self._lac = metadata.last_entry_id if metadata.is_closed else -1

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
        before `entry_id`: that entry will never exist.
        """
        if entry_id < 0:
            raise InvalidArgumentError(f"ledger {self.ledger_id}: entry id {entry_id} < 0")
        clock = asyncio.get_running_loop().time  # The loop's clock (virtual in the simulation).
        deadline = clock() + timeout
        while True:
            if self._md.is_closed and entry_id > self._md.last_entry_id:
                raise NoSuchEntryError(
                    f"ledger {self.ledger_id} is closed at entry {self._md.last_entry_id}; "
                    f"entry {entry_id} will never exist"
                )
            if entry_id <= self._lac:
                return await self._read_one(entry_id)
            remaining = deadline - clock()
            if remaining <= 0:
                return None
            wait = min(remaining, _LONG_POLL_ROUND_SECONDS)
            lac = await self._reader.long_poll_lac(self._md.ensembles[-1][1], self._lac, wait)
            if lac > self._lac:
                self._lac = lac
            else:
                await self.refresh_metadata()

    # ----------------------------------------------------------------- entries

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[Entry]:
        """Entries first..last (inclusive), all readable (<= LAC, or <= last entry if closed).

        NoSuchEntryError when `last_entry_id` is beyond that bound; BookieUnavailableError
        when too few bookies answer; a corrupt copy is skipped for another one.
        """
        return [entry async for entry in self.read_iter(first_entry_id, last_entry_id)]

    async def read_iter(self, first_entry_id: int, last_entry_id: int) -> AsyncIterator[Entry]:
        """Like `read`, one entry at a time, with a window of concurrent reads ahead.

        The window holds batches: a run of entries in one segment whose bookies each hold all
        of it (ensemble == write quorum) is one READ_RANGE (`read_batch_entries`); elsewhere a
        batch is one entry. At least two batches are in flight, so the next is on its way
        while one is consumed.
        """
        await self._check_range(first_entry_id, last_entry_id)
        config = self._ctx.config
        tasks: deque[asyncio.Task[list[Entry]]] = deque()
        in_flight = 0  # Entries asked for by the tasks.
        next_id = first_entry_id
        try:
            while next_id <= last_entry_id or tasks:
                while next_id <= last_entry_id and (
                    len(tasks) < 2 or in_flight < config.read_window
                ):
                    last = self._batch_end(next_id, last_entry_id)
                    tasks.append(asyncio.ensure_future(self._read_batch(next_id, last)))
                    in_flight += last - next_id + 1
                    next_id = last + 1
                batch = await tasks.popleft()
                in_flight -= len(batch)
                for entry in batch:
                    yield entry
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _check_range(self, first_entry_id: int, last_entry_id: int) -> None:
        if first_entry_id < 0 or last_entry_id < first_entry_id:
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

    def _batch_end(self, first_entry_id: int, last_entry_id: int) -> int:
        """The last entry of the batch starting at `first_entry_id` (see `read_iter`)."""
        md = self._md
        batch = self._ctx.config.read_batch_entries
        if batch == 1 or md.ensemble_size != md.write_quorum:
            return first_entry_id
        last = min(last_entry_id, first_entry_id + batch - 1)
        for segment_start, _bookies in md.ensembles:  # A batch stays in one segment.
            if first_entry_id < segment_start <= last:
                last = segment_start - 1
                break
        return last

    async def _read_batch(self, first_entry_id: int, last_entry_id: int) -> list[Entry]:
        if first_entry_id == last_entry_id:
            return [await self._read_one(first_entry_id)]
        md = self._md
        bookies = bookies_for_entry(md.ensembles, first_entry_id, md.write_quorum)
        copies = await self._reader.read_range_prefix(bookies, first_entry_id, last_entry_id)
        entries = [Entry(self.ledger_id, copy.entry_id, copy.payload) for copy in copies]
        rest = range(first_entry_id + len(entries), last_entry_id + 1)
        if rest:  # What no range answer covered: entry by entry, with fail-over and quorums.
            entries += await gather_ordered([self._read_one(entry_id) for entry_id in rest])
        return entries

    async def _read_one(self, entry_id: int) -> Entry:
        md = self._md
        bookies = bookies_for_entry(md.ensembles, entry_id, md.write_quorum)
        try:
            copy = await self._reader.read_entry(bookies, entry_id)
        except BKError:
            if md.is_closed:
                raise
            # An open ledger may have changed ensemble since this handle read its metadata.
            fresh = await self.refresh_metadata()
            fresh_bookies = bookies_for_entry(fresh.ensembles, entry_id, fresh.write_quorum)
            if fresh_bookies == bookies:
                raise
            copy = await self._reader.read_entry(fresh_bookies, entry_id)
        return Entry(self.ledger_id, entry_id, copy.payload)

    async def close(self) -> None:
        """Release the handle (reads hold no resources between calls; closing is optional)."""

    async def __aenter__(self) -> ReadHandle:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
