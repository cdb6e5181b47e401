"""Tailing an open ledger: long polls that answer with the entries (docs/client.md "Tailing").

A poll round long-polls the bookies of the last segment with READ_ENTRIES (BookKeeper's
readLastAddConfirmedAndEntry): a bookie answers as soon as its LAC passes the reader's, with
the entries it holds up to that LAC. So that every entry comes once:
- ensemble == write quorum: one bookie (the *entries bookie*) is asked for the entries; the
  others are asked for their LAC only, and only once it has been quiet for
  `LAC_ONLY_AFTER_SECONDS` (while entries flow, a round is one request; when it is down or
  stuck, they tell the LAC moved). Its answer ends the round; what it lacked is read by range
  reads. A bookie that fails its poll, or stays quiet while the others' LACs move, is the
  entries bookie no more;
- striped: bookie j is asked for the stride of entries that start their write set at j; the
  round ends once every entry up to the highest LAC came, or `STRAGGLER_SECONDS` after the
  first answer that moved the LAC.
Imports no transport code (bookies are reached through `ClientContext.ops`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from itertools import repeat
from typing import cast

import structlog

from bkaio.errors import BKError
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.reads import cancel_all
from bkaio.ledger_client.types import EntriesAnswer, Entry
from bkaio.protocol.messages import I64_MAX
from bkaio.protocol.records import scan_records

log = structlog.get_logger(__name__)

# After the first answer that moves the LAC, the other answers are waited for this long (a
# striped ledger's other strides; they come within a loop iteration or two when the writer's
# WRITE_LAC reaches every bookie at once).
STRAGGLER_SECONDS = 0.002
# A contiguous segment's other bookies are asked for their LAC once the entries bookie has not
# answered for this long.
LAC_ONLY_AFTER_SECONDS = 0.005

_Asks = dict[asyncio.Future[EntriesAnswer], tuple[int, int]]  # A poll -> (index, first entry).


def _retrieve(ask: asyncio.Future[EntriesAnswer]) -> None:
    if not ask.cancelled():
        ask.exception()


_new_entry = cast(
    Callable[[tuple[int, int, bytes]], Entry], functools.partial(tuple.__new__, Entry)
)


class TailPoller:
    """Poll rounds over one ledger's last segment (see the module docstring)."""

    def __init__(self, context: ClientContext, ledger_id: int, write_quorum: int) -> None:
        self._ctx = context
        self.ledger_id = ledger_id
        self._write_quorum = write_quorum
        self._entries_index = 0  # Ensemble == write quorum: the bookie asked for entries.
        # The next round's polls, sent as soon as a round moved the LAC (a poll is waiting at
        # the bookies while the consumer works): (bookies, previous_lac, asks, started at).
        self._next: tuple[tuple[str, ...], int, _Asks, float] | None = None

    def _ask(
        self,
        bookie_id: str,
        first: int,
        stride: int,
        count: int,
        previous_lac: int,
        wait_seconds: float,
    ) -> asyncio.Future[EntriesAnswer]:
        return asyncio.ensure_future(
            self._ctx.ops.read_entries(
                bookie_id,
                self.ledger_id,
                first,
                I64_MAX,
                stride=stride,
                max_count=count,
                max_bytes=self._ctx.config.read_batch_bytes,
                previous_lac=previous_lac,
                long_poll_seconds=wait_seconds,
            )
        )

    def _first_asks(
        self, bookies: tuple[str, ...], previous_lac: int, wait_seconds: float
    ) -> _Asks:
        """A round's first polls: every stride's bookie (striped), else the entries bookie."""
        size = len(bookies)
        first = previous_lac + 1
        count = self._ctx.config.read_batch_entries
        asks: _Asks = {}
        if size != self._write_quorum:
            for index, bookie_id in enumerate(bookies):
                start = first + (index - first) % size  # The first entry of stride `index`.
                ask = self._ask(bookie_id, start, size, count, previous_lac, wait_seconds)
                asks[ask] = (index, start)
        else:
            index = self._entries_index % size
            asks[self._ask(bookies[index], first, 1, count, previous_lac, wait_seconds)] = (
                index,
                first,
            )
        return asks

    def close(self) -> None:
        """Cancel the polls sent ahead for a round nobody asked for."""
        if self._next is not None:
            _, _, asks, _ = self._next
            self._next = None
            for ask in asks:
                ask.cancel()

    async def poll(
        self, bookies: tuple[str, ...], previous_lac: int, wait_seconds: float
    ) -> tuple[int, list[Entry]]:
        """One round: (the highest LAC any bookie answered, at least `previous_lac`; the entries
        previous_lac + 1 ... that came, in order and without a gap, possibly none).

        Polls sent ahead by the previous round (for this `previous_lac`) are used as they are;
        when this round moves the LAC, the next round's polls are sent before it returns.
        """
        size = len(bookies)
        first = previous_lac + 1
        striped = size != self._write_quorum
        loop = asyncio.get_running_loop()
        ahead = self._next
        if ahead is not None and ahead[0] == bookies and ahead[1] == previous_lac:
            self._next = None
            _, _, asks, started = ahead
        else:
            self.close()
            asks, started = self._first_asks(bookies, previous_lac, wait_seconds), loop.time()
        # Contiguous segment: the other bookies are asked for their LAC only once the entries
        # bookie has been quiet for LAC_ONLY_AFTER_SECONDS (entries flowing: one request a
        # round; the entries bookie down or stuck: the others tell the LAC moved).
        lac_only_at = None if striped else started + LAC_ONLY_AFTER_SECONDS
        best = previous_lac
        found: dict[int, bytes] = {}
        entries_answered = False
        ends_at: float | None = None  # Stop waiting for stragglers then.
        pending = set(asks)
        try:
            while pending:
                deadlines = [t for t in (ends_at, lac_only_at) if t is not None]
                timeout = max(0.0, min(deadlines) - loop.time()) if deadlines else None
                done, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                now = loop.time()
                if lac_only_at is not None and now >= lac_only_at:
                    lac_only_at = None
                    for index, bookie_id in enumerate(bookies):
                        if index != self._entries_index % size:
                            ask = self._ask(bookie_id, first, 1, 0, previous_lac, wait_seconds)
                            asks[ask] = (index, first)
                            pending.add(ask)
                for ask in done:
                    index, start = asks[ask]
                    error = ask.exception()
                    if error is not None:
                        if not isinstance(error, BKError):
                            raise error
                        log.debug(
                            "tail_poll_failed",
                            ledger_id=self.ledger_id,
                            bookie_id=bookies[index],
                            error=str(error),
                        )
                        if not striped and index == self._entries_index % size:
                            self._entries_index += 1  # Ask another one from now on.
                            lac_only_at = now  # And the others for their LAC at once.
                        continue
                    answer = ask.result()
                    best = max(best, answer.lac)
                    if not striped and index == self._entries_index % size:
                        entries_answered = answer.lac > previous_lac
                    if answer.records:
                        scan = scan_records(
                            answer.records, self.ledger_id, start, size if striped else 1, I64_MAX
                        )
                        found.update(zip(scan.entry_ids, scan.payloads, strict=True))
                if best > previous_lac:
                    # Done when every entry up to the LAC came (`found` holds only entries of
                    # first..best, each once), or the entries bookie answered (what it lacks
                    # is read by range reads); else the stragglers get a moment.
                    if len(found) == best - previous_lac or entries_answered:
                        break
                    if ends_at is None:
                        ends_at = now + STRAGGLER_SECONDS
                    elif now >= ends_at:
                        if not striped:
                            self._entries_index += 1  # It stayed quiet while the LAC moved.
                        break
        finally:
            await cancel_all(list(pending))
        if best > previous_lac:
            ahead_asks = self._first_asks(bookies, best, wait_seconds)
            for ask in ahead_asks:  # Perhaps never awaited (the reader moved on or went away).
                ask.add_done_callback(_retrieve)
            self._next = (bookies, best, ahead_asks, loop.time())
        payloads: list[bytes] = []
        for entry_id in range(first, best + 1):
            payload = found.get(entry_id)
            if payload is None:
                break
            payloads.append(payload)
        ids = range(first, first + len(payloads))
        return best, list(map(_new_entry, zip(repeat(self.ledger_id), ids, payloads)))
