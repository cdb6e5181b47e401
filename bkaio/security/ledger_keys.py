"""The bookie's check of the first master key it sees for a ledger (faults.md B4, "first sight").

BookKeeper's bookie records whatever key the first request for a ledger carries. Ledger ids are
sequential, so anyone who guesses the next id could squat it (the real writer then gets
UNAUTHORIZED) or fence it. Here the first key is checked against the ledger's metadata instead:
metadata keeps `password_hash = sha256(b"bkaio-password-check\\0" + master_key)`
(`bkaio.protocol.digest.password_check`), and the key is accepted only when it hashes to that.
Once storage has recorded the key, storage itself checks every later request, so the metadata is
read once per ledger (cached, one lookup in flight per ledger, a bounded number at a time).

A ledger without metadata is refused: its writer always writes the metadata before the first
add, so a request for an id without metadata is a guess (or the ledger was deleted).
"""

from __future__ import annotations

import asyncio
import hmac
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from bkaio.errors import NoSuchLedgerError, UnauthorizedError
from bkaio.protocol.digest import password_check

log = structlog.get_logger(__name__)


class LedgerKeyRefusedError(UnauthorizedError):
    """A first-sight key that metadata does not confirm; `reason` is wrong_key or no_metadata."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class KeySource(Protocol):
    """Where the password hash of a ledger comes from (the metadata store)."""

    async def password_hash(self, ledger_id: int) -> bytes | None:
        """The ledger's password hash (b"" when it has none), None when it has no metadata."""
        ...

    async def close(self) -> None: ...


class MetadataKeySource:
    """`KeySource` over an open `bkaio.meta.Metadata` (read-only use)."""

    def __init__(self, metadata: Any) -> None:
        self._metadata = metadata

    async def password_hash(self, ledger_id: int) -> bytes | None:
        try:
            metadata = await self._metadata.ledgers.get(ledger_id)
        except NoSuchLedgerError:
            return None
        password_hash: bytes = metadata.password_hash
        return password_hash

    async def close(self) -> None:
        await self._metadata.close()


@dataclass(slots=True)
class KeyCheckStats:
    cache_hits: int = 0
    lookups: int = 0
    accepted: int = 0
    refused_wrong_key: int = 0
    refused_no_metadata: int = 0


class LedgerKeyVerifier:
    """Checks a presented master key against the ledger's metadata; opens the source lazily."""

    def __init__(
        self,
        open_source: Callable[[], Awaitable[KeySource]],
        *,
        cache_entries: int = 65_536,
        max_concurrent_lookups: int = 16,
    ) -> None:
        assert cache_entries > 0 and max_concurrent_lookups > 0, (
            cache_entries,
            max_concurrent_lookups,
        )
        self._open_source = open_source
        self._source: KeySource | None = None
        self._opening: asyncio.Lock | None = None
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cache_entries = cache_entries
        self._lookups: dict[int, asyncio.Future[bytes | None]] = {}
        self._max_concurrent = max_concurrent_lookups
        self._semaphore: asyncio.Semaphore | None = None
        self.stats = KeyCheckStats()

    async def verify(self, ledger_id: int, master_key: bytes) -> None:
        """Return when `master_key` is the ledger's key; UnauthorizedError otherwise."""
        expected = self._cache.get(ledger_id)
        if expected is not None:
            self.stats.cache_hits += 1
            self._cache.move_to_end(ledger_id)
        else:
            found = await self._lookup(ledger_id)
            if found is None:
                self.stats.refused_no_metadata += 1
                raise LedgerKeyRefusedError(
                    f"ledger {ledger_id} has no metadata: its key cannot be checked, refused",
                    "no_metadata",
                )
            expected = found
        if expected and not hmac.compare_digest(password_check(master_key), expected):
            self.stats.refused_wrong_key += 1
            raise LedgerKeyRefusedError(
                f"ledger {ledger_id}: the master key does not match the ledger's metadata",
                "wrong_key",
            )
        self.stats.accepted += 1

    async def _lookup(self, ledger_id: int) -> bytes | None:
        pending = self._lookups.get(ledger_id)
        if pending is not None:  # Pipelined first adds of one ledger share one read.
            return await asyncio.shield(pending)
        future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self._lookups[ledger_id] = future
        try:
            result = await self._read(ledger_id)
        except BaseException as error:
            if isinstance(error, Exception):
                future.set_exception(error)
                future.exception()  # Marks it retrieved when nobody else waits.
            else:
                future.cancel()
            raise
        else:
            future.set_result(result)
            if result is not None:
                self._remember(ledger_id, result)
            return result
        finally:
            del self._lookups[ledger_id]

    async def _read(self, ledger_id: int) -> bytes | None:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._max_concurrent)
        async with self._semaphore:
            source = await self._get_source()
            self.stats.lookups += 1
            return await source.password_hash(ledger_id)

    async def _get_source(self) -> KeySource:
        if self._source is None:
            if self._opening is None:
                self._opening = asyncio.Lock()
            async with self._opening:
                if self._source is None:
                    self._source = await self._open_source()
                    log.info("ledger_key_metadata_opened")
        return self._source

    def _remember(self, ledger_id: int, password_hash: bytes) -> None:
        self._cache[ledger_id] = password_hash
        self._cache.move_to_end(ledger_id)
        while len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)

    def forget(self, ledger_id: int) -> None:
        """Drop a cached hash (the ledger was deleted locally)."""
        self._cache.pop(ledger_id, None)

    async def close(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            await source.close()
