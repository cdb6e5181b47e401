"""Metadata for autorecovery: the under-replicated ledger queue, its controls and auditor
election (decommissioned bookies: bkaio/meta/decommission.py).

Layout (reference/bookkeeper.md section 4.3, mapped to flat keys):
    /underreplicated/<20-digit ledger id>     msgpack {missing_bookies, ctime_ms, forced_bookies,
                                                       incomplete_bookies}
    /underreplication/locks/<ledger id>       leased lock of the worker re-replicating it
    /underreplication/disable                 present: autorecovery is disabled
    /underreplication/control/lost_bookie_delay   text seconds: overrides the configured delay
    /underreplication/control/audit_request   any write asks the auditor to audit now
    /auditor                                  leased; value = the auditor's bookie id
Driver-independent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import secrets
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Collection, Iterable
from dataclasses import dataclass

import msgpack
import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from bkaio.errors import InvalidArgumentError, MetadataVersionError
from bkaio.meta.conditional import compare_and_swap_resolved, delete_resolved
from bkaio.meta.errors import InvalidMetadataError
from bkaio.meta.ledger_metadata import now_ms
from bkaio.meta.store import (
    MAX_METADATA_ATTEMPTS,
    EventKind,
    KeyValue,
    Lease,
    MetadataStore,
    WatchEvent,
    metadata_attempts_exhausted,
)

log = structlog.get_logger(__name__)

UNDERREPLICATED_PREFIX = "/underreplicated/"
LOCKS_PREFIX = "/underreplication/locks/"
DISABLE_KEY = "/underreplication/disable"
CONTROL_PREFIX = "/underreplication/control/"
LOST_BOOKIE_DELAY_KEY = CONTROL_PREFIX + "lost_bookie_delay"
AUDIT_REQUEST_KEY = CONTROL_PREFIX + "audit_request"
AUDITOR_KEY = "/auditor"
MAX_LOST_BOOKIE_DELAY_SECONDS = 7 * 24 * 3600.0  # A week: longer is a typo, not a policy.
# Bad records a manager remembers having reported (key -> version), so that each is logged once,
# not at every scan; past this many the oldest is forgotten (and reported again if still there).
MAX_REPORTED_BAD_RECORDS = 1024

_bad_records_counters: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = (
    weakref.WeakKeyDictionary()
)


def bad_records_counter(registry: CollectorRegistry = REGISTRY) -> Counter:
    """`bkaio_underreplication_bad_records_total` in `registry` (created on first use: the
    managers of several stores of a process count in one)."""
    counter = _bad_records_counters.get(registry)
    if counter is None:
        counter = Counter(
            "bkaio_underreplication_bad_records",
            "Under-replication records (/underreplicated/<ledger>) that do not decode, skipped "
            "by the listing until an operator deletes them; each key and version counted once",
            registry=registry,
        )
        _bad_records_counters[registry] = counter
    return counter


@dataclass(frozen=True, slots=True)
class UnderreplicatedLedger:
    ledger_id: int
    missing_bookies: tuple[str, ...]  # Move the ledger's fragments off these.
    ctime_ms: int  # When the ledger was first marked (kept across merges): the mark's age.
    version: int
    # Of `missing_bookies`, those an operator asked to move off although they may be alive
    # (`recover --force`): an audit never drops them as "back again".
    forced_bookies: tuple[str, ...] = ()
    # Live bookies whose fragments lack entries (the ledger check): filled in place.
    incomplete_bookies: tuple[str, ...] = ()
    # The version of the caller's lock when `claim` returned the record (0 otherwise): what
    # `release` and `complete` delete, and nothing else.
    lock_version: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "ledger_id": self.ledger_id,
            "missing_bookies": list(self.missing_bookies),
            "forced_bookies": list(self.forced_bookies),
            "incomplete_bookies": list(self.incomplete_bookies),
            "ctime_ms": self.ctime_ms,
        }


@dataclass(frozen=True, slots=True)
class BadUnderreplicationRecord:
    """A key under /underreplicated/ whose record does not decode: left alone (the listing
    skips it) until an operator deletes it."""

    key: str
    version: int
    error: str  # What is wrong with it.


@dataclass(frozen=True, slots=True)
class MarkResult:
    """What one `mark` did: the record as stored now, and whether it is new or grew."""

    record: UnderreplicatedLedger
    created: bool  # The ledger was not marked before.
    changed: bool  # The stored record changed (created, or new bookies merged in).


def _ur_key(ledger_id: int) -> str:
    assert ledger_id >= 0, ledger_id
    return f"{UNDERREPLICATED_PREFIX}{ledger_id:020d}"


def _lock_key(ledger_id: int) -> str:
    return f"{LOCKS_PREFIX}{ledger_id:020d}"


def _encode_mark(
    missing: Iterable[str], ctime_ms: int, forced: Iterable[str], incomplete: Iterable[str]
) -> bytes:
    packed: bytes = msgpack.packb(
        {
            "missing_bookies": list(missing),
            "ctime_ms": ctime_ms,
            "forced_bookies": list(forced),
            "incomplete_bookies": list(incomplete),
        }
    )
    return packed


def _bookie_ids(record: dict[object, object], field: str) -> tuple[str, ...]:
    value = record.get(field, [])
    if not isinstance(value, list) or not all(isinstance(b, str) for b in value):
        raise TypeError(f"{field} must be a list of bookie ids, not {value!r}")
    return tuple(value)


def decodes_as_mark(key: str, value: bytes) -> bool:
    """Whether `value` under `key` is a mark `list` yields (a bad record is not)."""
    try:
        _decode(KeyValue(key, value, version=0, create_revision=0, lease=0))
    except InvalidMetadataError:
        return False
    return True


def _decode(kv: KeyValue) -> UnderreplicatedLedger:
    """The record under `kv`; InvalidMetadataError naming the key when it is not one (a key
    that is not `_ur_key` of a ledger id, bytes that are not msgpack, fields of wrong types)."""
    suffix = kv.key[len(UNDERREPLICATED_PREFIX) :]
    if not (suffix.isascii() and suffix.isdigit()) or kv.key != _ur_key(int(suffix)):
        raise InvalidMetadataError(
            f"under-replication record {kv.key}: the key does not end in a 20-digit ledger id"
        )
    try:
        record = msgpack.unpackb(kv.value, raw=False)
        if not isinstance(record, dict):
            raise TypeError(f"a map was expected, not {type(record).__name__}")
        ctime_ms = record["ctime_ms"]
        if type(ctime_ms) is not int:
            raise TypeError(f"ctime_ms must be an integer, not {ctime_ms!r}")
        if "missing_bookies" not in record:
            raise KeyError("missing_bookies")
        return UnderreplicatedLedger(
            int(suffix),
            _bookie_ids(record, "missing_bookies"),
            ctime_ms,
            kv.version,
            _bookie_ids(record, "forced_bookies"),
            _bookie_ids(record, "incomplete_bookies"),
        )
    except (ValueError, KeyError, TypeError, msgpack.ExtraData) as error:
        raise InvalidMetadataError(f"under-replication record {kv.key}: {error!r}") from None


def check_lost_bookie_delay(seconds: float) -> float:
    """`seconds` if it is a usable lost-bookie delay; InvalidArgumentError otherwise."""
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_LOST_BOOKIE_DELAY_SECONDS:
        raise InvalidArgumentError(
            f"lost bookie delay {seconds!r} s must be a number in [0, "
            f"{MAX_LOST_BOOKIE_DELAY_SECONDS:.0f}]"
        )
    return float(seconds)


class UnderReplicationManager:
    def __init__(self, store: MetadataStore, registry: CollectorRegistry = REGISTRY) -> None:
        """`registry`: where bad records are counted (the metrics page of the process)."""
        self._store = store
        self._reported_bad: OrderedDict[str, int] = OrderedDict()  # key -> version logged
        self._bad_records = bad_records_counter(registry)

    async def mark(
        self,
        ledger_id: int,
        bookies: Iterable[str],
        *,
        forced: bool = False,
        incomplete: bool = False,
    ) -> MarkResult:
        """Record that `ledger_id` lost copies on `bookies` (merged with earlier marks).
        `forced`: an operator asked to move off them even if they are alive. `incomplete`:
        they are alive but lack entries of their fragments; fill them in place. At most
        MAX_METADATA_ATTEMPTS compare-and-swaps (each lost to another writer reads and merges
        again), then MetadataError, the mark as it was: the auditor or operator marks it again
        later; MetadataOutcomeUnknownError when the store lost every answer of one.
        InvalidMetadataError (reported as `list` does) when the ledger's record does not
        decode: nothing is merged into it or written over it; an operator deletes it."""
        added = set(bookies)
        key = _ur_key(ledger_id)
        for _attempt in range(MAX_METADATA_ATTEMPTS):
            kv = await self._store.get(key)
            try:
                old = None if kv is None else _decode(kv)
            except InvalidMetadataError as error:
                assert kv is not None
                self._report_bad(kv, str(error))
                raise
            missing = set(old.missing_bookies if old else ())
            forced_set = set(old.forced_bookies if old else ())
            incomplete_set = set(old.incomplete_bookies if old else ())
            if incomplete:
                incomplete_set |= added
            else:
                missing |= added
                if forced:
                    forced_set |= added
            new = (tuple(sorted(missing)), tuple(sorted(forced_set)), tuple(sorted(incomplete_set)))
            if old is not None and new == (
                old.missing_bookies,
                old.forced_bookies,
                old.incomplete_bookies,
            ):
                return MarkResult(old, created=False, changed=False)
            ctime_ms = old.ctime_ms if old else now_ms()
            try:
                version = await compare_and_swap_resolved(
                    self._store,
                    key,
                    _encode_mark(new[0], ctime_ms, new[1], new[2]),
                    expected_version=0 if kv is None else kv.version,
                )
            except MetadataVersionError:
                continue  # Marked concurrently: read and merge again.
            record = UnderreplicatedLedger(ledger_id, new[0], ctime_ms, version, new[1], new[2])
            return MarkResult(record, created=old is None, changed=True)
        raise metadata_attempts_exhausted(f"ledger {ledger_id}", "marking it under-replicated")

    async def narrow(
        self,
        record: UnderreplicatedLedger,
        still_missing: Collection[str],
        still_incomplete: Collection[str],
    ) -> bool:
        """Keep only the record's bookies still missing and still incomplete; drop the mark
        when none is left.

        Compare-and-swap on the record's version: False (nothing written) when it changed
        since it was read, so a concurrent mark is never lost. A lost answer is resolved by
        reading the record back (bkaio/meta/conditional.py)."""
        keep = tuple(b for b in record.missing_bookies if b in still_missing)
        keep_incomplete = tuple(b for b in record.incomplete_bookies if b in still_incomplete)
        if keep == record.missing_bookies and keep_incomplete == record.incomplete_bookies:
            return True
        key = _ur_key(record.ledger_id)
        try:
            if not keep and not keep_incomplete:
                await delete_resolved(self._store, key, expected_version=record.version)
            else:
                forced = [b for b in record.forced_bookies if b in keep]
                await compare_and_swap_resolved(
                    self._store,
                    key,
                    _encode_mark(keep, record.ctime_ms, forced, keep_incomplete),
                    expected_version=record.version,
                )
        except MetadataVersionError:
            return False
        return True

    async def get(self, ledger_id: int) -> UnderreplicatedLedger | None:
        kv = await self._store.get(_ur_key(ledger_id))
        return None if kv is None else _decode(kv)

    async def list(
        self, *, bad: list[BadUnderreplicationRecord] | None = None
    ) -> AsyncIterator[UnderreplicatedLedger]:
        """Every marked ledger, by id. A record that does not decode is skipped (appended to
        `bad` when given), not fatal: one corrupt key must not stop every worker and audit, as
        BookKeeper's manager logs and skips a node it cannot parse. It is logged at ERROR and
        counted once per key and version; nothing here deletes it (an operator does)."""
        async for kv in self._store.iterate_prefix(UNDERREPLICATED_PREFIX):
            try:
                record = _decode(kv)
            except InvalidMetadataError as error:
                self._report_bad(kv, str(error))
                if bad is not None:
                    bad.append(BadUnderreplicationRecord(kv.key, kv.version, str(error)))
                continue
            yield record

    def _report_bad(self, kv: KeyValue, error: str) -> None:
        if self._reported_bad.get(kv.key) == kv.version:
            self._reported_bad.move_to_end(kv.key)
            return
        self._reported_bad[kv.key] = kv.version
        if len(self._reported_bad) > MAX_REPORTED_BAD_RECORDS:
            self._reported_bad.popitem(last=False)
        self._bad_records.inc()
        log.error(
            "underreplication_bad_record_skipped",
            key=kv.key,
            version=kv.version,
            error=error,
            action="skipped by autorecovery until deleted; inspect and delete the key",
        )

    async def locked(self) -> set[int]:
        """Ids of the ledgers a worker (or an admin command) holds the lock of now."""
        return {
            int(kv.key[len(LOCKS_PREFIX) :])
            async for kv in self._store.iterate_prefix(LOCKS_PREFIX, keys_only=True)
        }

    async def lock(self, ledger_id: int, lease: Lease, *, owner: str = "") -> int | None:
        """Take the ledger's lock, bound to `lease`, marked or not: a worker's claim, or a
        bookie's garbage collection keeping replicators off a ledger while it deletes it. The
        lock's version (what `release` checks), None if someone holds it.

        A take whose answer the store lost is resolved by reading the lock back: a lock left
        unknown under the caller's live lease would keep every worker, the caller too, off the
        ledger for as long as that lease lives. Each take writes a value of its own (the owner
        and a random tag), so that the lock read back is known to be this take's, not one
        another task holding the same lease took meanwhile."""
        key = _lock_key(ledger_id)
        value = f"{owner} {secrets.token_hex(8)}".encode()
        try:
            return await compare_and_swap_resolved(
                self._store, key, value, expected_version=0, lease=lease
            )
        except MetadataVersionError:
            return None

    async def claim(
        self, ledger_id: int, lease: Lease, *, owner: str = ""
    ) -> UnderreplicatedLedger | None:
        """Take the lock on one under-replicated ledger; None if it is locked or not listed.
        The lock goes away with `lease` if the worker dies. The record returned carries the
        lock's version (`lock_version`)."""
        record = await self.get(ledger_id)
        if record is None:
            return None
        lock_version = await self.lock(ledger_id, lease, owner=owner)
        if lock_version is None:
            return None
        record = await self.get(ledger_id)  # The version the lock holder completes against.
        if record is None:
            await self.release(ledger_id, lock_version)
            return None
        return dataclasses.replace(record, lock_version=lock_version)

    async def claim_next(
        self, lease: Lease, *, owner: str = "", skip: Collection[int] = ()
    ) -> UnderreplicatedLedger | None:
        """Lock the first under-replicated ledger nobody holds and not in `skip` (ledgers the
        caller is backing off from); None if there is none."""
        locked = await self.locked()
        async for record in self.list():
            if record.ledger_id in locked or record.ledger_id in skip:
                continue
            claimed = await self.claim(record.ledger_id, lease, owner=owner)
            if claimed is not None:
                return claimed
        return None

    async def release(self, ledger_id: int, lock_version: int | None = None) -> bool:
        """Give the lock back without completing (another worker may take it); False when it
        was not there.

        With `lock_version` (`lock`'s, a claimed record's) only that lock is deleted: a holder
        whose lease lapsed before it noticed must not delete the lock another worker (or a
        bookie's garbage collection) took since; that one is left alone (False).

        A release whose answer the store lost is resolved by reading the lock back (gone:
        released; still that lock: released again), as `lock` does: left in place under the
        holder's live lease, it would keep every worker off the ledger."""
        key = _lock_key(ledger_id)
        try:
            return await delete_resolved(self._store, key, expected_version=lock_version)
        except MetadataVersionError:
            log.info("underreplication_lock_taken_over", ledger_id=ledger_id)
            return False

    async def complete(self, claimed: UnderreplicatedLedger) -> bool:
        """The ledger is fully replicated again: drop it from the queue and release the lock.
        False (and the record stays) if it was marked again since it was claimed. A lost answer
        is resolved by reading the record back; the lock is released whatever the delete did."""
        try:
            await delete_resolved(
                self._store, _ur_key(claimed.ledger_id), expected_version=claimed.version
            )
            done = True
        except MetadataVersionError:
            done = False
        finally:  # Also when the store lost every answer: the lock would keep workers off.
            await self.release(claimed.ledger_id, claimed.lock_version or None)
        return done

    async def is_enabled(self) -> bool:
        return await self._store.get(DISABLE_KEY) is None

    async def set_enabled(self, enabled: bool) -> None:
        if enabled:
            await self._store.delete(DISABLE_KEY)
        else:
            await self._store.put(DISABLE_KEY, b"")

    # --- controls the auditor follows -----------------------------------------------------

    async def lost_bookie_delay(self) -> float | None:
        """The delay an operator set (`lostbookierecoverydelay --set`); None: the config's."""
        kv = await self._store.get(LOST_BOOKIE_DELAY_KEY)
        if kv is None:
            return None
        try:
            return check_lost_bookie_delay(float(kv.value.decode()))
        except (ValueError, UnicodeDecodeError, InvalidArgumentError) as error:
            raise InvalidMetadataError(f"{LOST_BOOKIE_DELAY_KEY}: {error}") from None

    async def set_lost_bookie_delay(self, seconds: float | None) -> None:
        """Set the cluster-wide lost-bookie delay (None: back to each auditor's config)."""
        if seconds is None:
            await self._store.delete(LOST_BOOKIE_DELAY_KEY)
            return
        value = check_lost_bookie_delay(seconds)
        await self._store.put(LOST_BOOKIE_DELAY_KEY, repr(value).encode())

    async def request_audit(self) -> int:
        """Ask the elected auditor to audit now (it watches the key); the request's revision."""
        return await self._store.put(AUDIT_REQUEST_KEY, str(now_ms()).encode())

    def watch_controls(self, start_revision: int | None = None) -> AsyncIterator[WatchEvent]:
        """Changes to the delay and audit requests (for the auditor)."""
        return self._store.watch_prefix(CONTROL_PREFIX, start_revision=start_revision)


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
        # Bound to the lease in the store: etcd refuses a put under a lease it dropped ("lease
        # not found"), SQLite checks the lease's row (expired ones reaped first) in the write's
        # transaction; so the election needs no wait for an in-doubt lease. The elected
        # auditor's own writes are not bound: it waits for the lease's confirmation before each.
        # A lost answer is resolved by reading the key back: this bookie's id under this lease.
        try:
            await compare_and_swap_resolved(
                self._store, AUDITOR_KEY, bookie_id.encode(), expected_version=0, lease=lease
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
        # From the revision of the read, not the key's own version: an auditor elected long
        # ago holds a key whose version the store may have compacted away, and a watch from
        # there would fail at once (the candidate failing its election over and over).
        snapshot = await self._store.snapshot_prefix(AUDITOR_KEY)
        if not any(kv.key == AUDITOR_KEY for kv in snapshot.kvs):
            return
        events = self._store.watch_prefix(AUDITOR_KEY, start_revision=snapshot.revision + 1)
        async with contextlib.aclosing(events):
            async for event in events:
                if event.key == AUDITOR_KEY and event.kind is EventKind.DELETE:
                    return
        await asyncio.sleep(0)  # pragma: no cover - a watch only ends by raising
