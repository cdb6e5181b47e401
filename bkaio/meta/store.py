"""The metadata driver interface: versioned keys, compare-and-swap, leases and watches.

Owns the shape every driver implements (etcd in `etcd_driver`, SQLite in `sqlite_driver`) and
the small value types they return. Knows nothing about ledgers or bookies; must not import
`aetcd`, `sqlite3`, `protocol` or `journal`.

Semantics (the contract suite in tests/integration/meta checks both drivers against them):
- Keys are `str` relative to the store's root and start with "/" (for example
  "/ledgers/00000000000000000001"); the driver puts its root prefix in front.
- A key's `version` is the store revision of its last write (etcd's mod_revision). Revisions
  are one store-wide counter that only grows; every change gets a revision larger than every
  change before it.
- `compare_and_swap(expected_version=0)` creates the key only if absent.
- A key written with a lease is deleted when the lease expires or is revoked.
- `watch_prefix` yields every change after `start_revision - 1`, in revision order, and keeps
  doing so across reconnects, resuming from the last revision it delivered.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from functools import partial
from types import TracebackType

import structlog

from bkaio.errors import MetadataError
from bkaio.meta.errors import LeaseExpiredError
from bkaio.supervision import Restart, loop_supervisor

log = structlog.get_logger(__name__)

# Compare-and-swaps one metadata step may try, in every layer (a ledger writer's ensemble
# change or close, a recovery's marking or seal, autorecovery's swap and marks, a stream
# record's writes): each lost one means another client changed the record (retried at once:
# that client made progress) or the store lost the answer (MetadataOutcomeUnknownError). A
# store that keeps losing them fails the step with MetadataError (retriable, the record left
# as it is) rather than being retried back to back for ever. Here, below every layer that
# writes records, so that each of them imports it without a cycle.
MAX_METADATA_ATTEMPTS = 8


def metadata_attempts_exhausted(
    what: str, step: str, outcome: str = "the record is left as it is; try again later"
) -> MetadataError:
    """The error of `step` on `what` after MAX_METADATA_ATTEMPTS compare-and-swaps lost: one
    wording for every layer, saying that nothing of the step was written; `outcome` says what
    that leaves, where the caller knows more than "the record as it is"."""
    return MetadataError(
        f"{what}: gave up {step} after {MAX_METADATA_ATTEMPTS} compare-and-swap attempts "
        f"({outcome})"
    )


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    version: int  # Revision of the last write (etcd mod_revision); what CAS compares.
    create_revision: int
    lease: int  # 0 when the key is bound to no lease.


class EventKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: EventKind
    key: str
    value: bytes  # Empty for DELETE.
    revision: int  # The store revision of this change.

    @property
    def version(self) -> int:
        """The key's version after this change: its revision for a PUT, 0 once deleted."""
        return self.revision if self.kind is EventKind.PUT else 0


@dataclass(frozen=True, slots=True)
class PrefixSnapshot:
    """Every key under a prefix as of `revision`: watch from `revision + 1` to follow it."""

    kvs: list[KeyValue]
    revision: int


class Lease(abc.ABC):
    """A TTL the owner keeps alive; keys bound to it vanish when it lapses."""

    def __init__(self, lease_id: int, ttl_seconds: float) -> None:
        assert lease_id > 0, lease_id
        assert ttl_seconds > 0, ttl_seconds
        self.id = lease_id
        self.ttl_seconds = ttl_seconds
        self._keep_alive_task: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        # Loop time until which the store certainly holds the lease: a TTL after the last
        # confirmed refresh was sent (the store counts from receiving it, later). At first:
        # when the granted lease was built.
        self._expires_at = asyncio.get_running_loop().time() + ttl_seconds

    @abc.abstractmethod
    async def keep_alive(self) -> None:
        """Refresh the TTL once. LeaseExpiredError if the lease is already gone."""

    @abc.abstractmethod
    async def _revoke(self) -> None: ...

    async def revoke(self) -> None:
        """Stop keeping alive and delete the lease and every key bound to it."""
        await self.stop_keep_alive()
        with contextlib.suppress(LeaseExpiredError):
            await self._revoke()
        self._lost.set()

    @property
    def lost(self) -> bool:
        """True once the background keep-alive found the lease expired, or confirmed no refresh
        for a TTL (the store may have dropped it: its holder must stop acting on it), or after
        revoke. See `in_doubt` for the time before the keep-alive notices."""
        return self._lost.is_set()

    @property
    def in_doubt(self) -> bool:
        """True when the store may no longer hold the lease: `lost`, or no refresh confirmed
        within a TTL by this process's clock (a stalled event loop, a silent store) while the
        keep-alive has not yet noticed. A holder about to act outside the store on what the
        lease guards (GC deleting ledgers under its locks) checks this, not `lost`: from the
        local deadline to the keep-alive's next turn the store may have dropped it."""
        return self._lost.is_set() or asyncio.get_running_loop().time() >= self._expires_at

    async def wait_lost(self) -> None:
        await self._lost.wait()

    def start_keep_alive(self, interval_seconds: float | None = None) -> None:
        """Refresh in the background every `interval_seconds` (default: a third of the TTL)."""
        if self._keep_alive_task is not None:
            return
        interval = interval_seconds if interval_seconds is not None else self.ttl_seconds / 3
        self._keep_alive_task = loop_supervisor().spawn(
            "lease_keep_alive",
            partial(self._keep_alive_forever, interval),
            # A bug in a refresh: the next one comes within the interval, as it would have.
            Restart(initial_delay_seconds=min(0.1, interval), max_delay_seconds=interval),
            instance=str(self.id),
        )

    async def stop_keep_alive(self) -> None:
        task, self._keep_alive_task = self._keep_alive_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _keep_alive_forever(self, interval_seconds: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval_seconds)
            sent = loop.time()
            try:
                # A refresh that lands after the lease lapsed on the store renews nothing.
                async with asyncio.timeout_at(self._expires_at):
                    await self.keep_alive()
            except LeaseExpiredError:
                log.warning("lease_lost", lease_id=self.id, ttl_seconds=self.ttl_seconds)
                self._lost.set()
                return
            except (MetadataError, TimeoutError) as error:
                if loop.time() >= self._expires_at:
                    # Unconfirmed for a whole TTL: the store may have dropped the lease and
                    # someone else taken what it held (an election, a lock). Lost, as far as
                    # this holder can tell; it must not go on acting as if it still held it.
                    log.warning(
                        "lease_lost", lease_id=self.id, ttl_seconds=self.ttl_seconds,
                        reason="no refresh confirmed within the TTL", error=str(error),
                    )  # fmt: skip
                    self._lost.set()
                    return
                # The store is unreachable; keep trying while the lease may still live there.
                log.warning("lease_keep_alive_failed", lease_id=self.id, error=str(error))
            else:
                self._expires_at = sent + self.ttl_seconds

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.revoke()


class MetadataStore(abc.ABC):
    """A driver: one connection (or database) to a metadata store rooted at one prefix."""

    uri: str

    def _track_lease(self, lease: Lease) -> Lease:
        """Remember a granted lease so that close() can stop its keep-alive task."""
        leases: weakref.WeakSet[Lease] = self.__dict__.setdefault("_leases", weakref.WeakSet())
        leases.add(lease)
        return lease

    async def _stop_keep_alives(self) -> None:
        for lease in list(self.__dict__.get("_leases", ())):
            await lease.stop_keep_alive()

    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        """Write unconditionally; returns the key's new version."""

    @abc.abstractmethod
    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        """Write if the key's version equals `expected_version` (0: the key must be absent).

        Returns the new version; raises MetadataVersionError on a mismatch. A driver that lost
        its connection while the write was in flight raises MetadataOutcomeUnknownError.
        """

    @abc.abstractmethod
    async def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        """Delete the key; False if it was absent. With `expected_version`, a present key at
        another version raises MetadataVersionError."""

    @abc.abstractmethod
    async def list_prefix(
        self,
        prefix: str,
        *,
        start_after: str | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> list[KeyValue]:
        """Keys starting with `prefix`, ascending, strictly after `start_after`, at most `limit`."""

    @abc.abstractmethod
    async def snapshot_prefix(self, prefix: str) -> PrefixSnapshot:
        """Every key under `prefix` and the revision they were read at, in one read."""

    @abc.abstractmethod
    async def grant_lease(self, ttl_seconds: float) -> Lease: ...

    @abc.abstractmethod
    def watch_prefix(
        self, prefix: str, *, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        """Every change under `prefix` from `start_revision` (inclusive; None: from the
        revision current when iteration starts, plus one), in order, across reconnects.

        Pass `start_revision=await store.current_revision() + 1` before doing the writes you
        want to see: an async generator starts watching only when first iterated.
        """

    @abc.abstractmethod
    async def current_revision(self) -> int: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def iterate_prefix(
        self, prefix: str, *, page_size: int = 1000, keys_only: bool = False
    ) -> AsyncIterator[KeyValue]:
        """Every key under `prefix`, ascending, read one page at a time."""
        start_after: str | None = None
        while True:
            page = await self.list_prefix(
                prefix, start_after=start_after, limit=page_size, keys_only=keys_only
            )
            for kv in page:
                yield kv
            if len(page) < page_size:
                return
            start_after = page[-1].key


def prefix_end(prefix: str) -> str:
    """The smallest string greater than every string that starts with `prefix`.

    Keys are compared as UTF-8 bytes by etcd and as text (same order for UTF-8) by SQLite.
    """
    encoded = bytearray(prefix.encode())
    while encoded and encoded[-1] == 0xFF:
        encoded.pop()
    assert encoded, f"prefix {prefix!r} has no upper bound"
    encoded[-1] += 1
    return encoded.decode(errors="surrogateescape")


def check_key(key: str) -> None:
    """Keys are absolute paths under the store root."""
    if not key.startswith("/"):
        raise MetadataError(f"metadata key {key!r} must start with '/'")
