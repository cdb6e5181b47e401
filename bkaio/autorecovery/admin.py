"""Operator actions on autorecovery: what `bkaio shell recover|decommission|whoisauditor|
listunderreplicated` and the bookie's /api/v1/autorecovery/... endpoints call.

    report = await recover_bookie(uri, "10.0.0.7:3181", admin_token=token, progress=print)
    report = await decommission_bookie(uri, "10.0.0.7:3181", admin_token=token)
    await who_is_auditor(uri) -> str | None
    await list_under_replicated(uri) -> list[UnderreplicatedLedger]
    await set_autorecovery_enabled(uri, False); await is_autorecovery_enabled(uri)

Every function takes a metadata URI or an open `bkaio.meta.Metadata`. recover and decommission
do the work in the calling process (they do not wait for the replication workers), under the
same under-replication marks and locks the workers use, so the two never copy one ledger at
the same time and a worker finishes whatever an interrupted command left marked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import structlog

from bkaio.errors import BKError, BKTimeoutError
from bkaio.meta import Lease, Metadata, UnderreplicatedLedger, open_metadata

from .auditor import ledgers_by_bookie
from .cluster import ClusterView, MasterKeys
from .metrics import AutorecoveryMetrics
from .replicator import Outcome, Replicator

log = structlog.get_logger(__name__)

_ROUND_BACKOFF_SECONDS = 0.5
_ADMIN_LEASE_TTL_SECONDS = 10.0
_READ_ONLY_WAIT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class RecoveryProgress:
    """Passed to the `progress` callback after each ledger."""

    bookie_id: str
    ledgers_total: int  # Ledgers naming the bookie when the current round started.
    ledgers_done: int
    entries: int
    bytes: int
    seconds: float


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

    @property
    def complete(self) -> bool:
        return not self.failed

    @property
    def entries_per_second(self) -> float:
        return self.entries / self.seconds if self.seconds > 0 else 0.0

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        plain = asdict(self)
        plain["failed"] = {str(k): v for k, v in self.failed.items()}
        plain["entries_per_second"] = round(self.entries_per_second, 1)
        plain["megabytes_per_second"] = round(self.megabytes_per_second, 3)
        return plain


ProgressCallback = Callable[[RecoveryProgress], None]


@contextlib.asynccontextmanager
async def _metadata_of(target: str | Metadata) -> AsyncIterator[Metadata]:
    if isinstance(target, Metadata):
        yield target
        return
    metadata = await open_metadata(target)
    try:
        yield metadata
    finally:
        await metadata.close()


async def who_is_auditor(metadata: str | Metadata) -> str | None:
    """The owner id of the elected auditor, None when there is none."""
    async with _metadata_of(metadata) as meta:
        return await meta.auditor.who_is_auditor()


async def list_under_replicated(metadata: str | Metadata) -> list[UnderreplicatedLedger]:
    """Every ledger marked under-replicated, with the bookies it misses, by ledger id."""
    async with _metadata_of(metadata) as meta:
        return [record async for record in meta.underreplication.list()]


async def set_autorecovery_enabled(metadata: str | Metadata, enabled: bool) -> None:
    """The cluster-wide switch: auditor and workers idle while it is off."""
    async with _metadata_of(metadata) as meta:
        await meta.underreplication.set_enabled(enabled)
        log.info("autorecovery_switched", enabled=enabled)


async def is_autorecovery_enabled(metadata: str | Metadata) -> bool:
    async with _metadata_of(metadata) as meta:
        return await meta.underreplication.is_enabled()


async def recover_bookie(
    metadata: str | Metadata,
    bookie_id: str,
    progress: ProgressCallback | None = None,
    *,
    admin_token: str = "",
    concurrency: int = 4,
    timeout_seconds: float = 600.0,
) -> RecoveryReport:
    """Re-replicate now every fragment `bookie_id` holds (it is dead, or about to be wiped).

    Open ledgers whose last segment names it are fenced and closed first. Returns when no
    ledger names the bookie, or at `timeout_seconds` with the ledgers still failing in
    `report.failed` (they stay marked for the replication workers).
    """
    async with _metadata_of(metadata) as meta:
        drain = _Drain(meta, bookie_id, admin_token, progress, concurrency, open_grace_seconds=0.0)
        return await drain.run(timeout_seconds)


async def decommission_bookie(
    metadata: str | Metadata,
    bookie_id: str,
    progress: ProgressCallback | None = None,
    *,
    admin_token: str = "",
    open_ledger_grace_seconds: float = 30.0,
    concurrency: int = 4,
    timeout_seconds: float = 900.0,
) -> RecoveryReport:
    """Drain a live bookie: turn it read-only (its admin HTTP, `admin_token`), so writers move
    their open ledgers off it by ensemble change, then re-replicate every fragment it holds.
    An open ledger still on it after `open_ledger_grace_seconds` is fenced and closed. When
    this returns complete, no ledger names the bookie and it can be stopped."""
    async with _metadata_of(metadata) as meta:
        registered = {info.bookie_id: info for info in await meta.bookies.list()}
        info = registered.get(bookie_id)
        if info is None:
            log.info("decommission_bookie_not_running", bookie_id=bookie_id)
        elif not info.read_only:
            await _force_read_only(meta, info.admin_url, bookie_id, admin_token)
        drain = _Drain(
            meta,
            bookie_id,
            admin_token,
            progress,
            concurrency,
            open_grace_seconds=open_ledger_grace_seconds,
        )
        return await drain.run(timeout_seconds)


async def _force_read_only(
    meta: Metadata, admin_url: str, bookie_id: str, admin_token: str
) -> None:
    if not admin_url:
        raise BKError(f"bookie {bookie_id} registered no admin URL: cannot make it read-only")
    url = f"{admin_url}/api/v1/bookie/state"
    headers = {"Authorization": f"Bearer {admin_token}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as session,
            session.put(url, json={"read_only": True}, headers=headers) as response,
        ):
            if response.status != 200:
                raise BKError(
                    f"bookie {bookie_id}: PUT {url} answered {response.status}:"
                    f" {(await response.text()).strip()} (is the admin token right?)"
                )
    except (aiohttp.ClientError, TimeoutError) as error:
        raise BKError(f"bookie {bookie_id}: cannot reach its admin HTTP {url}: {error!r}") from None
    deadline = time.monotonic() + _READ_ONLY_WAIT_SECONDS
    while True:  # Writers pick bookies from the registry: wait until it shows read-only.
        infos = {info.bookie_id: info for info in await meta.bookies.list()}
        current = infos.get(bookie_id)
        if current is None or current.read_only:
            break
        if time.monotonic() > deadline:
            raise BKTimeoutError(f"bookie {bookie_id} did not register as read-only")
        await asyncio.sleep(0.1)
    log.info("decommission_read_only", bookie_id=bookie_id)


class _Drain:
    """Rounds of: list the ledgers naming the bookie, mark, claim and re-replicate each."""

    def __init__(
        self,
        meta: Metadata,
        bookie_id: str,
        admin_token: str,
        progress: ProgressCallback | None,
        concurrency: int,
        *,
        open_grace_seconds: float,
    ) -> None:
        assert concurrency >= 1, concurrency
        self._meta = meta
        self._bookie_id = bookie_id
        self._token = admin_token
        self._progress = progress
        self._concurrency = concurrency
        self._open_grace = open_grace_seconds
        self._started = time.monotonic()
        self._owner = f"admin-drain-{bookie_id}"
        self._done = 0
        self._total = 0
        self._replicated = self._recovered = self._fragments = self._entries = self._bytes = 0
        self._failed: dict[int, str] = {}

    async def run(self, timeout_seconds: float) -> RecoveryReport:
        view = ClusterView(self._meta)
        await view.start()
        keys = MasterKeys(view, self._token)
        replicator = Replicator(view, keys, AutorecoveryMetrics())
        lease = await self._meta.store.grant_lease(_ADMIN_LEASE_TTL_SECONDS)
        lease.start_keep_alive()
        deadline = self._started + timeout_seconds
        try:
            while True:
                index, _ = await ledgers_by_bookie(self._meta)
                pending = sorted(index.get(self._bookie_id, ()))
                if not pending:
                    self._failed.clear()
                    break
                if time.monotonic() > deadline:
                    for ledger_id in pending:
                        self._failed.setdefault(ledger_id, "still names the bookie at timeout")
                    break
                self._total = self._done + len(pending)
                before = self._done
                await self._round(pending, replicator, lease)
                if self._done == before:
                    await asyncio.sleep(_ROUND_BACKOFF_SECONDS)
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
        )
        log.info("bookie_drained", **report.to_dict())
        return report

    async def _round(self, pending: list[int], replicator: Replicator, lease: Lease) -> None:
        for ledger_id in pending:  # Mark first: if this process dies, the workers finish.
            await self._meta.underreplication.mark(ledger_id, [self._bookie_id])
        queue = iter(pending)

        async def drain_some() -> None:
            for ledger_id in queue:
                await self._one(ledger_id, replicator, lease)

        async with asyncio.TaskGroup() as group:
            for _ in range(min(self._concurrency, len(pending))):
                group.create_task(drain_some())

    async def _one(self, ledger_id: int, replicator: Replicator, lease: Lease) -> None:
        underreplication = self._meta.underreplication
        claimed = await underreplication.claim(ledger_id, lease, owner=self._owner)
        if claimed is None:
            return  # A replication worker holds it (or it is done): see the next round.
        completed = False
        try:
            recover_now = time.monotonic() - self._started >= self._open_grace
            result = await replicator.replicate_ledger(
                ledger_id, claimed.missing_bookies, recover_open_tail=recover_now
            )
            self._fragments += result.fragments
            self._entries += result.entries
            self._bytes += result.bytes
            self._recovered += int(result.recovered)
            if result.outcome is not Outcome.DEFERRED:
                completed = await underreplication.complete(claimed)
                self._replicated += int(result.outcome is Outcome.DONE)
                self._done += 1
                self._failed.pop(ledger_id, None)
        except BKError as error:
            self._failed[ledger_id] = f"{type(error).__name__}: {error}"
            log.warning("drain_ledger_failed", ledger_id=ledger_id, error=str(error))
        finally:
            if not completed:
                with contextlib.suppress(BKError):
                    await underreplication.release(ledger_id)
        if self._progress is not None:
            self._progress(
                RecoveryProgress(
                    self._bookie_id,
                    self._total,
                    self._done,
                    self._entries,
                    self._bytes,
                    time.monotonic() - self._started,
                )
            )
