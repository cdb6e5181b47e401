"""The auditor: finds ledgers with fragments on lost bookies, marks them under-replicated, and
keeps the marks true.

One auditor runs in the cluster at a time (leader election on the leased key /auditor, in
`AutorecoveryService`). While elected it audits:
- when the set of registered bookies changes (join, leave, read-only flip);
- when an operator asks (`bkaio shell triggeraudit`, the key /underreplication/control/
  audit_request) or changes the lost-bookie delay (`lostbookierecoverydelay --set`);
- once when a lost bookie's delay runs out;
- every `audit_interval_seconds` otherwise (BookKeeper's periodic bookie check);
and never more often than once per `_MIN_AUDIT_GAP_SECONDS`, however many changes arrive.

An audit scans every ledger's metadata once. A bookie named by some segment but registered
neither writable nor read-only is *lost*; once it has stayed lost for the lost-bookie delay
(the metadata's value when an operator set one, else the config's), every ledger naming it is
marked with it as missing. A decommissioned bookie is lost at once. An operator's audit
request marks the ledgers of every lost bookie without waiting out the delay (BookKeeper's
triggerAudit). Then every existing mark nobody holds the lock of is re-evaluated: bookies that
came back, or that the ledger no longer names, leave it, and a mark left with no missing
bookie (or whose ledger was deleted) is dropped. An incomplete bookie (the ledger check's) stays
while the ledger names it, registered or not: one momentarily unregistered (a lease lost and
re-registered) still lacks its entries when it is back; one gone for good is marked missing
after the delay and moved off, and then no longer named.

The ledger check (with a `LedgerChecker`) asks the registry which bookies exist at its start,
never a watch-fed view. A ledger it could not check completely (a bookie gave no entry list) is
remembered and checked again on its own after a jittered, growing delay, until it is checked.
Counters count ledgers: a ledger already marked is not counted again. Nothing happens while
autorecovery is disabled.

The auditor acts on its election: its marks and their updates are compare-and-swaps of other
keys than /auditor, which the store does not tie to the leadership lease. So each write of a
pass (a mark, a mark's update or removal) waits until the store certainly holds that lease
(`Lease.wait_confirmed`): after an event-loop stall past the TTL the lease is in doubt until the
keep-alive's late refresh answers, and another candidate may have been elected meanwhile. When
the store does not confirm it, the pass stops there (`LeadershipUnconfirmedError`, retried like
a failed audit; a lost lease ends the leadership, and the service stands for election again).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError, NoSuchLedgerError
from bkaio.meta import EventKind, LedgerMetadata, Metadata, UnderreplicatedLedger, WatchEvent
from bkaio.meta.autorecovery import (
    AUDIT_REQUEST_KEY,
    DISABLE_KEY,
    UNDERREPLICATED_PREFIX,
    decodes_as_mark,
)
from bkaio.meta.errors import InvalidMetadataError
from bkaio.meta.ledger_metadata import deserialize
from bkaio.meta.ledgers import LEDGERS_PREFIX, ledger_id_of
from bkaio.meta.store import Lease

from .checker import LedgerCheck, LedgerChecker, UncheckedLedgers
from .concurrency import first_failure
from .metrics import AutorecoveryMetrics

log = structlog.get_logger(__name__)

_LEDGER_CHECKERS = 8  # Ledgers the ledger check looks at concurrently.
_MIN_AUDIT_GAP_SECONDS = 0.2  # A storm of registry changes still audits a few times a second.
_DISABLED_RECHECK_SECONDS = 30.0  # The switch is watched; this only bounds a missed event.
_WATCH_RETRY = (0.5, 10.0)  # Backoff of a failed watch: initial and maximum seconds.
_RECHECK_BACKOFF = (5.0, 300.0)  # Re-checks of ledgers a check could not finish: seconds.


class LeadershipUnconfirmedError(BKError):
    """The auditor's lease is lost, or was in doubt and not confirmed again in time: another
    candidate may be the auditor now, so this one wrote nothing more."""


@dataclass(frozen=True, slots=True)
class AuditReport:
    ledgers_scanned: int
    lost_bookies: tuple[str, ...]
    ledgers_marked: int  # Ledgers marked that were not marked before.
    waiting_bookies: tuple[str, ...]  # Lost, but still inside the lost-bookie delay.
    marks_narrowed: int = 0  # Marks that lost a bookie (it came back, or was moved off).
    marks_dropped: int = 0  # Marks deleted: nothing missing any more, or the ledger is gone.
    under_replicated: int = 0  # Marks left after this audit.
    lost_bookie_delay_seconds: float = 0.0  # The delay this audit applied.


async def all_ledgers(metadata: Metadata) -> AsyncGenerator[LedgerMetadata, None]:
    """Every ledger's metadata, one page of the store at a time (unreadable ones logged)."""
    async for kv in metadata.store.iterate_prefix(LEDGERS_PREFIX):
        ledger_id = ledger_id_of(kv.key)
        try:
            yield deserialize(kv.value, ledger_id=ledger_id, version=kv.version)
        except BKError as error:
            log.warning("audit_bad_ledger_metadata", ledger_id=ledger_id, error=str(error))


async def ledgers_by_bookie(metadata: Metadata) -> tuple[dict[str, set[int]], int]:
    """bookie id -> ids of the ledgers whose segments name it; and how many ledgers exist."""
    index: dict[str, set[int]] = {}
    count = 0
    async for record in all_ledgers(metadata):
        count += 1
        for _, ensemble in record.ensembles:
            for bookie_id in ensemble:
                index.setdefault(bookie_id, set()).add(record.ledger_id)
    return index, count


async def ledgers_naming(metadata: Metadata, bookie_id: str) -> list[LedgerMetadata]:
    """The metadata of every ledger with a segment naming `bookie_id`, by ledger id."""
    return [
        record
        async for record in all_ledgers(metadata)
        if any(bookie_id in ensemble for _, ensemble in record.ensembles)
    ]


class Auditor:
    """The audit loop of the elected auditor (run while leadership lasts, then cancelled)."""

    def __init__(
        self,
        metadata: Metadata,
        metrics: AutorecoveryMetrics,
        *,
        lease: Lease,
        lost_bookie_delay_seconds: float,
        audit_interval_seconds: float,
        checker: LedgerChecker | None = None,
        ledger_check_interval_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`lease`: the one this auditor was elected with (`AuditorLeadership.lease`); nothing
        is written while the store may have dropped it. `checker` and
        `ledger_check_interval_seconds` (> 0): also check, that often, that live bookies hold
        every entry of their fragments (the first check one interval after election)."""
        self._metadata = metadata
        self._lease = lease
        self._checker = checker if ledger_check_interval_seconds > 0 else None
        self._check_interval = ledger_check_interval_seconds
        self._metrics = metrics
        self._configured_delay = lost_bookie_delay_seconds
        self._delay = lost_bookie_delay_seconds
        self._interval = audit_interval_seconds
        self._clock = clock
        self._lost_since: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._reasons: set[str] = {"elected"}
        self._next_periodic = clock()
        self._next_ledger_check = clock() + ledger_check_interval_seconds
        self._unchecked: set[int] = set()  # Ledgers the last check could not check completely.
        self._recheck = Backoff(*_RECHECK_BACKOFF)
        self._next_recheck = 0.0

    @property
    def unchecked_ledgers(self) -> set[int]:
        """Ledgers the ledger check could not check completely; they are checked again."""
        return set(self._unchecked)

    async def _still_elected(self, step: str) -> None:
        """Return when the store certainly holds the leadership lease (waiting, bounded, while
        it is in doubt); LeadershipUnconfirmedError naming `step` otherwise."""
        if not await self._lease.wait_confirmed():
            raise LeadershipUnconfirmedError(
                f"auditor: not {step}: its lease is lost or unconfirmed, so another candidate "
                "may be the auditor now"
            )

    def trigger(self, reason: str = "requested") -> None:
        """Audit soon (the bookie set changed, or an operator asked: then without the delay)."""
        self._reasons.add(reason)
        self._wake.set()

    async def audit_once(self, *, skip_delay: bool = False) -> AuditReport:
        """One audit: mark the ledgers of bookies lost past the delay (all lost bookies with
        `skip_delay`), then re-evaluate the existing marks."""
        started = time.monotonic()
        underreplication = self._metadata.underreplication
        # Marks first: a mark read before the ledger scan names a ledger that existed then,
        # so a ledger missing from the scan was deleted (not created behind the scan's back).
        marks = [record async for record in underreplication.list()]
        locked = await underreplication.locked()
        registered = await self._metadata.bookies.ids()
        decommissioned = await self._metadata.decommissioned.ids()
        override = await underreplication.lost_bookie_delay()
        self._delay = self._configured_delay if override is None else override
        index, scanned = await ledgers_by_bookie(self._metadata)
        now = self._clock()
        lost = {b for b in index if b not in registered} | (decommissioned & index.keys())
        for bookie_id in list(self._lost_since):
            if bookie_id not in lost:
                del self._lost_since[bookie_id]  # Back, or nothing names it any more.
        ready: list[str] = []
        waiting: list[str] = []
        for bookie_id in sorted(lost):
            since = self._lost_since.setdefault(bookie_id, now)
            if skip_delay or bookie_id in decommissioned or now - since >= self._delay:
                ready.append(bookie_id)
            else:
                waiting.append(bookie_id)
        missing_by_ledger: dict[int, list[str]] = {}
        for bookie_id in ready:
            for ledger_id in index[bookie_id]:
                missing_by_ledger.setdefault(ledger_id, []).append(bookie_id)
        created = 0
        for ledger_id in sorted(missing_by_ledger):
            await self._still_elected(f"marking ledger {ledger_id}")
            try:
                result = await underreplication.mark(ledger_id, missing_by_ledger[ledger_id])
            except InvalidMetadataError:
                continue  # Its record does not decode (reported by `mark`): an operator's.
            created += int(result.created)
        narrowed, dropped = await self._reevaluate(marks, locked, index, lost)
        under_replicated = len(marks) + created - dropped
        if created:
            self._metrics.ledgers_marked.inc(created)
            log.info("audit_marked", lost_bookies=ready, ledgers_marked=created)
        self._metrics.lost_bookies.set(len(lost))
        self._metrics.under_replicated_ledgers.set(under_replicated)
        self._metrics.audit_seconds.observe(time.monotonic() - started)
        self._next_periodic = self._clock() + self._interval
        return AuditReport(
            scanned,
            tuple(sorted(lost)),
            created,
            tuple(waiting),
            narrowed,
            dropped,
            under_replicated,
            self._delay,
        )

    async def _reevaluate(
        self,
        marks: list[UnderreplicatedLedger],
        locked: set[int],
        index: dict[str, set[int]],
        lost: set[str],
    ) -> tuple[int, int]:
        """Narrow or drop marks whose bookies came back or were moved off; (narrowed, dropped).
        Incomplete bookies stay while they are named (a lost one is also marked missing after
        the delay, moved off, and then no longer named). A locked mark is left to its holder,
        which re-checks before copying."""
        narrowed = dropped = 0
        for record in marks:
            if record.ledger_id in locked:
                continue
            ledger_id = record.ledger_id
            still = {
                bookie_id
                for bookie_id in record.missing_bookies
                if ledger_id in index.get(bookie_id, ())
                and (bookie_id in lost or bookie_id in record.forced_bookies)
            }
            # Kept while named, registered or not (see the module docstring).
            still_incomplete = {
                bookie_id
                for bookie_id in record.incomplete_bookies
                if ledger_id in index.get(bookie_id, ())
            }
            if still == set(record.missing_bookies) and still_incomplete == set(
                record.incomplete_bookies
            ):
                continue
            underreplication = self._metadata.underreplication
            await self._still_elected(f"updating the mark of ledger {ledger_id}")
            if not await underreplication.narrow(record, still, still_incomplete):
                continue  # Changed meanwhile (a worker, a new mark): the next audit sees it.
            if still or still_incomplete:
                narrowed += 1
            else:
                dropped += 1
            log.info(
                "audit_mark_updated",
                ledger_id=ledger_id,
                missing_before=list(record.missing_bookies),
                missing_now=sorted(still),
                incomplete_before=list(record.incomplete_bookies),
                incomplete_now=sorted(still_incomplete),
            )
        return narrowed, dropped

    async def check_ledgers(self) -> int:
        """The ledger check: mark every closed ledger whose live bookies lack entries of
        their fragments, those bookies as incomplete (the workers copy the entries they lack
        back to them). Ledgers it could not check completely are checked again later
        (`recheck_ledgers`). Ledgers newly marked."""
        assert self._checker is not None
        started = time.monotonic()
        registered = await self._metadata.bookies.ids()
        ledgers = all_ledgers(self._metadata)
        created = checked = 0
        unchecked = UncheckedLedgers()
        lock = asyncio.Lock()  # One reader of the shared ledger iterator at a time.

        async def next_closed() -> LedgerMetadata | None:
            async with lock:
                async for md in ledgers:
                    if md.is_closed:
                        return md
            return None

        async def check_some() -> None:
            nonlocal created, checked
            while (md := await next_closed()) is not None:
                checked += 1
                created += await self._check_one(md, registered, unchecked)

        try:
            await first_failure([check_some() for _ in range(_LEDGER_CHECKERS)])
        finally:
            await ledgers.aclose()
        self._unchecked = unchecked.ledgers
        self._recheck.reset()
        self._next_recheck = self._clock() + self._recheck.next_delay()
        self._metrics.ledgers_unchecked.set(len(unchecked.ledgers))
        if created:
            self._metrics.ledgers_marked.inc(created)
        self._metrics.audit_seconds.observe(time.monotonic() - started)
        self._next_ledger_check = self._clock() + self._check_interval
        log.info(
            "ledger_check_done",
            ledgers_checked=checked,
            ledgers_marked=created,
            ledgers_unchecked=len(unchecked.ledgers),
        )
        unchecked.report("ledger_check_unchecked")
        return created

    async def recheck_ledgers(self) -> int:
        """Check again the ledgers the last check could not check completely; those that still
        cannot be are tried again after a longer (jittered) delay. Ledgers newly marked."""
        assert self._checker is not None
        registered = await self._metadata.bookies.ids()
        created = 0
        unchecked = UncheckedLedgers()
        for ledger_id in sorted(self._unchecked):
            try:
                md = await self._metadata.ledgers.get(ledger_id)
            except NoSuchLedgerError:
                continue  # Deleted: nothing to check.
            created += await self._check_one(md, registered, unchecked)
        self._unchecked = unchecked.ledgers
        self._next_recheck = self._clock() + self._recheck.next_delay()
        self._metrics.ledgers_unchecked.set(len(unchecked.ledgers))
        if created:
            self._metrics.ledgers_marked.inc(created)
        log.info(
            "ledger_recheck_done", ledgers_marked=created, ledgers_unchecked=len(unchecked.ledgers)
        )
        unchecked.report("ledger_recheck_unchecked")
        return created

    async def _check_one(
        self, md: LedgerMetadata, registered: set[str], unchecked: UncheckedLedgers
    ) -> int:
        """Check one ledger, mark its incomplete bookies, note it in `unchecked` when some
        bookie gave no verdict; 1 when the ledger was newly marked."""
        assert self._checker is not None
        result: LedgerCheck = await self._checker.check(md, registered)
        if result.unchecked:
            unchecked.add(md.ledger_id, result.unchecked)
        if not result.incomplete:
            return 0
        incomplete = result.incomplete
        await self._still_elected(f"marking ledger {md.ledger_id} incomplete")
        try:
            marked = await self._metadata.underreplication.mark(
                md.ledger_id, incomplete, incomplete=True
            )
        except InvalidMetadataError:
            return 0  # Its record does not decode (reported by `mark`): an operator's.
        log.warning(
            "ledger_check_incomplete",
            ledger_id=md.ledger_id,
            missing={bookie: len(ids) for bookie, ids in incomplete.items()},
            first_missing={bookie: ids[0] for bookie, ids in incomplete.items()},
        )
        return int(marked.created)

    def next_wait(self) -> float:
        """Seconds until an audit is due without any event: the periodic one, or sooner when a
        lost bookie's delay runs out. Bookies already past their delay add no wake-up."""
        now = self._clock()
        wait = max(0.0, self._next_periodic - now)
        if self._checker is not None:
            wait = min(wait, max(0.0, self._next_ledger_check - now))
            if self._unchecked:
                wait = min(wait, max(0.0, self._next_recheck - now))
        for since in self._lost_since.values():
            due = since + self._delay
            if due > now:
                wait = min(wait, due - now)
        return wait

    async def run(self) -> None:
        """Audit on events and on schedule until cancelled; an unexpected error in the loop
        or a watch ends the run (the service's supervisor restarts the election)."""
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self._audit_loop(), name="auditor-loop"),
            loop.create_task(self._follow(self._bookie_changes, "bookies")),
            loop.create_task(self._follow(self._control_changes, "controls")),
            loop.create_task(self._follow(self._mark_count, "marks")),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _audit_loop(self) -> None:
        errors = Backoff(1.0, 60.0)
        while True:
            reasons, self._reasons = self._reasons, set()
            self._wake.clear()
            started = self._clock()
            try:
                if await self._metadata.underreplication.is_enabled():
                    if self.next_wait() <= 0:
                        reasons.add("scheduled")
                    self._metrics.audits.labels(reason=_main_reason(reasons)).inc()
                    report = await self.audit_once(skip_delay="requested" in reasons)
                    log.debug("audited", reasons=sorted(reasons), **_report_fields(report))
                    if self._checker is not None and self._clock() >= self._next_ledger_check:
                        self._metrics.audits.labels(reason="ledger_check").inc()
                        await self.check_ledgers()
                    elif self._unchecked and self._clock() >= self._next_recheck:
                        self._metrics.audits.labels(reason="ledger_recheck").inc()
                        await self.recheck_ledgers()
                    wait = self.next_wait()
                else:
                    wait = _DISABLED_RECHECK_SECONDS
                errors.reset()
            except BKError as error:
                wait = errors.next_delay()
                log.warning("audit_failed", error=str(error), retry_seconds=round(wait, 2))
                self._reasons |= reasons  # Not done: keep what was asked for.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            gap = _MIN_AUDIT_GAP_SECONDS - (self._clock() - started)
            if gap > 0:
                await asyncio.sleep(gap)

    async def _follow(self, watch: Callable[[], AsyncIterator[str]], what: str) -> None:
        """Trigger an audit for each event; a watch that fails (or ends) is started again
        after a backoff, with an audit for whatever it may have missed."""
        retry = Backoff(*_WATCH_RETRY)
        while True:
            events = watch()
            try:
                async with contextlib.aclosing(events):  # type: ignore[type-var]
                    async for reason in events:
                        retry.reset()
                        self.trigger(reason)
            except BKError as error:
                log.warning("auditor_watch_failed", watch=what, error=str(error))
            await asyncio.sleep(retry.next_delay())
            self.trigger("watch_restarted")

    async def _mark_count(self) -> AsyncIterator[str]:
        """Keeps bkaio_autorecovery_under_replicated_ledgers current as workers complete
        marks (between audits); yields nothing: no audit is needed for that. Only records that
        decode count, as in an audit's figure (a bad record is counted apart, by the listing)."""
        store = self._metadata.store
        snapshot = await store.snapshot_prefix(UNDERREPLICATED_PREFIX)
        marked = {kv.key for kv in snapshot.kvs if decodes_as_mark(kv.key, kv.value)}
        gauge = self._metrics.under_replicated_ledgers
        gauge.set(len(marked))
        events = store.watch_prefix(UNDERREPLICATED_PREFIX, start_revision=snapshot.revision + 1)
        async with contextlib.aclosing(events):
            async for event in events:
                if event.kind is EventKind.PUT and decodes_as_mark(event.key, event.value):
                    marked.add(event.key)
                else:
                    marked.discard(event.key)  # Deleted, or overwritten by a bad record.
                gauge.set(len(marked))
        for _ in ():  # An async generator that never yields.
            yield ""

    async def _bookie_changes(self) -> AsyncIterator[str]:
        first = True
        async for _ in self._metadata.bookies.watch():
            if not first:
                yield "bookies_changed"
            first = False

    async def _control_changes(self) -> AsyncIterator[str]:
        """Audit requests, delay changes and the enable switch (one watch each)."""
        store = self._metadata.store
        start = await store.current_revision() + 1
        controls = self._metadata.underreplication.watch_controls(start)
        switch = store.watch_prefix(DISABLE_KEY, start_revision=start)
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=16)

        async def pump(
            events: AsyncIterator[WatchEvent], reason: Callable[[WatchEvent], str]
        ) -> None:
            async for event in events:
                with contextlib.suppress(asyncio.QueueFull):  # A full queue wakes anyway.
                    queue.put_nowait(reason(event))

        def control_reason(event: WatchEvent) -> str:
            return "requested" if event.key == AUDIT_REQUEST_KEY else "delay_changed"

        loop = asyncio.get_running_loop()
        pumps = [
            loop.create_task(pump(controls, control_reason)),
            loop.create_task(pump(switch, lambda _: "switched")),
        ]
        getter: asyncio.Task[str] | None = None
        try:
            while True:
                getter = loop.create_task(queue.get())
                done, _ = await asyncio.wait([getter, *pumps], return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                    continue
                for task in pumps:
                    if task.done():
                        task.result()  # A watch ended by raising: retried by `_follow`.
                raise BKError("auditor control watch ended")  # pragma: no cover
        finally:
            # The getter too: stopped while waiting, it would be left pending, and its
            # destruction reported to the loop's exception handler as an error.
            waited: list[asyncio.Task[Any]] = [*pumps, getter] if getter is not None else [*pumps]
            for waiting in waited:
                waiting.cancel()
            await asyncio.gather(*waited, return_exceptions=True)


def _main_reason(reasons: set[str]) -> str:
    for reason in ("requested", "elected", "bookies_changed", "delay_changed", "switched"):
        # The first that applies names the audit in bkaio_autorecovery_audits_total{reason}.
        if reason in reasons:
            return reason
    return "scheduled"


def _report_fields(report: AuditReport) -> dict[str, object]:
    return {
        "ledgers_scanned": report.ledgers_scanned,
        "lost_bookies": list(report.lost_bookies),
        "ledgers_marked": report.ledgers_marked,
        "waiting_bookies": list(report.waiting_bookies),
        "marks_narrowed": report.marks_narrowed,
        "marks_dropped": report.marks_dropped,
        "under_replicated": report.under_replicated,
    }
