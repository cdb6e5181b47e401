"""Re-replication of one ledger away from a set of bookies (BookKeeper's ReplicationWorker
inner loop and BookKeeperAdmin.recoverBookieData, reference/bookkeeper.md 7.3-7.4).

For each fragment held by one of the bookies to move off:
1. pick a replacement with the placement policy (writable, outside the segment's ensemble);
2. copy the fragment's entries: read each from a surviving bookie of its write set, check its
   digest, and write the same bytes to the replacement with RECOVERY_ADD (acknowledged only
   once durable there); a failing replacement is swapped for another;
3. CAS the ledger metadata: the replacement takes the bookie's slot in that segment.
The open tail (last segment of a ledger not CLOSED) is never rewritten under a live writer:
the caller decides when to fence and close the ledger first (`recover_open_tail`), after a
grace period in which the writer can move off the bookie by itself (an ensemble change).
The caller holds the ledger's under-replication lock while this runs.
"""

from __future__ import annotations

import asyncio
import enum
import os
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from functools import partial

import structlog

from bkaio.errors import (
    BKError,
    MetadataVersionError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
)
from bkaio.ledger_client.quorum import write_set
from bkaio.ledger_client.recovery import LedgerRecovery
from bkaio.ledger_client.types import StoredCopy
from bkaio.meta import LedgerMetadata
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.protocol.digest import entry_digest

from .cluster import ClusterView, MasterKeys
from .concurrency import first_failure
from .fragments import (
    EntryUnreadableError,
    Fragment,
    ReplicationError,
    fragment_entries,
    fragments_on,
    replace_in_segment,
)
from .metrics import AutorecoveryMetrics

log = structlog.get_logger(__name__)

_REPLACEMENT_ATTEMPTS = 3  # Replacements tried per fragment before giving up for now.
_READERS = 32  # Entry-by-entry reads in flight per fragment (E > Qw).


class Outcome(enum.Enum):
    DONE = "done"  # No fragment of the ledger is on the bookies any more.
    DEFERRED = "deferred"  # Only the open tail is left, waiting for its writer or a recovery.
    DELETED = "deleted"  # The ledger was deleted meanwhile.


@dataclass(frozen=True, slots=True)
class LedgerReplication:
    """What one `replicate_ledger` call did."""

    ledger_id: int
    outcome: Outcome
    fragments: int
    entries: int
    bytes: int
    recovered: bool  # The open ledger was fenced and closed first.
    seconds: float


class _ReplacementFailed(BKError):
    """The replacement bookie refused or lost an add: try another one."""


def _digest_ok(metadata: LedgerMetadata, copy: StoredCopy) -> bool:
    expected = entry_digest(metadata.ledger_id, copy.entry_id, copy.lac, copy.length, copy.payload)
    return expected == copy.digest


class _CopySink:
    """RECOVERY_ADDs of copied entries to one replacement bookie, at most `window` in flight.

    `write` waits for room; the first refused add fails every later `write` and `drain` with
    _ReplacementFailed. Answers arriving after the copy was given up only update counters.
    """

    def __init__(
        self,
        view: ClusterView,
        ledger_id: int,
        replacement: str,
        key: bytes,
        window: int,
        metrics: AutorecoveryMetrics,
    ) -> None:
        self._view = view
        self._ledger_id = ledger_id
        self._replacement = replacement
        self._key = key
        self._metrics = metrics
        self._room = asyncio.Semaphore(window)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._error: _ReplacementFailed | None = None
        self.bytes = 0

    async def write(self, copy: StoredCopy) -> None:
        if self._error is not None:
            raise self._error
        await self._room.acquire()
        if self._error is not None:
            self._room.release()
            raise self._error
        self._in_flight += 1
        self._idle.clear()
        self._view.pool.add_entry(
            self._replacement,
            self._ledger_id,
            copy.entry_id,
            recovery=True,
            master_key=self._key,
            lac=copy.lac,
            length=copy.length,
            digest=copy.digest,
            payload=copy.payload,
            callback=partial(self._answered, copy.entry_id, len(copy.payload)),
        )

    def _answered(self, entry_id: int, size: int, error: BKError | None) -> None:
        self._room.release()
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()
        if error is None:
            self.bytes += size
            self._metrics.entries_replicated.inc()
            self._metrics.bytes_replicated.inc(size)
        elif self._error is None:
            self._error = _ReplacementFailed(
                f"{self._replacement} refused entry {entry_id} of ledger {self._ledger_id}: "
                f"{type(error).__name__}: {error}"
            )

    async def drain(self) -> None:
        """Wait until every add was answered; raise the first refusal."""
        await self._idle.wait()
        if self._error is not None:
            raise self._error

    def abandon(self) -> None:
        """The copy is over (done or failed): later answers change nothing that matters."""
        if self._error is None:
            self._error = _ReplacementFailed(f"copy to {self._replacement} abandoned")


class Replicator:
    def __init__(
        self,
        view: ClusterView,
        keys: MasterKeys,
        metrics: AutorecoveryMetrics,
        *,
        entries_in_flight: int = 256,
    ) -> None:
        assert entries_in_flight > 0, entries_in_flight
        self._view = view
        self._keys = keys
        self._metrics = metrics
        self._entries_in_flight = entries_in_flight

    def registered(self) -> set[str]:
        """Ids of the bookies registered now (writable or read-only)."""
        return self._view.registered()

    async def replicate_ledger(
        self, ledger_id: int, bookie_ids: Collection[str], *, recover_open_tail: bool
    ) -> LedgerReplication:
        """Move every fragment of `ledger_id` off `bookie_ids` (the open tail only after a
        fence-and-close, and only when `recover_open_tail`). Raises one ReplicationError (its
        `ledger_id` set; EntryUnreadableError when no copy of an entry is readable) when the
        ledger cannot be moved now: the caller retries later."""
        try:
            return await self._replicate(ledger_id, bookie_ids, recover_open_tail)
        except ReplicationError as error:
            error.ledger_id = ledger_id
            raise
        except BKError as error:
            raise ReplicationError(
                f"ledger {ledger_id}: {type(error).__name__}: {error}", ledger_id=ledger_id
            ) from error

    async def _replicate(
        self, ledger_id: int, bookie_ids: Collection[str], recover_open_tail: bool
    ) -> LedgerReplication:
        started = time.monotonic()
        targets = frozenset(bookie_ids)
        fragments = entries = moved_bytes = 0
        recovered = False
        ledgers = self._view.metadata.ledgers
        while True:
            try:
                metadata = await ledgers.get(ledger_id)
            except NoSuchLedgerError:
                outcome = Outcome.DELETED
                break
            held = fragments_on(metadata, targets)
            if not held:
                outcome = Outcome.DONE
                break
            if any(f.open_tail for f in held) and recover_open_tail and not recovered:
                await self._recover(metadata)
                recovered = True
                continue
            closed = [f for f in held if not f.open_tail]
            if not closed:
                outcome = Outcome.DEFERRED
                break
            copied, copied_bytes = await self._move_fragment(metadata, closed[0], targets)
            fragments += 1
            entries += copied
            moved_bytes += copied_bytes
        seconds = time.monotonic() - started
        if outcome is not Outcome.DEFERRED:
            self._metrics.ledger_seconds.observe(seconds)
        result = LedgerReplication(
            ledger_id, outcome, fragments, entries, moved_bytes, recovered, seconds
        )
        log.info(
            "ledger_replicated",
            ledger_id=ledger_id,
            outcome=outcome.value,
            fragments=fragments,
            entries=entries,
            bytes=moved_bytes,
            recovered=recovered,
            seconds=round(seconds, 3),
        )
        return result

    async def _recover(self, metadata: LedgerMetadata) -> None:
        """Fence and close an open ledger whose writer did not move off the lost bookie."""
        key = await self._keys.master_key(metadata)
        if key is None:
            # No live bookie ever recorded a key, so none holds an entry: fencing with a
            # throwaway key still stops the writer (its adds become UNAUTHORIZED there).
            key = os.urandom(32)
        log.info("open_ledger_recovery", ledger_id=metadata.ledger_id)
        await LedgerRecovery(self._view.context, metadata, key).run()
        self._metrics.ledgers_recovered.inc()

    async def _move_fragment(
        self, metadata: LedgerMetadata, fragment: Fragment, targets: frozenset[str]
    ) -> tuple[int, int]:
        """Copy `fragment` to a replacement and swap it into the metadata; (entries, bytes)."""
        entry_ids = list(fragment_entries(fragment, metadata.ensemble_size, metadata.write_quorum))
        key = await self._keys.master_key(metadata) if entry_ids else None
        if entry_ids and key is None:
            raise ReplicationError(
                f"ledger {metadata.ledger_id}: entries {entry_ids[0]}..{entry_ids[-1]} of "
                f"{fragment.bookie_id} must be copied but no live bookie knows the ledger's key"
            )
        refused: set[str] = set()
        for _ in range(_REPLACEMENT_ATTEMPTS):
            try:
                replacement = self._view.placement.replace_bookie(
                    self._view.bookies,
                    fragment.ensemble,
                    fragment.bookie_index,
                    metadata.write_quorum,
                    exclude={*targets, *refused},
                )
            except NotEnoughBookiesError as error:
                raise ReplicationError(
                    f"ledger {metadata.ledger_id}: no replacement for {fragment.bookie_id} in "
                    f"the segment at entry {fragment.first_entry_id}: {error}"
                ) from None
            try:
                copied_bytes = await self._copy_entries(
                    metadata, fragment, entry_ids, replacement, key or b"", targets
                )
            except _ReplacementFailed as error:
                log.warning(
                    "replacement_bookie_failed",
                    ledger_id=metadata.ledger_id,
                    bookie_id=replacement,
                    error=str(error),
                )
                refused.add(replacement)
                continue
            await self._swap(metadata.ledger_id, fragment, replacement)
            self._metrics.fragments_replicated.inc()
            log.info(
                "fragment_replicated",
                ledger_id=metadata.ledger_id,
                first_entry_id=fragment.first_entry_id,
                last_entry_id=fragment.last_entry_id,
                from_bookie=fragment.bookie_id,
                to_bookie=replacement,
                entries=len(entry_ids),
            )
            return len(entry_ids), copied_bytes
        raise ReplicationError(
            f"ledger {metadata.ledger_id}: replacements {sorted(refused)} for "
            f"{fragment.bookie_id} all failed"
        )

    async def _copy_entries(
        self,
        metadata: LedgerMetadata,
        fragment: Fragment,
        entry_ids: list[int],
        replacement: str,
        key: bytes,
        targets: frozenset[str],
    ) -> int:
        """Copy `entry_ids` to `replacement`, `entries_in_flight` adds at a time; the payload
        bytes copied. Reads by range where every bookie of the segment holds every entry
        (E == Qw), else entry by entry. The first failure stops the copy and is raised alone:
        EntryUnreadableError (no copy of an entry), _ReplacementFailed (the target refused)."""
        sink = _CopySink(
            self._view, metadata.ledger_id, replacement, key, self._entries_in_flight, self._metrics
        )
        try:
            if metadata.ensemble_size == metadata.write_quorum:
                await self._copy_by_range(metadata, fragment, entry_ids, targets, sink)
            else:
                await self._copy_by_entry(metadata, fragment, entry_ids, targets, sink)
            await sink.drain()
        finally:
            sink.abandon()
        return sink.bytes

    def _sources(
        self, fragment: Fragment, indexes: Iterable[int], targets: frozenset[str]
    ) -> list[str]:
        """Bookies to read the fragment's entries from: live ones first; the bookie being moved
        off, when it is still up (decommission, `recover --force`), as the last resort."""
        registered = self._view.registered()
        sources = [
            fragment.ensemble[i]
            for i in indexes
            if i != fragment.bookie_index and fragment.ensemble[i] not in targets
        ]
        sources.sort(key=lambda bookie_id: bookie_id not in registered)
        if fragment.bookie_id in registered:
            sources.append(fragment.bookie_id)
        return sources

    async def _copy_by_range(
        self,
        metadata: LedgerMetadata,
        fragment: Fragment,
        entry_ids: list[int],
        targets: frozenset[str],
        sink: _CopySink,
    ) -> None:
        """E == Qw: the fragment is one run of ids every other bookie holds too. READ_RANGE
        batches from the first source that answers; an entry no range brought is read alone
        (with fail-over), then ranges go on after it."""
        if not entry_ids:
            return
        assert entry_ids == list(range(entry_ids[0], entry_ids[-1] + 1)), "E == Qw: a run"
        sources = self._sources(fragment, range(metadata.ensemble_size), targets)
        max_bytes = self._view.client_config.read_batch_bytes
        pool = self._view.pool
        last = entry_ids[-1]
        next_id = entry_ids[0]
        while next_id <= last:
            batch: list[StoredCopy] = []
            for source in sources:
                try:
                    answer = await pool.read_range(
                        source,
                        metadata.ledger_id,
                        next_id,
                        min(last - next_id + 1, self._entries_in_flight),
                        max_bytes,
                    )
                except BKError:
                    continue  # Down, or lacks `next_id`: the next source, then one by one.
                for copy in answer:
                    if copy.entry_id != next_id + len(batch) or not _digest_ok(metadata, copy):
                        break
                    batch.append(copy)
                if batch:
                    break
            if not batch:
                batch = [await self._read_copy(metadata, fragment, next_id, targets)]
            for copy in batch:
                await sink.write(copy)
            next_id += len(batch)

    async def _copy_by_entry(
        self,
        metadata: LedgerMetadata,
        fragment: Fragment,
        entry_ids: list[int],
        targets: frozenset[str],
        sink: _CopySink,
    ) -> None:
        """E > Qw: each bookie holds a stripe, so entries are read one by one, a window of them
        at once (each from a surviving bookie of its own write set)."""
        pending: Iterator[int] = iter(entry_ids)

        async def copy_some() -> None:
            for entry_id in pending:  # Shared iterator: each entry goes to one reader.
                await sink.write(await self._read_copy(metadata, fragment, entry_id, targets))

        readers = min(_READERS, max(1, len(entry_ids)))
        await first_failure([copy_some() for _ in range(readers)])

    async def _read_copy(
        self, metadata: LedgerMetadata, fragment: Fragment, entry_id: int, targets: frozenset[str]
    ) -> StoredCopy:
        """A digest-valid copy of the entry from a surviving bookie of its write set."""
        indexes = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
        sources = self._sources(fragment, indexes, targets)
        failures: list[str] = []
        for source in sources:
            try:
                copy = await self._view.pool.read_entry(source, metadata.ledger_id, entry_id)
            except BKError as error:
                failures.append(f"{source}: {type(error).__name__}")
                continue
            if copy.entry_id != entry_id or not _digest_ok(metadata, copy):
                log.warning(
                    "replica_bad_digest",
                    ledger_id=metadata.ledger_id,
                    entry_id=entry_id,
                    bookie_id=source,
                )
                failures.append(f"{source}: bad digest")
                continue
            return copy
        raise EntryUnreadableError(
            f"ledger {metadata.ledger_id}: entry {entry_id} is readable from none of "
            f"{sources or 'its write set (every other bookie of it is being moved off)'}"
            f"{f' ({failures})' if failures else ''}",
            ledger_id=metadata.ledger_id,
            entry_id=entry_id,
        )

    async def _swap(self, ledger_id: int, fragment: Fragment, replacement: str) -> None:
        """CAS `replacement` into the fragment's slot (re-read and retry on a race)."""
        ledgers = self._view.metadata.ledgers
        while True:
            try:
                current = await ledgers.get(ledger_id)
            except NoSuchLedgerError:
                return
            updated = replace_in_segment(
                current,
                fragment.first_entry_id,
                fragment.bookie_index,
                fragment.bookie_id,
                replacement,
            )
            if updated is None:
                return  # Moved by someone else meanwhile; our copy is collected by GC.
            try:
                await ledgers.update(updated)
            except (MetadataVersionError, MetadataOutcomeUnknownError):
                continue  # The writer changed its ensemble (or we do not know): re-read.
            return
