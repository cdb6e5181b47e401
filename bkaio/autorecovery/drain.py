"""`recover_bookie` and `decommission_bookie`: move every fragment off one bookie now, in the
calling process (what `bkaio shell recover|decommission` and the bookies' admin HTTP run).

    plan = await plan_recovery(uri, "10.0.0.7:3181", replacements=True)   # --query, --dry-run
    report = await recover_bookie(uri, "10.0.0.7:3181", progress, admin_token=token)
    report = await decommission_bookie(uri, "10.0.0.7:3181", progress, admin_token=token)

Both work in rounds until no ledger names the bookie: mark each ledger naming it (so the
replication workers finish if this process dies), claim it (a ledger a worker holds is left to
the worker and looked at again next round), replicate, complete. They refuse, before anything
is fenced or marked:
- an unknown bookie id (UnknownBookieError: not registered, no cookie, named by no ledger);
- `recover` of a bookie that is registered and alive, unless `force` (BookieAliveError):
  recovering a live bookie's ledgers fences their writers.
A ledger with an entry no surviving bookie has a valid copy of (each answered none or a bad
digest, or is not registered) is reported at once (`on_failure`) and left (marked, for the
workers); other failures (an entry a registered bookie may hold but does not answer for now, a
replacement that timed out, none writable now, the lease of the drain's locks in doubt and not
confirmed again when a swap or a mark's removal was due) are retried in later rounds,
with a backoff, until `timeout_seconds`, when what is left is reported. The mark of a ledger
the drain moved off its bookie is completed only when every copy it asks for is there: an
incomplete bookie (the ledger check's) that is not registered now is left in the mark for
the workers. `skip_open_ledgers` leaves ledgers that are not closed alone (nothing fenced).
`decommission` records the bookie as decommissioned first: the bookie turns read-only (so
writers move their open ledgers off it by ensemble change) and stays so, also across restarts,
until `recommission_bookie`. `tls` and `auth_token` are what the bookies require of clients
(the TLS context also verifies bookies whose admin API, asked for master keys, serves HTTPS).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError, BKTimeoutError, NotEnoughBookiesError
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta import Lease, LedgerMetadata, Metadata, UnderreplicatedLedger

from .admin import check_known_bookie, metadata_of
from .auditor import ledgers_naming
from .cluster import ClusterView, MasterKeys
from .concurrency import first_failure
from .fragments import EntryUnreadableError, fragment_entries, fragments_on
from .metrics import AutorecoveryMetrics
from .replicator import Outcome, Replicator, check_lock_lease

log = structlog.get_logger(__name__)

_ADMIN_LEASE_TTL_SECONDS = 10.0
_READ_ONLY_WAIT_SECONDS = 30.0
_ROUND_BACKOFF = (0.5, 10.0)  # Between rounds that made no progress: initial, maximum seconds.


class BookieAliveError(BKError):
    """`recover` of a registered, live bookie without `force`: nothing was fenced or closed."""


@dataclass(frozen=True, slots=True)
class RecoveryProgress:
    """Passed to the `progress` callback after each ledger."""

    bookie_id: str
    ledgers_total: int  # Ledgers naming the bookie when the current round started, plus done.
    ledgers_done: int
    entries: int  # Entries copied so far.
    bytes: int
    seconds: float
    entries_total: int = 0  # Entries to copy (closed fragments; open ones count once closed).
    ledgers_failed: int = 0


@dataclass(frozen=True, slots=True)
class LedgerFailure:
    """A ledger `recover`/`decommission` gave up on in this run (it stays marked)."""

    ledger_id: int
    error: str
    entry_id: int | None = None  # The entry no copy of was readable, when that was why.


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    bookie_id: str
    ledgers_replicated: int
    open_ledgers_recovered: int  # Fenced and closed because the bookie was in their open tail.
    fragments: int
    entries: int
    bytes: int
    seconds: float
    failed: dict[int, str] = field(default_factory=dict)  # Ledger -> last error (still marked).
    skipped_open: tuple[int, ...] = ()  # Not closed, left alone (`skip_open_ledgers`).
    unreadable: dict[int, int] = field(default_factory=dict)  # Ledger -> entry with no copy.

    @property
    def complete(self) -> bool:
        return not self.failed and not self.skipped_open

    @property
    def entries_per_second(self) -> float:
        return self.entries / self.seconds if self.seconds > 0 else 0.0

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        plain = asdict(self)
        plain["failed"] = {str(k): v for k, v in self.failed.items()}
        plain["unreadable"] = {str(k): v for k, v in self.unreadable.items()}
        plain["skipped_open"] = list(self.skipped_open)
        plain["complete"] = self.complete
        plain["entries_per_second"] = round(self.entries_per_second, 1)
        plain["megabytes_per_second"] = round(self.megabytes_per_second, 3)
        return plain


@dataclass(frozen=True, slots=True)
class PlannedFragment:
    first_entry_id: int
    last_entry_id: int  # first - 1 when empty; unknown (first - 1) for an open tail.
    entries: int
    open_tail: bool  # Would be fenced and closed first.
    replacement: str | None  # The bookie placement picks now (`replacements=True`), if any.


@dataclass(frozen=True, slots=True)
class PlannedLedger:
    ledger_id: int
    state: str  # OPEN, IN_RECOVERY, CLOSED
    fragments: tuple[PlannedFragment, ...]
    skipped: bool  # Not closed and `skip_open_ledgers`.

    @property
    def entries(self) -> int:
        return sum(f.entries for f in self.fragments)

    @property
    def would_fence(self) -> bool:
        return not self.skipped and any(f.open_tail for f in self.fragments)


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    bookie_id: str
    registered: bool
    ledgers: tuple[PlannedLedger, ...]

    @property
    def entries(self) -> int:
        return sum(ledger.entries for ledger in self.ledgers if not ledger.skipped)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bookie_id": self.bookie_id,
            "registered": self.registered,
            "entries": self.entries,
            "ledgers": [
                {**asdict(ledger), "entries": ledger.entries, "would_fence": ledger.would_fence}
                for ledger in self.ledgers
            ],
        }


ProgressCallback = Callable[[RecoveryProgress], None]
FailureCallback = Callable[[LedgerFailure], None]


def _plan_ledger(
    metadata: LedgerMetadata,
    bookie_id: str,
    skip_open: bool,
    view: ClusterView | None,
) -> PlannedLedger:
    planned = []
    for fragment in fragments_on(metadata, {bookie_id}):
        entries = len(
            list(fragment_entries(fragment, metadata.ensemble_size, metadata.write_quorum))
        )
        replacement = None
        if view is not None:
            with contextlib.suppress(NotEnoughBookiesError):
                replacement = view.placement.replace_bookie(
                    view.bookies,
                    fragment.ensemble,
                    fragment.bookie_index,
                    metadata.write_quorum,
                    exclude={bookie_id},
                )
        planned.append(
            PlannedFragment(
                fragment.first_entry_id,
                fragment.last_entry_id,
                entries,
                fragment.open_tail,
                replacement,
            )
        )
    return PlannedLedger(
        metadata.ledger_id,
        metadata.state.name,
        tuple(planned),
        skip_open and not metadata.is_closed,
    )


async def plan_recovery(
    metadata: str | Metadata,
    bookie_id: str,
    *,
    skip_open_ledgers: bool = False,
    replacements: bool = False,
) -> RecoveryPlan:
    """What `recover` would do, changing nothing: the ledgers naming the bookie, their
    fragments on it and entries to copy, which would be fenced, and (with `replacements`)
    where placement would put each fragment now. UnknownBookieError for an unknown id."""
    async with metadata_of(metadata) as meta:
        named = await ledgers_naming(meta, bookie_id)
        registered = await check_known_bookie(meta, bookie_id, bool(named))
        view = None
        if replacements:
            view = ClusterView(meta)
            await view.start()
        try:
            ledgers = [_plan_ledger(md, bookie_id, skip_open_ledgers, view) for md in named]
        finally:
            if view is not None:
                await view.close()
        return RecoveryPlan(bookie_id, registered, tuple(ledgers))


class BookieAccess(NamedTuple):
    """How a drain reaches the bookies: the admin token (ledgers' master keys), the TLS
    context (client port and HTTPS admin APIs; None: plain) and the HELLO token."""

    admin_token: str
    tls: ssl.SSLContext | None
    auth_token: str | None


async def recover_bookie(
    metadata: str | Metadata,
    bookie_id: str,
    progress: ProgressCallback | None = None,
    *,
    admin_token: str = "",
    tls: ssl.SSLContext | None = None,
    auth_token: str | None = None,
    force: bool = False,
    skip_open_ledgers: bool = False,
    on_failure: FailureCallback | None = None,
    concurrency: int = 4,
    timeout_seconds: float = 600.0,
) -> RecoveryReport:
    """Re-replicate now every fragment `bookie_id` holds (it is dead, or about to be wiped).

    Open ledgers whose last segment names it are fenced and closed first (unless
    `skip_open_ledgers`). Refuses a registered bookie unless `force` (BookieAliveError) and an
    unknown one (UnknownBookieError), before changing anything. Returns when no ledger names
    the bookie, when every ledger left failed (`report.failed`; they stay marked for the
    workers), or at `timeout_seconds`.
    """
    async with metadata_of(metadata) as meta:
        named = await ledgers_naming(meta, bookie_id)
        registered = await check_known_bookie(meta, bookie_id, bool(named))
        if registered and not force:
            raise BookieAliveError(
                f"bookie {bookie_id} is registered and alive: recovering it fences the open "
                "ledgers it is in; pass --force to do it anyway, or decommission it "
                "(nothing was fenced or closed)"
            )
        drain = _Drain(
            meta,
            bookie_id,
            BookieAccess(admin_token, tls, auth_token),
            progress,
            on_failure,
            concurrency=concurrency,
            open_grace_seconds=0.0,
            skip_open=skip_open_ledgers,
            forced=registered,
        )
        return await drain.run(timeout_seconds)


async def decommission_bookie(
    metadata: str | Metadata,
    bookie_id: str,
    progress: ProgressCallback | None = None,
    *,
    admin_token: str = "",
    tls: ssl.SSLContext | None = None,
    auth_token: str | None = None,
    open_ledger_grace_seconds: float = 30.0,
    on_failure: FailureCallback | None = None,
    concurrency: int = 4,
    timeout_seconds: float = 900.0,
) -> RecoveryReport:
    """Drain a bookie: record it as decommissioned (a running one turns read-only, so writers
    move their open ledgers off it by ensemble change; a restarted one stays read-only until
    `recommission_bookie`), then re-replicate every fragment it holds. An open ledger still on
    it after `open_ledger_grace_seconds` is fenced and closed. When this returns complete, no
    ledger names the bookie and it can be stopped."""
    async with metadata_of(metadata) as meta:
        named = await ledgers_naming(meta, bookie_id)
        registered = await check_known_bookie(meta, bookie_id, bool(named))
        await meta.decommissioned.add(bookie_id)
        log.info("bookie_decommissioned", bookie_id=bookie_id, registered=registered)
        if registered:
            await _wait_read_only(meta, bookie_id)
        drain = _Drain(
            meta,
            bookie_id,
            BookieAccess(admin_token, tls, auth_token),
            progress,
            on_failure,
            concurrency=concurrency,
            open_grace_seconds=open_ledger_grace_seconds,
            skip_open=False,
            forced=False,  # The decommission record keeps it missing for every worker.
        )
        return await drain.run(timeout_seconds)


async def _wait_read_only(meta: Metadata, bookie_id: str) -> None:
    """Writers pick bookies from the registry: wait until it shows the bookie read-only."""
    deadline = time.monotonic() + _READ_ONLY_WAIT_SECONDS
    while True:
        infos = {info.bookie_id: info for info in await meta.bookies.list()}
        current = infos.get(bookie_id)
        if current is None or current.read_only:
            return
        if time.monotonic() > deadline:
            raise BKTimeoutError(
                f"bookie {bookie_id} is decommissioned but did not register read-only within "
                f"{_READ_ONLY_WAIT_SECONDS:.0f} s (is it running an older bkaio?)"
            )
        await asyncio.sleep(0.1)


class _Drain:
    """Rounds of: list the ledgers naming the bookie, mark, claim and re-replicate each."""

    def __init__(
        self,
        meta: Metadata,
        bookie_id: str,
        access: BookieAccess,
        progress: ProgressCallback | None,
        on_failure: FailureCallback | None,
        *,
        concurrency: int,
        open_grace_seconds: float,
        skip_open: bool,
        forced: bool,
    ) -> None:
        assert concurrency >= 1, concurrency
        self._meta = meta
        self._bookie_id = bookie_id
        self._access = access
        self._progress = progress
        self._on_failure = on_failure
        self._concurrency = concurrency
        self._open_grace = open_grace_seconds
        self._skip_open = skip_open
        self._forced = forced
        self._started = time.monotonic()
        self._owner = f"admin-drain-{bookie_id}"
        self._done = self._total = self._entries_total = 0
        self._replicated = self._recovered = self._fragments = self._entries = self._bytes = 0
        self._tries: dict[int, int] = {}
        self._last_error: dict[int, str] = {}  # Of ledgers still being retried.
        self._failed: dict[int, str] = {}  # Given up on in this run.
        self._unreadable: dict[int, int] = {}
        self._skipped: set[int] = set()
        self._registered: set[str] = set()
        self._decommissioned: set[str] = set()

    async def run(self, timeout_seconds: float) -> RecoveryReport:
        access = self._access
        client_config = ClientConfig(
            client_id="bkaio-autorecovery",
            add_timeout=15.0,
            read_timeout=15.0,
            auth_token=access.auth_token or None,
        )
        view = ClusterView(self._meta, client_config=client_config, tls=access.tls)
        await view.start()
        keys = MasterKeys(view, access.admin_token, tls=access.tls)
        replicator = Replicator(view, keys, AutorecoveryMetrics())
        lease = await self._meta.store.grant_lease(_ADMIN_LEASE_TTL_SECONDS)
        lease.start_keep_alive()
        deadline = self._started + timeout_seconds
        idle = Backoff(*_ROUND_BACKOFF)
        try:
            while True:
                pending = await self._pending()
                if not pending:
                    break
                if time.monotonic() > deadline:
                    for ledger_id in pending:
                        why = self._last_error.get(ledger_id, "no attempt succeeded")
                        self._give_up(ledger_id, f"not moved within {timeout_seconds} s: {why}")
                    break
                if lease.lost:
                    # Its locks went with it and no claim can be made on it: without a new
                    # one every ledger failed its claim until the timeout. (`lost`, not
                    # `in_doubt`: the claims' locks are bound to the lease, which the store
                    # refuses once gone; the swaps and mark removals under them wait for the
                    # lease's confirmation themselves, in `_one`.)
                    log.warning("drain_lease_lost", bookie_id=self._bookie_id)
                    with contextlib.suppress(BKError):
                        await lease.revoke()
                    lease = await self._meta.store.grant_lease(_ADMIN_LEASE_TTL_SECONDS)
                    lease.start_keep_alive()
                # The registry itself: a lagging watch must not make a live bookie look gone.
                self._registered = await self._meta.bookies.ids()
                self._decommissioned = await self._meta.decommissioned.ids()
                before = (self._done, len(self._failed))
                await self._round(pending, replicator, lease)
                if (self._done, len(self._failed)) == before:
                    await asyncio.sleep(
                        min(idle.next_delay(), max(0.0, deadline - time.monotonic()))
                    )
                else:
                    idle.reset()
        finally:
            with contextlib.suppress(BKError):
                await lease.revoke()
            await keys.close()
            await view.close()
        report = RecoveryReport(
            self._bookie_id,
            self._replicated,
            self._recovered,
            self._fragments,
            self._entries,
            self._bytes,
            time.monotonic() - self._started,
            dict(self._failed),
            tuple(sorted(self._skipped)),
            dict(self._unreadable),
        )
        log.info("bookie_drained", **report.to_dict())
        return report

    async def _pending(self) -> list[int]:
        """Ledgers still naming the bookie, minus those given up on or skipped; also updates
        the totals progress reports."""
        pending = []
        remaining_entries = 0
        for md in await ledgers_naming(self._meta, self._bookie_id):
            ledger_id = md.ledger_id
            if ledger_id in self._failed or ledger_id in self._skipped:
                continue
            planned = _plan_ledger(md, self._bookie_id, self._skip_open, None)
            if planned.skipped:
                self._skipped.add(ledger_id)
                log.info("drain_open_ledger_skipped", ledger_id=ledger_id)
                continue
            remaining_entries += planned.entries
            pending.append(ledger_id)
        self._total = self._done + len(pending)
        self._entries_total = self._entries + remaining_entries
        return pending

    async def _round(self, pending: list[int], replicator: Replicator, lease: Lease) -> None:
        for ledger_id in pending:  # Mark first: if this process dies, the workers finish.
            await self._meta.underreplication.mark(
                ledger_id, [self._bookie_id], forced=self._forced
            )
        queue = iter(pending)

        async def drain_some() -> None:
            for ledger_id in queue:
                await self._one(ledger_id, replicator, lease)

        await first_failure([drain_some() for _ in range(min(self._concurrency, len(pending)))])

    def _missing(self, claimed: UnderreplicatedLedger) -> Collection[str]:
        """Our bookie, and the mark's other bookies a worker would move off too."""
        return {self._bookie_id} | {
            bookie_id
            for bookie_id in claimed.missing_bookies
            if bookie_id not in self._registered
            or bookie_id in self._decommissioned
            or bookie_id in claimed.forced_bookies
        }

    async def _one(self, ledger_id: int, replicator: Replicator, lease: Lease) -> None:
        underreplication = self._meta.underreplication
        try:
            claimed = await underreplication.claim(ledger_id, lease, owner=self._owner)
        except BKError as error:
            log.warning("drain_claim_failed", ledger_id=ledger_id, error=str(error))
            return
        if claimed is None:
            return  # A replication worker holds it (or it is done): see the next round.
        completed = False
        try:
            recover_now = time.monotonic() - self._started >= self._open_grace
            missing = self._missing(claimed)
            incomplete = [
                b for b in claimed.incomplete_bookies if b in self._registered and b not in missing
            ]
            unreachable = [
                b
                for b in claimed.incomplete_bookies
                if b not in self._registered and b not in missing
            ]
            if incomplete:  # Completing the mark must not forget what the ledger check found.
                await replicator.fill_ledger_in_place(ledger_id, incomplete)
            result = await replicator.replicate_ledger(
                ledger_id, missing, recover_open_tail=recover_now, lock_lease=lease
            )
            self._fragments += result.fragments
            self._entries += result.entries
            self._bytes += result.bytes
            self._recovered += int(result.recovered)
            if result.outcome is not Outcome.DEFERRED:
                if unreachable and result.outcome is Outcome.DONE:
                    # Off our bookie, but copies on a bookie not registered now are still
                    # missing: the mark stays for the workers.
                    log.warning(
                        "drain_mark_kept_bookie_unregistered",
                        ledger_id=ledger_id,
                        incomplete_bookies=unreachable,
                    )
                else:
                    await check_lock_lease(lease, ledger_id, "dropping its mark")
                    completed = await underreplication.complete(claimed)
                self._replicated += int(result.outcome is Outcome.DONE)
                self._done += 1
        except EntryUnreadableError as error:
            self._unreadable[ledger_id] = error.entry_id
            self._give_up(ledger_id, str(error), error.entry_id)
        except BKError as error:  # Retried next round; reported if still failing at the end.
            tries = self._tries[ledger_id] = self._tries.get(ledger_id, 0) + 1
            self._last_error[ledger_id] = f"{type(error).__name__}: {error}"
            log.warning("drain_ledger_failed", ledger_id=ledger_id, tries=tries, error=str(error))
        finally:
            if not completed:
                with contextlib.suppress(BKError):
                    await underreplication.release(ledger_id, claimed.lock_version)
        if self._progress is not None:
            self._progress(
                RecoveryProgress(
                    self._bookie_id,
                    self._total,
                    self._done,
                    self._entries,
                    self._bytes,
                    time.monotonic() - self._started,
                    self._entries_total,
                    len(self._failed),
                )
            )

    def _give_up(self, ledger_id: int, error: str, entry_id: int | None = None) -> None:
        self._failed[ledger_id] = error
        log.warning("drain_ledger_given_up", ledger_id=ledger_id, error=error)
        if self._on_failure is not None:
            self._on_failure(LedgerFailure(ledger_id, error, entry_id))
