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
from typing import Any

import structlog
from prometheus_client import Counter

from bkaio.errors import MetadataError
from bkaio.meta.errors import LeaseExpiredError
from bkaio.supervision import Restart, loop_supervisor

log = structlog.get_logger(__name__)

# A lease refresh attempt is cut off after a quarter of the TTL, but never sooner than this: well
# inside the TTL, so that a silent etcd member is left for another while the lease still lives,
# yet not so soon that a busy store counts as silent.
KEEP_ALIVE_MIN_ATTEMPT_SECONDS = 1.0

LATE_REFRESHES = Counter(
    "bkaio_lease_late_refreshes",
    "Leases kept although no refresh was confirmed within their TTL by this process's clock "
    "(its event loop stalled, or the store was slow): the late refresh found them alive",
)

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

    def __init__(
        self, lease_id: int, ttl_seconds: float, *, requested_at: float | None = None
    ) -> None:
        """`requested_at`: the loop time the grant was requested (default: now); a driver
        passes it, as the store counts the TTL from granting, which may be long before the
        grant's answer arrives (a slow reply, a stalled loop)."""
        assert lease_id > 0, lease_id
        assert ttl_seconds > 0, ttl_seconds
        loop = asyncio.get_running_loop()
        self.id = lease_id
        self.ttl_seconds = ttl_seconds
        self._keep_alive_task: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self._confirmation: asyncio.Future[None] | None = None  # Of `wait_confirmed` callers.
        # Loop time until which the store certainly holds the lease: a TTL after the last
        # confirmed refresh (at first: the grant) was sent; the store counts from receiving it.
        self._expires_at = (loop.time() if requested_at is None else requested_at) + ttl_seconds

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
        """True once the store said the lease is gone, or no refresh was confirmed for a TTL and
        the one late refresh after that failed too (its holder must stop acting on it), or after
        revoke. See `in_doubt` for the time before that late refresh answers."""
        return self._lost.is_set()

    @property
    def in_doubt(self) -> bool:
        """True when the store may no longer hold the lease: `lost`, or no refresh confirmed
        within a TTL by this process's clock (a stalled event loop, a silent store) while the
        keep-alive's late refresh has not answered (or not started) yet. A holder about to act
        outside the store on what the lease guards (GC deleting ledgers under its locks) checks
        this, not `lost`: between the local deadline and the late refresh's answer the store
        may have dropped it."""
        return self._lost.is_set() or asyncio.get_running_loop().time() >= self._expires_at

    @property
    def attempt_timeout_seconds(self) -> float:
        """How long one refresh attempt may take: a quarter of the TTL, at least
        KEEP_ALIVE_MIN_ATTEMPT_SECONDS."""
        return max(KEEP_ALIVE_MIN_ATTEMPT_SECONDS, self.ttl_seconds / 4)

    async def wait_lost(self) -> None:
        await self._lost.wait()

    async def wait_confirmed(self) -> bool:
        """Wait until the lease is not `in_doubt`: True at once while the store certainly holds
        it, or as soon as a refresh is confirmed; False once it is lost. A holder about to act
        on what the lease guards where the store does not check the lease (a compare-and-swap
        of another key, a write outside the store) calls this first and acts only on True.

        Bounded: the keep-alive settles a doubt within its interval (at most half a TTL:
        `start_keep_alive` refuses more) and one attempt timeout, so after a TTL and one attempt
        timeout without either this returns False too (the
        keep-alive is not running, or stuck): the holder must not act then either."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ttl_seconds + self.attempt_timeout_seconds
        while self.in_doubt:
            if self.lost or loop.time() >= deadline:
                return False
            if self._confirmation is None:
                self._confirmation = loop.create_future()
            lost = loop.create_task(self._lost.wait())
            waits: list[asyncio.Future[Any]] = [self._confirmation, lost]
            try:
                await asyncio.wait(
                    waits, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                lost.cancel()
        return True

    def start_keep_alive(self, interval_seconds: float | None = None) -> None:
        """Refresh in the background every `interval_seconds` (default: a third of the TTL).

        ValueError unless 0 < interval <= half the TTL: `wait_confirmed`'s bound counts on a
        doubt being settled within an interval and one attempt timeout, which holds only while
        the interval is at most a TTL, and also after a refresh that failed on a bug (the
        restart waits up to another interval); a longer one would also let every refresh come
        after the deadline."""
        interval = interval_seconds if interval_seconds is not None else self.ttl_seconds / 3
        if not 0 < interval <= self.ttl_seconds / 2:  # False for NaN too.
            raise ValueError(
                f"lease {self.id}: keep-alive interval {interval} s must be more than 0 "
                f"and at most half the lease's TTL ({self.ttl_seconds} s)"
            )
        if self._keep_alive_task is not None:
            return
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
            try:
                if loop.time() < self._expires_at and await self._refresh_in_time(loop):
                    continue
                # Past the local deadline with no refresh confirmed: the store decides.
                kept = await self._refresh_late(loop)
            except LeaseExpiredError:
                log.warning("lease_lost", lease_id=self.id, ttl_seconds=self.ttl_seconds)
                kept = False
            if not kept:
                self._lost.set()
                return

    async def _refresh_in_time(self, loop: asyncio.AbstractEventLoop) -> bool:
        """One refresh cut off at the local deadline. True when it was confirmed, or failed
        while the deadline is still ahead (the next one comes after the interval); False when
        the deadline passed without one. LeaseExpiredError when the store says it is gone."""
        try:
            # Cut off at the deadline: past it, the late refresh's own bound applies.
            await self._refresh_by(self._expires_at)
        except LeaseExpiredError:
            raise
        except (MetadataError, TimeoutError) as error:
            if loop.time() >= self._expires_at:
                return False
            # The store is unreachable; keep trying while the lease may still live there.
            log.warning("lease_keep_alive_failed", lease_id=self.id, error=str(error))
        return True

    async def _refresh_by(self, deadline: float) -> None:
        """One refresh cut off at loop time `deadline`; once the store confirms it, the local
        deadline moves to a TTL after it was sent."""
        sent = asyncio.get_running_loop().time()
        async with asyncio.timeout_at(deadline):
            await self.keep_alive()
        self._expires_at = sent + self.ttl_seconds
        confirmation, self._confirmation = self._confirmation, None
        if confirmation is not None:
            confirmation.set_result(None)

    async def _refresh_late(self, loop: asyncio.AbstractEventLoop) -> bool:
        """The one refresh after the local deadline passed unconfirmed: True when the store
        confirmed the lease (it is kept), False when it did not answer (lost);
        LeaseExpiredError when it says the lease is gone.

        The deadline passes unconfirmed when the store stays silent or unreachable, but also
        when this process's event loop stalls past it (GC pause, a CPU-starved box, SIGSTOP):
        no refresh could be sent, yet the store counts the TTL from the last refresh it received
        and etcd extends leases across a leader change, so the lease may well live. The store's
        answer decides, as a ZooKeeper session expires when the server says so: this attempt is
        bounded by the normal attempt timeout (the deadline is already past), and a lease the
        store confirms (TTL > 0) was never dropped, so nobody else can hold what it guards. A
        store that says it is gone, or that does not answer this attempt either, loses it as
        before: the holder must stop acting on it.

        Safety: until the local deadline the store certainly holds the lease (it counts the TTL
        from receiving the refresh, after this process sent it). While the loop was stalled past
        it the holder did nothing (it was stalled too). From the resume until this attempt
        answers (one attempt timeout at most) a holder that checks only `lost` may act on a
        lease the store has dropped; before, it could too, from the deadline to the keep-alive's
        next turn (up to an interval after a refresh that failed at once). Writes bound to the
        lease (a lock, a registration, the auditor key) are refused by the store then; a holder
        that acts outside the store on what the lease guards (GC deleting ledgers under its
        locks) checks `in_doubt`, true from the local deadline until a refresh is confirmed,
        and one that writes other keys on its strength (autorecovery's swaps and mark removals
        under a lock) awaits `wait_confirmed` first.
        """
        deadline = self._expires_at
        sent = loop.time()
        try:
            await self._refresh_by(sent + self.attempt_timeout_seconds)
        except LeaseExpiredError:
            raise
        except (MetadataError, TimeoutError) as error:
            # Unconfirmed for a whole TTL and once more: the store may have dropped the lease
            # and someone else taken what it held (an election, a lock). Lost, as far as this
            # holder can tell; it must not go on acting as if it still held it.
            log.warning(
                "lease_lost", lease_id=self.id, ttl_seconds=self.ttl_seconds,
                reason="no refresh confirmed within the TTL", error=str(error),
            )  # fmt: skip
            return False
        LATE_REFRESHES.inc()
        log.warning(
            "lease_refresh_late", lease_id=self.id, ttl_seconds=self.ttl_seconds,
            late_seconds=round(sent - deadline, 3),
        )  # fmt: skip
        return True

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
