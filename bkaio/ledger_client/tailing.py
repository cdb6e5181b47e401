"""Tailing an open ledger: long polls that answer with the entries (docs/client.md "Tailing").

A poll round long-polls the bookies of the last segment with READ_ENTRIES (BookKeeper's
readLastAddConfirmedAndEntry): a bookie answers as soon as its LAC passes the reader's, with
the entries it holds up to that LAC. So that every entry comes once:
- ensemble == write quorum: one bookie (the *entries bookie*) is asked for the entries; the
  others are asked for their LAC only, and only once it has been quiet for
  `LAC_ONLY_AFTER_SECONDS` (while entries flow, a round is one request; when it is down or
  stuck, they tell the LAC moved). Its answer ends the round (one without news has them asked
  at once); what it lacked is read by range reads. A bookie that fails its poll, stays quiet
  while the others' LACs move, or answers without news while they move it, is the entries
  bookie no more;
- striped: bookie j is asked for the stride of entries that start their write set at j; the
  round ends once every entry up to the highest LAC came, or `STRAGGLER_SECONDS` after the
  first answer that moved the LAC.
Whatever the bookies do, a round is over by the end of its wait, and asks each bookie at most
once: when every one fails at once (connections waiting out their reconnect backoff), the round
ends at once, says it was cut short, and the caller (read_handle.py) pauses before the next.
Imports no transport code (bookies are reached through `ClientContext.ops`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from itertools import repeat
from typing import NamedTuple, cast

import structlog

from bkaio.errors import BKError
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.reads import cancel_all
from bkaio.ledger_client.types import EntriesAnswer, Entry
from bkaio.protocol.messages import I64_MAX
from bkaio.protocol.records import scan_records
from bkaio.supervision import loop_supervisor

log = structlog.get_logger(__name__)

# After the first answer that moves the LAC, the other answers are waited for this long (a
# striped ledger's other strides; they come within a loop iteration or two when the writer's
# WRITE_LAC reaches every bookie at once).
STRAGGLER_SECONDS = 0.002
# A contiguous segment's other bookies are asked for their LAC once the entries bookie has not
# answered for this long.
LAC_ONLY_AFTER_SECONDS = 0.005

_Asks = dict[asyncio.Future[EntriesAnswer], tuple[int, int]]  # A poll -> (index, first entry).


class PollRound(NamedTuple):
    """What one poll round learned."""

    lac: int  # The highest LAC any bookie answered, at least the round's previous_lac.
    entries: list[Entry]  # previous_lac + 1 ... that came, in order, without a gap; maybe none.
    # No progress, and over before half its time: no bookie waited (every poll failed, or the
    # bookies answered at once: a fenced ledger). The caller pauses before the next round.
    cut_short: bool


class _Ahead(NamedTuple):
    """The next round's polls, sent as soon as a round moved the LAC (they wait at the bookies
    while the consumer works)."""

    bookies: tuple[str, ...]
    previous_lac: int
    asks: _Asks
    started: float
    ends_at: float  # The end of their long poll: the bookies have answered them by then.
    taken: list[bool]  # [True] once a round took them up: it raises a bug it finds itself.


def _retrieve(taken: list[bool], ask: asyncio.Future[EntriesAnswer]) -> None:
    """A poll sent ahead, perhaps never awaited: a BKError is expected (a bookie down; a round
    that uses the poll sees it); anything else is a bug, reported (ERROR, counted) unless a
    round took the poll up (it raises the bug to its caller: counted there, once)."""
    if taken[0] or ask.cancelled():
        return
    error = ask.exception()
    if error is not None and not isinstance(error, BKError):
        loop_supervisor().report("tail_poll", error)


def _moved(ask: asyncio.Future[EntriesAnswer], previous_lac: int) -> bool:
    """The poll was answered with a LAC past `previous_lac`."""
    return (
        ask.done()
        and not ask.cancelled()
        and ask.exception() is None
        and ask.result().lac > previous_lac
    )


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
        self._next: _Ahead | None = None

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
        ahead, self._next = self._next, None
        if ahead is not None:
            for ask in ahead.asks:
                ask.cancel()

    def _take_ahead(self, bookies: tuple[str, ...], previous_lac: int, now: float) -> _Ahead | None:
        """The polls sent ahead, if they are this round's and of use: their long poll is not
        over, or one of them moved the LAC (answered while the consumer worked). Polls answered
        at their end without news would end the round at once and look like a failed one."""
        ahead = self._next
        if (
            ahead is not None
            and ahead.bookies == bookies
            and ahead.previous_lac == previous_lac
            and (now < ahead.ends_at or any(_moved(ask, previous_lac) for ask in ahead.asks))
        ):
            self._next = None
            ahead.taken[0] = True  # Also for a poll whose callback is scheduled already.
            return ahead
        self.close()
        return None

    async def poll(
        self, bookies: tuple[str, ...], previous_lac: int, wait_seconds: float
    ) -> PollRound:
        """One round, over within `wait_seconds` (sooner for polls sent ahead, whose wait
        started earlier) whatever the bookies do: a bookie is asked at most once a round.

        Polls sent ahead by the previous round (for this `previous_lac`) are used as they are;
        when this round moves the LAC, the next round's polls are sent before it returns.
        """
        size = len(bookies)
        first = previous_lac + 1
        striped = size != self._write_quorum
        loop = asyncio.get_running_loop()
        now = loop.time()
        ahead = self._take_ahead(bookies, previous_lac, now)
        if ahead is not None:
            asks, started = ahead.asks, ahead.started
            round_ends_at = min(ahead.ends_at, now + wait_seconds)
        else:
            asks = self._first_asks(bookies, previous_lac, wait_seconds)
            started, round_ends_at = now, now + wait_seconds
        asked = {index for index, _ in asks.values()}
        count = self._ctx.config.read_batch_entries
        # Contiguous segment: the round's one poll for entries. The other bookies are asked
        # for their LAC only once it has been quiet for LAC_ONLY_AFTER_SECONDS, or has failed
        # (entries flowing: one request a round; the entries bookie down or stuck: the others
        # tell the LAC moved).
        entries_ask = None if striped else next(iter(asks))
        lac_only_at = None if striped else started + LAC_ONLY_AFTER_SECONDS
        best = previous_lac
        found: dict[int, bytes] = {}
        entries_answered = False
        behind = False  # The entries bookie answered without news.
        stragglers_until: float | None = None  # Stop waiting for stragglers then.
        pending = set(asks)
        try:
            # Asks already answered (polls sent ahead) are looked at before any is sent.
            while pending:
                deadlines = (stragglers_until, lac_only_at, round_ends_at)
                deadline = min(t for t in deadlines if t is not None)
                done, pending = await asyncio.wait(
                    pending, timeout=max(0.0, deadline - now), return_when=asyncio.FIRST_COMPLETED
                )
                now = loop.time()
                left = round_ends_at - now  # The long poll of an ask sent now.
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
                        if ask is entries_ask:
                            self._entries_index += 1  # Ask another one, unless it was asked.
                            then = self._entries_index % size
                            if then not in asked and left > 0:
                                asked.add(then)
                                entries_ask = self._ask(
                                    bookies[then], first, 1, count, previous_lac, left
                                )
                                asks[entries_ask] = (then, first)
                                pending.add(entries_ask)
                            lac_only_at = now  # And the others for their LAC at once.
                        continue
                    answer = ask.result()
                    best = max(best, answer.lac)
                    if ask is entries_ask:
                        entries_answered = answer.lac > previous_lac
                        if not entries_answered:
                            behind = True
                            # Answered without news before the round's end (a bookie behind
                            # the reader, or waking its polls): only the others can tell the
                            # LAC moved. Else the round ends with none of them asked, and the
                            # next asks this bookie again: a tail stuck while the ledger grows.
                            lac_only_at = now
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
                    if stragglers_until is None:
                        stragglers_until = now + STRAGGLER_SECONDS
                    elif now >= stragglers_until:
                        if entries_ask in pending:
                            self._entries_index += 1  # It stayed quiet while the LAC moved.
                        break
                if left <= 0:
                    break
                if lac_only_at is not None and now >= lac_only_at:
                    lac_only_at = None
                    for index, bookie_id in enumerate(bookies):
                        if index not in asked:  # Once a round: a bookie failing at once
                            asked.add(index)  # (reconnecting) must not be asked in a loop.
                            ask = self._ask(bookie_id, first, 1, 0, previous_lac, left)
                            asks[ask] = (index, first)
                            pending.add(ask)
        finally:
            await cancel_all(list(pending))
        if behind and best > previous_lac:
            self._entries_index += 1  # It had no news while the LAC moved: ask another next.
        # A bookie answers a long poll at its end (or just before: the wire rounds the wait
        # down to milliseconds), so a round over before half its time without news had no
        # bookie waiting: asking again at once would spin.
        cut_short = best == previous_lac and now < (started + round_ends_at) / 2
        if best > previous_lac:
            ahead_asks = self._first_asks(bookies, best, wait_seconds)
            taken = [False]
            retrieve = functools.partial(_retrieve, taken)
            for ask in ahead_asks:  # Perhaps never awaited (the reader moved on or went away).
                ask.add_done_callback(retrieve)
            started = loop.time()
            self._next = _Ahead(bookies, best, ahead_asks, started, started + wait_seconds, taken)
        payloads: list[bytes] = []
        for entry_id in range(first, best + 1):
            payload = found.get(entry_id)
            if payload is None:
                break
            payloads.append(payload)
        ids = range(first, first + len(payloads))
        entries = list(map(_new_entry, zip(repeat(self.ledger_id), ids, payloads)))
        return PollRound(best, entries, cut_short)
