"""Metadata for autorecovery: the under-replicated ledger queue and auditor election.

Layout (reference/bookkeeper.md section 4.3, mapped to flat keys):
    /underreplicated/<20-digit ledger id>   msgpack {missing_bookies, ctime_ms}
    /underreplication/locks/<ledger id>     leased lock of the worker re-replicating it
    /underreplication/disable               present: autorecovery is disabled
    /auditor                                leased; value = the auditor's bookie id
Driver-independent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import msgpack
import structlog

from bkaio.errors import MetadataVersionError
from bkaio.meta.errors import InvalidMetadataError
from bkaio.meta.ledger_metadata import now_ms
from bkaio.meta.store import EventKind, KeyValue, Lease, MetadataStore

log = structlog.get_logger(__name__)

UNDERREPLICATED_PREFIX = "/underreplicated/"
LOCKS_PREFIX = "/underreplication/locks/"
DISABLE_KEY = "/underreplication/disable"
AUDITOR_KEY = "/auditor"


@dataclass(frozen=True, slots=True)
class UnderreplicatedLedger:
    ledger_id: int
    missing_bookies: tuple[str, ...]
    ctime_ms: int
    version: int


def _ur_key(ledger_id: int) -> str:
    assert ledger_id >= 0, ledger_id
    return f"{UNDERREPLICATED_PREFIX}{ledger_id:020d}"


def _lock_key(ledger_id: int) -> str:
    return f"{LOCKS_PREFIX}{ledger_id:020d}"


def _decode(kv: KeyValue) -> UnderreplicatedLedger:
    ledger_id = int(kv.key[len(UNDERREPLICATED_PREFIX) :])
    try:
        record = msgpack.unpackb(kv.value, raw=False)
        return UnderreplicatedLedger(
            ledger_id, tuple(record["missing_bookies"]), int(record["ctime_ms"]), kv.version
        )
    except (ValueError, KeyError, TypeError, msgpack.ExtraData) as error:
        raise InvalidMetadataError(f"under-replication record {kv.key}: {error!r}") from None


class UnderReplicationManager:
    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    async def mark(self, ledger_id: int, missing_bookies: Iterable[str]) -> UnderreplicatedLedger:
        """Record that `ledger_id` lost copies on `missing_bookies` (merged with earlier marks)."""
        missing = set(missing_bookies)
        key = _ur_key(ledger_id)
        while True:
            kv = await self._store.get(key)
            old = None if kv is None else _decode(kv)
            bookies = tuple(sorted(missing | set(old.missing_bookies if old else ())))
            if old is not None and bookies == old.missing_bookies:
                return old
            ctime_ms = old.ctime_ms if old else now_ms()
            value = msgpack.packb({"missing_bookies": list(bookies), "ctime_ms": ctime_ms})
            try:
                version = await self._store.compare_and_swap(
                    key, value, expected_version=0 if kv is None else kv.version
                )
            except MetadataVersionError:
                continue  # Marked concurrently by another auditor run: merge again.
            return UnderreplicatedLedger(ledger_id, bookies, ctime_ms, version)

    async def get(self, ledger_id: int) -> UnderreplicatedLedger | None:
        kv = await self._store.get(_ur_key(ledger_id))
        return None if kv is None else _decode(kv)

    async def list(self) -> AsyncIterator[UnderreplicatedLedger]:
        async for kv in self._store.iterate_prefix(UNDERREPLICATED_PREFIX):
            yield _decode(kv)

    async def claim(
        self, ledger_id: int, lease: Lease, *, owner: str = ""
    ) -> UnderreplicatedLedger | None:
        """Take the lock on one under-replicated ledger; None if it is locked or not listed.
        The lock goes away with `lease` if the worker dies."""
        record = await self.get(ledger_id)
        if record is None:
            return None
        try:
            await self._store.compare_and_swap(
                _lock_key(ledger_id), owner.encode(), expected_version=0, lease=lease
            )
        except MetadataVersionError:
            return None
        return record

    async def claim_next(self, lease: Lease, *, owner: str = "") -> UnderreplicatedLedger | None:
        """Lock the first under-replicated ledger nobody holds; None if there is none."""
        async for record in self.list():
            if await self._store.get(_lock_key(record.ledger_id)) is not None:
                continue
            claimed = await self.claim(record.ledger_id, lease, owner=owner)
            if claimed is not None:
                return claimed
        return None

    async def release(self, ledger_id: int) -> None:
        """Give the lock back without completing (another worker may take it)."""
        await self._store.delete(_lock_key(ledger_id))

    async def complete(self, claimed: UnderreplicatedLedger) -> bool:
        """The ledger is fully replicated again: drop it from the queue and release the lock.
        False (and the record stays) if it was marked again since it was claimed."""
        try:
            await self._store.delete(_ur_key(claimed.ledger_id), expected_version=claimed.version)
            done = True
        except MetadataVersionError:
            done = False
        await self.release(claimed.ledger_id)
        return done

    async def is_enabled(self) -> bool:
        return await self._store.get(DISABLE_KEY) is None

    async def set_enabled(self, enabled: bool) -> None:
        if enabled:
            await self._store.delete(DISABLE_KEY)
        else:
            await self._store.put(DISABLE_KEY, b"")


class AuditorLeadership:
    """Held while `lease` lives; `resign()` hands the role over."""

    def __init__(self, store: MetadataStore, bookie_id: str, lease: Lease) -> None:
        self._store = store
        self.bookie_id = bookie_id
        self.lease = lease

    async def wait_lost(self) -> None:
        await self.lease.wait_lost()

    async def resign(self) -> None:
        await self.lease.revoke()  # Deletes AUDITOR_KEY, which is bound to it.


class AuditorElection:
    """Leader election on the leased create-if-absent key /auditor."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    async def who_is_auditor(self) -> str | None:
        kv = await self._store.get(AUDITOR_KEY)
        return None if kv is None else kv.value.decode()

    async def try_become_auditor(self, bookie_id: str, lease: Lease) -> bool:
        try:
            await self._store.compare_and_swap(
                AUDITOR_KEY, bookie_id.encode(), expected_version=0, lease=lease
            )
        except MetadataVersionError:
            return False
        return True

    async def run_for_auditor(self, bookie_id: str, ttl_seconds: float = 10.0) -> AuditorLeadership:
        """Wait until this candidate is the auditor; the lease is kept alive in the background."""
        lease = await self._store.grant_lease(ttl_seconds)
        lease.start_keep_alive()
        try:
            while True:
                if await self.try_become_auditor(bookie_id, lease):
                    log.info("auditor_elected", bookie_id=bookie_id)
                    return AuditorLeadership(self._store, bookie_id, lease)
                await self._wait_for_vacancy()
        except BaseException:
            with contextlib.suppress(Exception):
                await lease.revoke()
            raise

    async def _wait_for_vacancy(self) -> None:
        kv = await self._store.get(AUDITOR_KEY)
        if kv is None:
            return
        events = self._store.watch_prefix(AUDITOR_KEY, start_revision=kv.version + 1)
        async with contextlib.aclosing(events):
            async for event in events:
                if event.key == AUDITOR_KEY and event.kind is EventKind.DELETE:
                    return
        await asyncio.sleep(0)  # pragma: no cover - a watch only ends by raising
