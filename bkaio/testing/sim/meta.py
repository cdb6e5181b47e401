"""An in-memory metadata driver: the simulation's etcd, and a third driver of the contract.

`MemoryMetadataServer` is the store itself (keys, one revision counter, leases, a change log
for watches); `server.connect()` gives a `MemoryMetadataStore`, a `MetadataStore` (bkaio.meta)
like the etcd and SQLite drivers, and tests/integration/meta/test_store_contract.py runs the
same contract against it. Leases expire on the event loop's clock: virtual time in the
simulation, real time elsewhere.

In the simulation the server belongs to no simulated process (it is the metadata cluster; it
never crashes), so its timers run in the context it was created in. A connection can be given a
`StoreFaults`: a seeded delay before a request reaches the server and before its answer returns,
and a chance that a conditional write's answer (a CAS, a versioned delete) is lost
(`MetadataOutcomeUnknownError`, etcd's indeterminate outcome: a leader change, or a silent
member the client leaves after its attempt timeout). A lost answer is of one of three kinds
(`LostAnswer`): the write applied before the answer was lost, it never applied, or it is held
and applies at a seeded later virtual time, still conditioned on the version it was sent with
(so it may then be refused, which nobody hears of), perhaps after the caller re-read the key
and sent it again.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import enum
import random
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TypeVar

from bkaio.errors import MetadataError, MetadataVersionError
from bkaio.meta.errors import LeaseExpiredError, MetadataOutcomeUnknownError, WatchCompactedError
from bkaio.meta.store import (
    EventKind,
    KeyValue,
    Lease,
    MetadataStore,
    PrefixSnapshot,
    WatchEvent,
    check_key,
    prefix_end,
)

T = TypeVar("T")

# Changes kept for watches that start in the past; older ones are compacted (as etcd does).
CHANGES_KEPT = 100_000


@dataclass(slots=True)
class _Lease:
    ttl_seconds: float
    expiry: asyncio.TimerHandle | None
    keys: set[str]


class MemoryMetadataServer:
    """The store: every connection to it sees one linearizable keyspace."""

    def __init__(self, *, changes_kept: int = CHANGES_KEPT) -> None:
        self._loop = asyncio.get_running_loop()
        self._context = contextvars.copy_context()  # Timers run as the server, not a caller.
        self._kvs: dict[str, KeyValue] = {}
        self._sorted: list[str] = []
        self._revision = 1
        self._changes: list[WatchEvent] = []
        self._changes_kept = changes_kept
        self._compacted = 0  # Revisions up to this one are no longer in `_changes`.
        self._leases: dict[int, _Lease] = {}
        self._next_lease = 1
        self._changed: asyncio.Future[None] | None = None

    def connect(self, faults: StoreFaults | None = None) -> MemoryMetadataStore:
        return MemoryMetadataStore(self, faults)

    # ----------------------------------------------------------------- keys

    def get(self, key: str) -> KeyValue | None:
        return self._kvs.get(key)

    def put(self, key: str, value: bytes, lease_id: int, expected: int | None) -> int:
        current = self._kvs.get(key)
        if expected is not None and (0 if current is None else current.version) != expected:
            raise MetadataVersionError(
                f"metadata key {key}: version is {0 if current is None else current.version},"
                f" expected {expected}"
            )
        if lease_id and lease_id not in self._leases:
            raise LeaseExpiredError(f"lease {lease_id} expired; cannot put {key}")
        revision = self._next_revision()
        if current is None:
            bisect.insort(self._sorted, key)
        elif current.lease and current.lease in self._leases:
            self._leases[current.lease].keys.discard(key)
        created = revision if current is None else current.create_revision
        self._kvs[key] = KeyValue(key, value, revision, created, lease_id)
        if lease_id:
            self._leases[lease_id].keys.add(key)
        self._record(WatchEvent(EventKind.PUT, key, value, revision))
        return revision

    def delete(self, key: str, expected: int | None) -> bool:
        current = self._kvs.get(key)
        if current is None:
            return False
        if expected is not None and current.version != expected:
            raise MetadataVersionError(
                f"metadata key {key}: version is {current.version}, expected {expected};"
                " not deleted"
            )
        self._remove(key)
        return True

    def _remove(self, key: str) -> None:
        current = self._kvs.pop(key)
        del self._sorted[bisect.bisect_left(self._sorted, key)]
        if current.lease in self._leases:
            self._leases[current.lease].keys.discard(key)
        self._record(WatchEvent(EventKind.DELETE, key, b"", self._next_revision()))

    def list_prefix(
        self, prefix: str, start_after: str | None, limit: int | None, keys_only: bool
    ) -> list[KeyValue]:
        keys = self._sorted
        if start_after is None:
            first = bisect.bisect_left(keys, prefix)
        else:
            first = max(bisect.bisect_right(keys, start_after), bisect.bisect_left(keys, prefix))
        last = bisect.bisect_left(keys, prefix_end(prefix))
        if limit is not None:
            last = min(last, first + limit)
        found = [self._kvs[key] for key in keys[first:last]]
        if keys_only:
            found = [
                KeyValue(kv.key, b"", kv.version, kv.create_revision, kv.lease) for kv in found
            ]
        return found

    @property
    def revision(self) -> int:
        return self._revision

    def _next_revision(self) -> int:
        self._revision += 1
        return self._revision

    # ----------------------------------------------------------------- leases

    def grant(self, ttl_seconds: float) -> int:
        lease_id = self._next_lease
        self._next_lease += 1
        self._leases[lease_id] = _Lease(ttl_seconds, None, set())
        self._arm(lease_id)
        return lease_id

    def keep_alive(self, lease_id: int) -> None:
        if lease_id not in self._leases:
            raise LeaseExpiredError(f"lease {lease_id} has expired")
        self._arm(lease_id)

    def revoke(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            raise LeaseExpiredError(f"lease {lease_id} has expired")
        self._drop(lease)

    def _arm(self, lease_id: int) -> None:
        lease = self._leases[lease_id]
        if lease.expiry is not None:
            lease.expiry.cancel()
        lease.expiry = self._loop.call_later(
            lease.ttl_seconds, self._expire, lease_id, context=self._context.copy()
        )

    def _expire(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            self._drop(lease)

    def _drop(self, lease: _Lease) -> None:
        if lease.expiry is not None:
            lease.expiry.cancel()
        for key in sorted(lease.keys):
            if key in self._kvs:
                self._remove(key)
        lease.keys.clear()

    # ----------------------------------------------------------------- watches

    def _record(self, event: WatchEvent) -> None:
        self._changes.append(event)
        if len(self._changes) > self._changes_kept:
            dropped = len(self._changes) - self._changes_kept
            self._compacted = self._changes[dropped - 1].revision
            del self._changes[:dropped]
        changed, self._changed = self._changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)

    def changes_from(self, revision: int, prefix: str) -> list[WatchEvent]:
        """Changes under `prefix` at `revision` or later (WatchCompactedError if gone)."""
        if revision <= self._compacted:
            raise WatchCompactedError(
                f"revision {revision} is compacted (changes up to {self._compacted} are gone)"
            )
        revisions = [event.revision for event in self._changes]
        first = bisect.bisect_left(revisions, revision)
        return [event for event in self._changes[first:] if event.key.startswith(prefix)]

    async def changed(self) -> None:
        """Return after the next change."""
        if self._changed is None:
            self._changed = self._loop.create_future()
        await asyncio.shield(self._changed)

    # ----------------------------------------------------------------- late writes

    def apply_later(
        self,
        delay: float,
        function: Callable[..., object],
        args: tuple[object, ...],
        what: str,
        tell: Callable[[str], None],
    ) -> None:
        """Apply a write whose answer was lost `delay` seconds from now, as the server (a
        crash of the process that sent it does not stop it), conditioned as it was sent."""

        def land() -> None:
            tell(f"{what}: answer lost, reached the store late: {_outcome(function, *args)}")

        self._loop.call_later(delay, land, context=self._context.copy())


class LostAnswer(enum.Enum):
    """What became of a conditional write whose answer was lost."""

    APPLIED = "applied"  # It reached the store (applied, or refused there), then the answer
    # was lost.
    NOT_APPLIED = "not-applied"  # It never reached the store.
    LATE = "late"  # It reaches the store later, conditioned on the version it was sent with.


@dataclass
class StoreFaults:
    """A connection's seeded delays and lost answers (simulation only)."""

    rng: random.Random
    latency: tuple[float, float] = (0.0005, 0.005)
    lost_answer: float = 0.0  # Chance that a conditional write's answer is lost.
    lost_kinds: tuple[LostAnswer, ...] = tuple(LostAnswer)  # Drawn evenly per lost answer.
    # How long a LATE write is held before it reaches the store: a range drawn evenly, then a
    # delay in it. The first spans the caller's resolution (it lands before its read-back,
    # between the read-back and the second copy, or after that copy); the second, up to an
    # etcd client's attempt timeout, lands long after the caller moved on.
    late_by: tuple[tuple[float, float], ...] = ((0.0005, 0.02), (0.02, 2.0))
    note: Callable[[str], None] | None = None  # Told what a lost answer did, for the report.

    def __post_init__(self) -> None:
        if not 0.0 <= self.lost_answer <= 1.0:
            raise ValueError(f"StoreFaults.lost_answer {self.lost_answer} is not in [0, 1]")
        if self.lost_answer and not self.lost_kinds:
            raise ValueError("StoreFaults.lost_kinds is empty but lost_answer is not 0")
        if not self.late_by or any(not 0.0 <= low <= high for low, high in self.late_by):
            raise ValueError(f"StoreFaults.late_by {self.late_by} is not a list of delay ranges")

    async def travel(self) -> None:
        await asyncio.sleep(self.rng.uniform(*self.latency))

    def lose(self) -> LostAnswer | None:
        """Whether this conditional write's answer is lost, and how."""
        if not self.lost_answer or self.rng.random() >= self.lost_answer:
            return None
        return self.rng.choice(self.lost_kinds)

    def tell(self, text: str) -> None:
        if self.note is not None:
            self.note(text)


def _outcome(function: Callable[..., object], *args: object) -> str:
    """Apply a write nobody will hear the answer of: what became of it, in words."""
    try:
        function(*args)
    except (MetadataVersionError, LeaseExpiredError) as refused:
        return f"refused: {refused}"
    return "done"


class MemoryLease(Lease):
    def __init__(
        self, store: MemoryMetadataStore, lease_id: int, ttl_seconds: float, requested_at: float
    ) -> None:
        super().__init__(lease_id, ttl_seconds, requested_at=requested_at)
        self._store = store

    async def keep_alive(self) -> None:
        await self._store._call(self._store._server.keep_alive, self.id)

    async def _revoke(self) -> None:
        await self._store._call(self._store._server.revoke, self.id)


class MemoryMetadataStore(MetadataStore):
    """One connection to a `MemoryMetadataServer`."""

    def __init__(self, server: MemoryMetadataServer, faults: StoreFaults | None = None) -> None:
        self.uri = "memory://"
        self._server = server
        self._faults = faults
        self._closed = False

    async def _call(self, function: Callable[..., T], *args: object, conditional: str = "") -> T:
        """`function(*args)` on the server, after the request's travel; `conditional` names a
        conditional write (whose answer `StoreFaults` may lose) for the report."""
        if self._closed:
            raise MetadataError("metadata connection is closed")
        faults = self._faults
        if faults is None:
            return function(*args)
        await faults.travel()  # The request on its way.
        lost = faults.lose() if conditional else None
        if lost is None:
            result = function(*args)
            await faults.travel()  # The answer on its way.
            return result
        if lost is LostAnswer.APPLIED:
            outcome = _outcome(function, *args)
            faults.tell(f"{conditional}: answer lost, reached the store at once: {outcome}")
        elif lost is LostAnswer.NOT_APPLIED:
            faults.tell(f"{conditional}: answer lost, never reached the store")
        else:
            self._server.apply_later(
                faults.rng.uniform(*faults.rng.choice(faults.late_by)),
                function,
                args,
                conditional,
                faults.tell,
            )
        await faults.travel()
        raise MetadataOutcomeUnknownError(
            f"{conditional}: the answer was lost; the write may or may not have applied"
        )

    async def get(self, key: str) -> KeyValue | None:
        check_key(key)
        return await self._call(self._server.get, key)

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        check_key(key)
        lease_id = 0 if lease is None else lease.id
        return await self._call(self._server.put, key, value, lease_id, None)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        check_key(key)
        assert expected_version >= 0, expected_version
        lease_id = 0 if lease is None else lease.id
        return await self._call(
            self._server.put,
            key,
            value,
            lease_id,
            expected_version,
            conditional=f"CAS {key} at version {expected_version}",
        )

    async def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        check_key(key)
        conditional = (
            "" if expected_version is None else f"delete {key} at version {expected_version}"
        )
        return await self._call(self._server.delete, key, expected_version, conditional=conditional)

    async def list_prefix(
        self,
        prefix: str,
        *,
        start_after: str | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> list[KeyValue]:
        check_key(prefix)
        assert limit is None or limit > 0, limit
        return await self._call(self._server.list_prefix, prefix, start_after, limit, keys_only)

    async def snapshot_prefix(self, prefix: str) -> PrefixSnapshot:
        check_key(prefix)
        server = self._server

        def snapshot() -> PrefixSnapshot:
            return PrefixSnapshot(server.list_prefix(prefix, None, None, False), server.revision)

        return await self._call(snapshot)

    async def grant_lease(self, ttl_seconds: float) -> Lease:
        # The server counts the TTL from granting, which a slow answer (`StoreFaults`) leaves
        # behind: the lease's local deadline counts from the request, as the real drivers' do.
        requested_at = asyncio.get_running_loop().time()
        lease_id = await self._call(self._server.grant, ttl_seconds)
        return self._track_lease(MemoryLease(self, lease_id, ttl_seconds, requested_at))

    async def watch_prefix(
        self, prefix: str, *, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        check_key(prefix)
        server = self._server
        next_revision = server.revision + 1 if start_revision is None else start_revision
        while not self._closed:
            events = server.changes_from(next_revision, prefix)
            if not events:
                await server.changed()
                continue
            if self._faults is not None:
                await self._faults.travel()
            for event in events:
                next_revision = event.revision + 1
                yield event

    async def current_revision(self) -> int:
        server = self._server

        def revision() -> int:
            return server.revision

        return await self._call(revision)

    async def close(self) -> None:
        self._closed = True
        await self._stop_keep_alives()
