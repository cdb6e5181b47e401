"""Copying one fragment's entries to one bookie: what re-replication and a bookie leaving
limbo both do.

`FragmentCopier.copy` reads each entry of the fragment from a surviving bookie of its write
set, checks its digest, and writes the same bytes to the destination with RECOVERY_ADD
(acknowledged only once durable there), `entries_in_flight` adds at a time. Reads:
- E == Qw (every bookie of the segment holds every entry): READ_RANGE batches from the first
  source that answers (`read_batch_bytes` of the client config, at most `entries_in_flight`
  entries each); an entry no range brought is read alone with fail-over, then ranges go on;
- E > Qw (each bookie holds a stripe): entry by entry, `_READERS` reads in flight.
The first failure stops the copy and is raised alone (never an ExceptionGroup):
EntryUnreadableError when no surviving source has a valid copy of an entry (each answered none,
or a bad digest, or is not registered: dead), EntrySourcesUnavailableError when a registered
source could not answer (timed out, busy, restarting, in limbo: it may hold a copy, so this is
transient), CopyRefusedError when the destination refused or lost an add.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial

import structlog

from bkaio.errors import BKError, NoSuchEntryError, NoSuchLedgerError
from bkaio.ledger_client.quorum import write_set
from bkaio.ledger_client.types import StoredCopy
from bkaio.meta import LedgerMetadata
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.records import record_fields, scan_records

from .cluster import ClusterView
from .concurrency import first_failure
from .fragments import (
    EntrySourcesUnavailableError,
    EntryUnreadableError,
    Fragment,
    fragment_entries,
)
from .metrics import AutorecoveryMetrics

log = structlog.get_logger(__name__)

_READERS = 32  # Entry-by-entry reads in flight per fragment (E > Qw).


class CopyRefusedError(BKError):
    """The destination bookie refused or lost an add (the caller may try another one)."""

    retriable = True


@dataclass(frozen=True, slots=True)
class CopyJob:
    """One fragment to copy, and where not to read it from."""

    metadata: LedgerMetadata
    fragment: Fragment
    destination: str
    key: bytes
    avoid: frozenset[str]  # Read these last, if at all (bookies being moved off, or dead).
    # Read from the fragment's own bookie and the other `avoid` bookies as the last resort
    # when they are registered (being drained, not lost); never for a bookie copying its own
    # fragments back.
    origin_readable: bool = True

    @property
    def entry_ids(self) -> list[int]:
        md = self.metadata
        return list(fragment_entries(self.fragment, md.ensemble_size, md.write_quorum))


def digest_ok(metadata: LedgerMetadata, copy: StoredCopy) -> bool:
    expected = entry_digest(metadata.ledger_id, copy.entry_id, copy.lac, copy.length, copy.payload)
    return expected == copy.digest


class _CopySink:
    """RECOVERY_ADDs of copied entries to one bookie, at most `window` in flight.

    `write` waits for room; the first refused add fails every later `write` and `drain` with
    CopyRefusedError. Answers arriving after the copy was given up only update counters.
    """

    def __init__(
        self,
        view: ClusterView,
        ledger_id: int,
        destination: str,
        key: bytes,
        window: int,
        metrics: AutorecoveryMetrics,
    ) -> None:
        self._view = view
        self._ledger_id = ledger_id
        self._destination = destination
        self._key = key
        self._metrics = metrics
        self._room = asyncio.Semaphore(window)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._error: CopyRefusedError | None = None
        self.entries = 0
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
            self._destination,
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
            self.entries += 1
            self.bytes += size
            self._metrics.entries_replicated.inc()
            self._metrics.bytes_replicated.inc(size)
        elif self._error is None:
            self._error = CopyRefusedError(
                f"{self._destination} refused entry {entry_id} of ledger {self._ledger_id}: "
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
            self._error = CopyRefusedError(f"copy to {self._destination} abandoned")


class FragmentCopier:
    def __init__(
        self, view: ClusterView, metrics: AutorecoveryMetrics, *, entries_in_flight: int = 256
    ) -> None:
        assert entries_in_flight > 0, entries_in_flight
        self._view = view
        self._metrics = metrics
        self._entries_in_flight = entries_in_flight

    async def copy(self, job: CopyJob) -> tuple[int, int]:
        """Copy the job's entries to its destination; (entries, payload bytes) copied."""
        entry_ids = job.entry_ids
        md = job.metadata
        sink = _CopySink(
            self._view,
            md.ledger_id,
            job.destination,
            job.key,
            self._entries_in_flight,
            self._metrics,
        )
        try:
            if md.ensemble_size == md.write_quorum:
                await self._copy_by_range(job, entry_ids, sink)
            else:
                await self._copy_by_entry(job, entry_ids, sink)
            await sink.drain()
        finally:
            sink.abandon()
        return sink.entries, sink.bytes

    def _sources(self, job: CopyJob, indexes: Iterable[int]) -> list[str]:
        """Bookies to read the fragment's entries from: live ones first; then, when they are
        still up and readable (a drain, a decommission), the bookies being moved off: the
        others of the write set, the fragment's own last."""
        fragment = job.fragment
        registered = self._view.registered()
        others = [fragment.ensemble[i] for i in indexes if i != fragment.bookie_index]
        sources = [bookie_id for bookie_id in others if bookie_id not in job.avoid]
        sources.sort(key=lambda bookie_id: bookie_id not in registered)
        if job.origin_readable:
            # Another bookie moved off in the same call (a decommissioned one beside a dead
            # one) may hold the only surviving copy of an entry whose write set is both: left
            # out, that entry was unreadable on every retry (BookKeeper reads any replica).
            sources += [b for b in others if b in job.avoid and b in registered]
            if fragment.bookie_id in registered:
                sources.append(fragment.bookie_id)
        return sources

    async def _copy_by_range(self, job: CopyJob, entry_ids: list[int], sink: _CopySink) -> None:
        """E == Qw: the fragment is one run of ids every other bookie holds too."""
        if not entry_ids:
            return
        assert entry_ids == list(range(entry_ids[0], entry_ids[-1] + 1)), "E == Qw: a run"
        md = job.metadata
        sources = self._sources(job, range(md.ensemble_size))
        max_bytes = self._view.client_config.read_batch_bytes
        pool = self._view.pool
        last = entry_ids[-1]
        next_id = entry_ids[0]
        while next_id <= last:
            batch: list[StoredCopy] = []
            for source in sources:
                try:
                    answer = await pool.read_entries(
                        source,
                        md.ledger_id,
                        next_id,
                        last,
                        max_count=min(last - next_id + 1, self._entries_in_flight),
                        max_bytes=max_bytes,
                    )
                except BKError:
                    continue  # Down, or in limbo: the next source, then one by one.
                # Digests checked by the scan; a run from `next_id` is taken, up to a gap.
                scan = scan_records(answer.records, md.ledger_id, next_id, 1, last)
                for entry_id, offset, payload in zip(
                    scan.entry_ids, scan.offsets, scan.payloads, strict=True
                ):
                    if entry_id != next_id + len(batch):
                        break
                    fields = record_fields(answer.records, offset)
                    batch.append(StoredCopy(entry_id, fields[2], fields[3], fields[4], payload))
                if batch:
                    break
            if not batch:
                batch = [await self._read_copy(job, next_id)]
            for copy in batch:
                await sink.write(copy)
            next_id += len(batch)

    async def _copy_by_entry(self, job: CopyJob, entry_ids: list[int], sink: _CopySink) -> None:
        """E > Qw: entries read one by one, a window of them at once (each from a surviving
        bookie of its own write set)."""
        pending: Iterator[int] = iter(entry_ids)

        async def copy_some() -> None:
            for entry_id in pending:  # Shared iterator: each entry goes to one reader.
                await sink.write(await self._read_copy(job, entry_id))

        readers = min(_READERS, max(1, len(entry_ids)))
        await first_failure([copy_some() for _ in range(readers)])

    async def _read_copy(self, job: CopyJob, entry_id: int) -> StoredCopy:
        """A digest-valid copy of the entry from a surviving bookie of its write set."""
        md = job.metadata
        sources = self._sources(job, write_set(entry_id, md.ensemble_size, md.write_quorum))
        failures: list[str] = []
        unanswered = 0  # Registered sources that could not say whether they hold a copy.
        for source in sources:
            try:
                copy = await self._view.pool.read_entry(source, md.ledger_id, entry_id)
            except BKError as error:
                failures.append(f"{source}: {type(error).__name__}")
                answered = isinstance(error, NoSuchEntryError | NoSuchLedgerError)
                if not answered and source in self._view.registered():
                    unanswered += 1  # Alive, and may hold a copy: ask again later.
                continue
            if copy.entry_id != entry_id or not digest_ok(md, copy):
                log.warning(
                    "replica_bad_digest",
                    ledger_id=md.ledger_id,
                    entry_id=entry_id,
                    bookie_id=source,
                )
                failures.append(f"{source}: bad digest")
                continue
            return copy
        if unanswered:
            raise EntrySourcesUnavailableError(
                f"ledger {md.ledger_id}: entry {entry_id} could not be read now: {unanswered} "
                f"registered bookie(s) of {sources} did not answer ({failures}); retried",
                ledger_id=md.ledger_id,
                entry_id=entry_id,
            )
        raise EntryUnreadableError(
            f"ledger {md.ledger_id}: entry {entry_id} is readable from none of "
            f"{sources or 'its write set (every other bookie of it is gone)'}"
            f"{f' ({failures})' if failures else ''}",
            ledger_id=md.ledger_id,
            entry_id=entry_id,
        )
