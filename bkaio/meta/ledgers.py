"""Ledger ids and ledger metadata records on top of any `MetadataStore`.

Owns the key layout `/ledgers/<20-digit id>` (zero-padded: lexical order is numeric order),
the id counter `/idgen`, and the create/get/update/delete/list/watch operations with their
error mapping. Driver-independent; must not import a driver.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import (
    InvalidArgumentError,
    MetadataError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from bkaio.meta.conditional import compare_and_swap_resolved, delete_resolved
from bkaio.meta.errors import LedgerExistsError, MetadataOutcomeUnknownError
from bkaio.meta.ledger_metadata import (
    MAX_LEDGER_ID,
    LedgerMetadata,
    deserialize,
    now_ms,
    serialize,
)
from bkaio.meta.store import (
    MAX_METADATA_ATTEMPTS,
    EventKind,
    MetadataStore,
    metadata_attempts_exhausted,
)

log = structlog.get_logger(__name__)

LEDGERS_PREFIX = "/ledgers/"
IDGEN_KEY = "/idgen"
FIRST_LEDGER_ID = 1
DEFAULT_ID_BLOCK = 1000


def check_ledger_id(ledger_id: object) -> int:
    """`ledger_id` when it is a ledger id: an int (not a bool) in [0, MAX_LEDGER_ID], else
    InvalidArgumentError. A real check, not an assert: ids come from callers (the client's
    open, delete and metadata calls) and asserts are gone under python -O."""
    if (
        not isinstance(ledger_id, int)
        or isinstance(ledger_id, bool)
        or not 0 <= ledger_id <= MAX_LEDGER_ID
    ):
        raise InvalidArgumentError(
            f"ledger id must be an int in [0, 2**63 - 1], got {ledger_id!r} "
            f"({type(ledger_id).__name__})"
        )
    return ledger_id


def ledger_key(ledger_id: int) -> str:
    return f"{LEDGERS_PREFIX}{check_ledger_id(ledger_id):020d}"


def ledger_id_of(key: str) -> int:
    assert key.startswith(LEDGERS_PREFIX), key
    return int(key[len(LEDGERS_PREFIX) :])


class LedgerIdGenerator:
    """Unique ledger ids across processes: each process CASes the counter `/idgen` forward by a
    block and hands the block out locally, so one store round trip serves `block_size` ids.

    Ids of one generator increase; ids of different generators interleave. Ids of a block not
    handed out before the process exits are skipped, never reused.
    """

    def __init__(self, store: MetadataStore, *, block_size: int = DEFAULT_ID_BLOCK) -> None:
        assert block_size > 0, block_size
        self._store = store
        self._block_size = block_size
        self._next_id = 0
        self._end_id = 0  # Exclusive end of the block held.
        self._lock = asyncio.Lock()

    async def next_id(self) -> int:
        if self._next_id >= self._end_id:
            async with self._lock:
                if self._next_id >= self._end_id:  # Another task may have refilled meanwhile.
                    self._next_id, self._end_id = await self._allocate_block()
        ledger_id = self._next_id
        self._next_id += 1
        return ledger_id

    async def _allocate_block(self) -> tuple[int, int]:
        contention = Backoff(0.001, 0.05, jitter=1.0)  # Full jitter: racers spread out.
        # Lost races are not counted: each means another allocator took a block (progress), and
        # many processes racing for blocks lose several in a row. Lost answers are (a store
        # that loses every one would be asked for ever).
        lost_answers = 0
        while True:
            current = await self._store.get(IDGEN_KEY)
            start = FIRST_LEDGER_ID if current is None else int(current.value)
            end = start + self._block_size
            if end > MAX_LEDGER_ID:
                raise MetadataError(f"ledger ids exhausted: the counter is at {start}")
            try:
                await self._store.compare_and_swap(
                    IDGEN_KEY,
                    str(end).encode(),
                    expected_version=0 if current is None else current.version,
                )
            except (MetadataVersionError, MetadataOutcomeUnknownError) as error:
                # Another process took this block (or our CAS may have: re-reading skips it).
                if isinstance(error, MetadataOutcomeUnknownError):
                    lost_answers += 1
                    if lost_answers == MAX_METADATA_ATTEMPTS:
                        raise metadata_attempts_exhausted(
                            f"ledger id counter {IDGEN_KEY}", "allocating a block of ids"
                        ) from None
                await asyncio.sleep(contention.next_delay())
                continue
            log.debug("ledger_id_block_allocated", first_ledger_id=start, end_ledger_id=end)
            return start, end


class LedgerManager:
    """Create, read, update (CAS), delete, list and watch ledger metadata."""

    def __init__(self, store: MetadataStore, id_generator: LedgerIdGenerator) -> None:
        self._store = store
        self._ids = id_generator

    async def create(self, metadata: LedgerMetadata) -> LedgerMetadata:
        """Store a new ledger. An unassigned id (-1) is allocated; a given id must be free
        (LedgerExistsError). Returns the stored record with its id, ctime and version."""
        if metadata.version != 0:
            raise MetadataVersionError(
                f"ledger {metadata.ledger_id}: create wants an unstored record (version 0),"
                f" got version {metadata.version}"
            )
        if metadata.ctime_ms == 0:
            metadata = metadata.replace(ctime_ms=now_ms())
        allocate = metadata.ledger_id < 0
        for _attempt in range(MAX_METADATA_ATTEMPTS):  # A new id each time: see below.
            if allocate:
                metadata = metadata.replace(ledger_id=await self._ids.next_id())
            key = ledger_key(metadata.ledger_id)
            try:
                version = await compare_and_swap_resolved(
                    self._store, key, serialize(metadata), expected_version=0
                )
            except MetadataVersionError:
                if allocate:  # Only someone creating ledgers with explicit ids can get here.
                    log.warning("ledger_id_taken", ledger_id=metadata.ledger_id)
                    continue
                raise LedgerExistsError(f"ledger {metadata.ledger_id} already exists") from None
            return metadata.with_version(version)
        raise metadata_attempts_exhausted(f"ledger {metadata.ledger_id}", "creating a ledger")

    async def next_id(self) -> int:
        """A fresh ledger id, for a client that needs the id before it writes the record (the
        ledger's master key, and so its password hash, depend on it)."""
        return await self._ids.next_id()

    async def get(self, ledger_id: int) -> LedgerMetadata:
        kv = await self._store.get(ledger_key(ledger_id))
        if kv is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
        return deserialize(kv.value, ledger_id=ledger_id, version=kv.version)

    async def exists(self, ledger_id: int) -> bool:
        return await self._store.get(ledger_key(ledger_id)) is not None

    async def update(self, metadata: LedgerMetadata) -> LedgerMetadata:
        """Replace the stored record if it is still at `metadata.version`.

        MetadataVersionError when another writer got there first (re-read and retry),
        NoSuchLedgerError when the ledger was deleted. A write whose outcome the store could
        not confirm (a connection lost mid-write) is resolved here by re-reading the key.
        """
        assert metadata.ledger_id >= 0, "update of a ledger that was never created"
        key = ledger_key(metadata.ledger_id)
        try:
            version = await compare_and_swap_resolved(
                self._store, key, serialize(metadata), expected_version=metadata.version
            )
        except MetadataVersionError as error:
            if metadata.version != 0 and await self._store.get(key) is None:
                raise NoSuchLedgerError(f"ledger {metadata.ledger_id} was deleted") from None
            raise MetadataVersionError(f"ledger {metadata.ledger_id}: {error}") from None
        return metadata.with_version(version)

    async def delete(self, ledger_id: int, *, expected_version: int | None = None) -> None:
        """NoSuchLedgerError if absent; MetadataVersionError if `expected_version` is stale
        (a lost answer of a versioned delete is resolved by reading the key back)."""
        key = ledger_key(ledger_id)
        if not await delete_resolved(self._store, key, expected_version=expected_version):
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")

    async def list_ids(
        self, *, start_after: int | None = None, page_size: int = 1000
    ) -> AsyncIterator[int]:
        """Every ledger id, ascending, read a page at a time (ids created meanwhile may or
        may not appear)."""
        after = None if start_after is None else ledger_key(start_after)
        while True:
            page = await self._store.list_prefix(
                LEDGERS_PREFIX, start_after=after, limit=page_size, keys_only=True
            )
            for kv in page:
                yield ledger_id_of(kv.key)
            if len(page) < page_size:
                return
            after = page[-1].key

    async def watch(self, ledger_id: int) -> AsyncIterator[LedgerMetadata | None]:
        """The current record, then each new version; None (and the end) once deleted."""
        key = ledger_key(ledger_id)
        # The record and the revision it was read at, in one read (no other key has this
        # fixed-width key as a prefix). The watch starts after that revision, not after the
        # record's own version: a record unchanged for long has a version the store may have
        # compacted away, and a watch from there would fail at once.
        snapshot = await self._store.snapshot_prefix(key)
        kv = next((kv for kv in snapshot.kvs if kv.key == key), None)
        if kv is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
        yield deserialize(kv.value, ledger_id=ledger_id, version=kv.version)
        events = self._store.watch_prefix(key, start_revision=snapshot.revision + 1)
        async with contextlib.aclosing(events):
            async for event in events:
                if event.key != key:
                    continue
                if event.kind is EventKind.DELETE:
                    yield None
                    return
                yield deserialize(event.value, ledger_id=ledger_id, version=event.revision)
