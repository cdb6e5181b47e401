"""Bookie registration and discovery: leased keys under /bookies/{writable,readonly}/<id>.

Owns the registration life cycle (lease, background keep-alive, read-only flips, re-registering
after a lost lease) and the views clients build on it (list, watch). Driver-independent.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgpack
import structlog

from bkaio.backoff import Backoff
from bkaio.errors import MetadataError, MetadataVersionError
from bkaio.meta.conditional import compare_and_swap_resolved, delete_resolved
from bkaio.meta.errors import InvalidMetadataError, LeaseExpiredError
from bkaio.meta.store import EventKind, KeyValue, Lease, MetadataStore
from bkaio.supervision import Restart, loop_supervisor

log = structlog.get_logger(__name__)

BOOKIES_PREFIX = "/bookies/"
WRITABLE_PREFIX = "/bookies/writable/"
READONLY_PREFIX = "/bookies/readonly/"
DEFAULT_RACK = "/default-rack"


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieInfo:
    bookie_id: str  # "host:port", the port of shard 0.
    host: str
    port: int
    shard_count: int = 1  # Shard i listens on port + i; ledger L lives on shard L % shard_count.
    rack: str = DEFAULT_RACK
    version: str = ""  # Software version of the bookie.
    admin_url: str = ""
    read_only: bool = False
    # False: the bookie runs with journal.sync = false and acknowledges entries a power failure
    # can take (shown by `bkaio shell listbookies`).
    journal_sync: bool = True

    def __post_init__(self) -> None:
        if not self.bookie_id or "/" in self.bookie_id:
            raise InvalidMetadataError(f"bookie id {self.bookie_id!r} must be non-empty, no '/'")
        if not 0 < self.port < 65536 or self.shard_count < 1:
            raise InvalidMetadataError(
                f"bookie {self.bookie_id}: port {self.port} / shard_count {self.shard_count}"
                " out of range"
            )

    @classmethod
    def for_address(cls, host: str, port: int, **fields: Any) -> BookieInfo:
        return cls(bookie_id=f"{host}:{port}", host=host, port=port, **fields)


# Fields a registration record may carry (the id and the mode are in its key).
_RECORD_FIELDS = frozenset(BookieInfo.__dataclass_fields__) - {"bookie_id", "read_only"}


def encode_bookie_info(info: BookieInfo) -> bytes:
    record: dict[str, Any] = {
        "host": info.host,
        "port": info.port,
        "shard_count": info.shard_count,
        "rack": info.rack,
        "version": info.version,
        "admin_url": info.admin_url,
    }
    if not info.journal_sync:
        # Only when off: the usual record stays what clients that predate the field can read.
        record["journal_sync"] = False
    packed: bytes = msgpack.packb(record)
    return packed


def decode_bookie_info(kv: KeyValue) -> BookieInfo:
    """A registration record; fields this version does not know (a newer bookie's) are
    skipped, so that a client keeps its view of the cluster during an upgrade."""
    read_only = kv.key.startswith(READONLY_PREFIX)
    bookie_id = kv.key.rsplit("/", 1)[1]
    try:
        record = msgpack.unpackb(kv.value)
        if not isinstance(record, dict):
            raise TypeError(f"a {type(record).__name__}, not a map")
        known = {key: value for key, value in record.items() if key in _RECORD_FIELDS}
        return BookieInfo(bookie_id=bookie_id, read_only=read_only, **known)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as error:
        raise InvalidMetadataError(f"bookie registration {kv.key}: {error}") from None


def registration_key(bookie_id: str, *, read_only: bool) -> str:
    return (READONLY_PREFIX if read_only else WRITABLE_PREFIX) + bookie_id


def _merge(kvs: dict[str, KeyValue]) -> builtins.list[BookieInfo]:
    """One BookieInfo per bookie, sorted by id; read-only wins while both keys exist."""
    by_id: dict[str, BookieInfo] = {}
    for kv in kvs.values():
        if kv.key.startswith((WRITABLE_PREFIX, READONLY_PREFIX)):
            info = decode_bookie_info(kv)
            if info.read_only or info.bookie_id not in by_id:
                by_id[info.bookie_id] = info
    return [by_id[bookie_id] for bookie_id in sorted(by_id)]


# Leases of one registration that may still carry its record: the current one and those of
# re-registration attempts that failed after their grant (a write whose outcome is unknown).
# Older ones than this many attempts back have expired long since (nothing keeps them alive).
_OWN_LEASES_KEPT = 16


async def _registration_records(store: MetadataStore, bookie_id: str) -> builtins.list[KeyValue]:
    """The bookie's registration records as the store has them now (writable, read-only)."""
    keys = [registration_key(bookie_id, read_only=flag) for flag in (False, True)]
    return [kv for kv in [await store.get(key) for key in keys] if kv is not None]


def _still_held(bookie_id: str, record: KeyValue, seconds: float) -> str:
    return (
        f"bookie {bookie_id} is still registered at {record.key} (lease {record.lease}) after"
        f" {seconds} s: is another bookie running with this id?"
    )


class _HeldWait:
    """A record of another lease met while writing ours, waited out for 2 x TTL: logged when
    first met, then `over` once that time has passed."""

    def __init__(self, bookie_id: str, ttl_seconds: float) -> None:
        self._bookie_id = bookie_id
        self.seconds = 2 * ttl_seconds
        self.poll_seconds = min(0.2, ttl_seconds / 10)
        self._deadline: float | None = None

    def over(self, holder: KeyValue) -> bool:
        now = asyncio.get_running_loop().time()
        if self._deadline is None:
            self._deadline = now + self.seconds
            log.warning(
                "bookie_registration_held_by_another",
                bookie_id=self._bookie_id,
                key=holder.key,
                lease=holder.lease,
                wait_seconds=self.seconds,
            )
            return False
        return now >= self._deadline


class RegistrationState(enum.Enum):
    """What a bookie knows of its registration, as its admin state and metrics show it."""

    # The record is in place under a lease the store confirmed within its TTL.
    REGISTERED = "registered"
    # The record is in place, but no refresh of its lease was confirmed within the TTL by this
    # process's clock (an event-loop stall, a slow or unreachable store) and the keep-alive's late
    # refresh has not answered yet: the store may have dropped the lease and the record with it.
    # Settled within one attempt timeout, to REGISTERED or LOST.
    UNCONFIRMED = "unconfirmed"
    # The lease is lost (the store dropped the record, or may have): re-registering until the
    # record is back under a new lease, or for good once another process kept the bookie's id.
    LOST = "lost"
    DEREGISTERED = "deregistered"  # Removed on purpose (the bookie stops).


class BookieRegistration:
    """A live registration: kept alive in the background, re-created if its lease lapses.

    Re-creating it, like a mode move, writes only over records of this registration's own
    leases: a record another process registered meanwhile (a bookie started with the same id) is
    waited out for up to 2 x TTL, then this registration is lost for good: reported as a fatal
    task failure on the loop's supervisor (a bookie then stops, exit 3), never overwritten.
    """

    def __init__(self, store: MetadataStore, info: BookieInfo, lease: Lease) -> None:
        self._store = store
        self._info = info
        self._lease = lease
        self._own_leases: collections.deque[int] = collections.deque(
            [lease.id], maxlen=_OWN_LEASES_KEPT
        )
        # One write of the record at a time: a re-registration and a mode move each read the
        # keys, then write by version.
        self._writing = asyncio.Lock()
        self._deregistered = False
        self._in_place = True  # False from a lost lease until a new one carries the record.
        self._lost_for_good = False  # Another process kept the id for 2 x TTL: reported fatal.
        self._move_pending = False  # A mode move started and not yet finished.
        self._keeper = loop_supervisor().spawn(
            "bookie_registration", self._keep, Restart(), instance=f"{info.bookie_id}/{lease.id}"
        )

    @property
    def info(self) -> BookieInfo:
        return self._info

    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def registered(self) -> bool:
        """True while a live lease carries the record; False from a lost lease (the store
        dropped the key, or may have) until the record is back under a new one, and for good
        once another process kept the id."""
        # `lost`, not `in_doubt`: what this gates (a mode move) writes the record bound to the
        # lease, which the store refuses once the lease is gone (etcd: "lease not found";
        # SQLite: the lease's row, expired ones reaped first, checked in the write's
        # transaction), and deletes the other mode's record only after that write succeeded.
        # A move on a lease in doubt is so either made on a live lease or refused, never made
        # on a dropped one; the keep-alive's late refresh then settles `lost`.
        return (
            self._in_place
            and not self._lease.lost
            and not self._deregistered
            and not self._lost_for_good
        )

    @property
    def state(self) -> RegistrationState:
        """`registered` told apart by whether the store confirmed the lease within its TTL: what
        an operator is shown (a lease in doubt is not yet known lost, `registered` stays true)."""
        if self._deregistered:
            return RegistrationState.DEREGISTERED
        if not self.registered:
            return RegistrationState.LOST
        if self._lease.in_doubt:
            return RegistrationState.UNCONFIRMED
        return RegistrationState.REGISTERED

    async def set_read_only(self, read_only: bool) -> None:
        """Move the registration to /bookies/readonly (or back) under the same lease.

        While the registration is lost, only the mode changes here: the record comes back
        under the new mode's key when it is registered again. A key of the new mode held by
        another process is waited out as re-registration does (2 x TTL, then lost for good)."""
        async with self._writing:
            if read_only == self._info.read_only and not self._move_pending:
                return
            self._info = BookieInfo(**{**_fields(self._info), "read_only": read_only})
            if self.registered:
                # Until both steps are done, a call for the same mode does them again (a failed
                # move would otherwise count as made, and a read-only bookie stay listed as
                # writable).
                self._move_pending = True
                await self._move()
            self._move_pending = False
        log.info("bookie_mode_changed", bookie_id=self._info.bookie_id, read_only=read_only)

    async def _move(self) -> None:
        """The record under the current mode's key, the other mode's deleted, under the same
        lease; a record of another process is waited out (ended early by a lost lease: the
        re-registration writes the new mode then)."""
        held = _HeldWait(self._info.bookie_id, self._lease.ttl_seconds)
        while (holder := await self._write_if_absent_or_own(new_lease=False)) is not None:
            if held.over(holder):
                self._give_up(holder)
                return
            await asyncio.sleep(held.poll_seconds)
            if not self.registered:
                return

    async def _keep(self) -> None:
        """Re-register under a new lease whenever the lease is lost (metadata was unreachable
        for longer than its TTL, say), retrying with backoff until it is done; a record of
        another process is waited out for up to 2 x TTL, then the registration is lost."""
        ttl = self._lease.ttl_seconds
        backoff = Backoff(0.2, max(0.2, min(5.0, ttl / 2)))
        held = _HeldWait(self._info.bookie_id, ttl)
        while not self._deregistered:
            if self._in_place:
                await self._lease.wait_lost()
                if self._deregistered or self._lost_for_good:
                    return
                log.warning("bookie_registration_lost", bookie_id=self._info.bookie_id)
                self._in_place = False
                held = _HeldWait(self._info.bookie_id, ttl)
            try:
                async with self._writing:
                    if self._lost_for_good:  # A mode move gave up meanwhile.
                        return
                    holder = await self._register_again()
            except (MetadataError, MetadataVersionError) as error:
                delay = backoff.next_delay()
                log.warning(
                    "bookie_reregister_failed",
                    bookie_id=self._info.bookie_id,
                    error=str(error),
                    retry_in=round(delay, 2),
                )
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            if holder is None:
                continue
            if held.over(holder):
                self._give_up(holder)
                return
            await asyncio.sleep(held.poll_seconds)

    def _give_up(self, holder: KeyValue) -> None:
        """Another process kept the id for 2 x TTL: the registration is lost for good. Logged
        at ERROR and counted (bkaio_task_failures_total{task="bookie_registration"}) by the
        loop's supervisor; a bookie then turns unhealthy and stops."""
        self._lost_for_good = True
        held = _still_held(self._info.bookie_id, holder, 2 * self._lease.ttl_seconds)
        loop_supervisor().report_fatal(
            "bookie_registration", MetadataError(f"registration lost for good: {held}")
        )

    async def _register_again(self) -> KeyValue | None:
        """Put the record back under a new lease if no other process holds either key of the
        bookie; else the record that holds it (nothing written)."""
        holder = await self._write_if_absent_or_own(new_lease=True)
        if holder is not None:
            return holder
        self._lease.start_keep_alive()
        self._own_leases.clear()
        self._own_leases.append(self._lease.id)
        self._in_place = True
        log.info("bookie_reregistered", bookie_id=self._info.bookie_id, lease_id=self._lease.id)
        return None

    async def _write_if_absent_or_own(self, *, new_lease: bool) -> KeyValue | None:
        """The record under the current mode's key, then the other mode's key deleted, when
        neither holds a record of another process (else that record, nothing written): under
        a new lease (`new_lease`, re-registering) or the current one (a mode move)."""
        bookie_id, read_only = self._info.bookie_id, self._info.read_only
        records = await _registration_records(self._store, bookie_id)
        for record in records:
            if record.lease not in self._own_leases:
                return record
        own = {record.key: record for record in records}
        if new_lease:
            # A lease granted for an attempt that fails is left to expire: nothing keeps it
            # alive, and the next attempt takes a new one (and counts a record under it as its
            # own).
            self._lease = await self._store.grant_lease(self._lease.ttl_seconds)
            self._own_leases.append(self._lease.id)
        key = registration_key(bookie_id, read_only=read_only)
        current = own.get(key)
        # The new key first: the bookie is never missing from the list during a move.
        await compare_and_swap_resolved(
            self._store,
            key,
            encode_bookie_info(self._info),
            expected_version=0 if current is None else current.version,
            lease=self._lease,
        )
        stale = own.get(registration_key(bookie_id, read_only=not read_only))
        if stale is not None:  # The other mode's record, of this or an old lease of ours.
            await delete_resolved(self._store, stale.key, expected_version=stale.version)
        return None

    async def deregister(self) -> None:
        """Remove the registration now (revoking the lease deletes its key)."""
        if self._deregistered:
            return
        self._deregistered = True
        self._keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._keeper
        await self._lease.revoke()
        log.info("bookie_deregistered", bookie_id=self._info.bookie_id)


def _fields(info: BookieInfo) -> dict[str, Any]:
    return {name: getattr(info, name) for name in BookieInfo.__dataclass_fields__}


class BookieRegistry:
    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    async def register(self, info: BookieInfo, ttl_seconds: float = 10.0) -> BookieRegistration:
        """Register under a lease kept alive in the background.

        A key left by a previous incarnation (another lease) is waited out for up to 2 x TTL;
        MetadataError if it is still there then (is another live bookie using this id?).
        """
        await self._wait_for_previous_incarnation(info.bookie_id, ttl_seconds)
        lease = await self._store.grant_lease(ttl_seconds)
        key = registration_key(info.bookie_id, read_only=info.read_only)
        try:
            await compare_and_swap_resolved(  # A lost answer: read back, under this lease.
                self._store, key, encode_bookie_info(info), expected_version=0, lease=lease
            )
        except MetadataVersionError:
            await lease.revoke()
            raise MetadataError(
                f"bookie {info.bookie_id} registered meanwhile by another process"
            ) from None
        except BaseException:
            with contextlib.suppress(MetadataError, LeaseExpiredError):
                await lease.revoke()
            raise
        lease.start_keep_alive()
        log.info("bookie_registered", bookie_id=info.bookie_id, read_only=info.read_only,
                 lease_id=lease.id, ttl_seconds=ttl_seconds)  # fmt: skip
        return BookieRegistration(self._store, info, lease)

    async def _wait_for_previous_incarnation(self, bookie_id: str, ttl_seconds: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * ttl_seconds
        waited = False
        while True:
            present = await _registration_records(self._store, bookie_id)
            if not present:
                return
            if loop.time() >= deadline:
                raise MetadataError(_still_held(bookie_id, present[0], 2 * ttl_seconds))
            if not waited:
                log.info("bookie_waiting_for_old_registration", bookie_id=bookie_id)
                waited = True
            await asyncio.sleep(min(0.2, ttl_seconds / 10))

    async def list(self) -> builtins.list[BookieInfo]:
        """Every registered bookie, writable and read-only, sorted by bookie id."""
        snapshot = await self._store.snapshot_prefix(BOOKIES_PREFIX)
        return _merge({kv.key: kv for kv in snapshot.kvs})

    async def ids(self) -> set[str]:
        """The ids of every registered bookie, writable and read-only, as the registry has them
        now (a watch-fed view may lag behind it)."""
        return {info.bookie_id for info in await self.list()}

    async def writable(self) -> builtins.list[BookieInfo]:
        return [info for info in await self.list() if not info.read_only]

    async def watch(self) -> AsyncIterator[builtins.list[BookieInfo]]:
        """The current bookie list, then a new one after every join, leave or mode flip."""
        snapshot = await self._store.snapshot_prefix(BOOKIES_PREFIX)
        kvs = {kv.key: kv for kv in snapshot.kvs}
        current = _merge(kvs)
        yield current
        events = self._store.watch_prefix(BOOKIES_PREFIX, start_revision=snapshot.revision + 1)
        async with contextlib.aclosing(events):
            async for event in events:
                if event.kind is EventKind.DELETE:
                    kvs.pop(event.key, None)
                else:
                    kvs[event.key] = KeyValue(
                        key=event.key, value=event.value, version=event.revision,
                        create_revision=0, lease=0,
                    )  # fmt: skip
                latest = _merge(kvs)
                if latest != current:
                    current = latest
                    yield current
