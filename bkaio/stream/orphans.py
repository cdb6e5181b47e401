"""Orphan stream ledgers: ledgers whose custom metadata names a stream (`bkaio.stream`) but
which no segment of that stream's record names, so nothing would ever read or delete them.

A writer that crashes between creating its next ledger and the record's compare-and-swap
leaves one; so does a roll whose clean-up could not read the record, a Spark task or job whose
driver died before its commit (those carry `bkaio.spark.job` too), and every ledger of a stream
deleted while one of its ledgers could not be removed. A roll or a Spark job in flight also has
ledgers no record names yet, so only ledgers created more than `older_than_seconds` ago (by the
creation time in their metadata) are orphans.

`find_orphans` walks the cluster's ledger ids a page at a time and reads each one's metadata;
it keeps only the set of ledger ids each stream of the namespace names that it has seen.
`delete_orphans` re-reads the stream's record right before each delete and keeps a ledger the
record names by then (a compare-and-swap may have named it since the listing). It also keeps a
Spark task's ledger that its job's registry still lists: the job may still commit it, however
long it has run. A job that died leaves its registry behind, and its ledgers stay listed until
an operator removes that registry (`/spark/jobs/<job id>/`) after checking the job is gone.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from bkaio.errors import NoSuchLedgerError
from bkaio.stream.errors import InvalidStreamArgumentError
from bkaio.stream.segments import SPARK_JOB_KEY, SPARK_JOBS_PREFIX, STREAM_EPOCH_KEY, STREAM_KEY
from bkaio.stream.store import StreamStore, metadata_of, now_ms

if TYPE_CHECKING:
    from bkaio.ledger_client import BookKeeper

log = structlog.get_logger(__name__)

DEFAULT_ORPHAN_AGE_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class OrphanLedger:
    """A ledger tagged for a stream of the namespace that the stream's record does not name."""

    ledger_id: int
    stream: str  # The stream name within the namespace.
    epoch: int | None  # The writer epoch that created it (None: tag absent or unreadable).
    job: str | None  # The Spark job whose task created it, if one did.
    state: str  # The ledger's state: OPEN, IN_RECOVERY or CLOSED.
    bytes: int  # Its length once closed (0 while open).
    ctime_ms: int
    stream_exists: bool  # False: the stream is deleted (or never was).


@dataclass(frozen=True, slots=True)
class OrphanOutcome:
    """What `delete_orphans` did with one orphan: deleted, or kept and why."""

    orphan: OrphanLedger
    deleted: bool
    reason: str


def check_orphan_age(older_than_seconds: float) -> float:
    if not math.isfinite(older_than_seconds) or older_than_seconds < 0:
        raise InvalidStreamArgumentError(
            f"older_than_seconds must be a finite number >= 0, not {older_than_seconds!r}"
        )
    return older_than_seconds


async def _named_ledgers(store: StreamStore, namespace: str, stream: str) -> frozenset[int] | None:
    """The ledger ids the stream's record names now; None when there is no such stream."""
    meta = await store.find_stream(namespace, stream)
    if meta is None:
        return None
    return frozenset(segment.ledger_id for segment in meta.segments)


def _stream_of(namespace: str, custom: dict[str, bytes]) -> str | None:
    tag = custom.get(STREAM_KEY)
    if tag is None:
        return None
    ns, _, stream = tag.decode(errors="replace").partition("/")
    return stream if ns == namespace and stream else None


def _int_or_none(value: bytes | None) -> int | None:
    try:
        return None if value is None else int(value.decode())
    except ValueError:
        return None


async def find_orphans(
    bk: BookKeeper,
    namespace: str,
    *,
    older_than_seconds: float = DEFAULT_ORPHAN_AGE_SECONDS,
) -> AsyncIterator[OrphanLedger]:
    """Each ledger of `namespace`'s streams that no stream record names, created more than
    `older_than_seconds` ago, in ledger id order. NamespaceNotFoundError for no namespace."""
    check_orphan_age(older_than_seconds)
    store = StreamStore(metadata_of(bk))
    await store.get_namespace(namespace)  # NamespaceNotFoundError, naming it.
    cutoff_ms = now_ms() - int(older_than_seconds * 1000)
    named: dict[str, frozenset[int] | None] = {}
    async for ledger_id in bk.list_ledgers():  # Read a page of ids at a time.
        try:
            metadata = await bk.get_ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            continue  # Deleted since it was listed.
        stream = _stream_of(namespace, metadata.custom_metadata)
        if stream is None or metadata.ctime_ms > cutoff_ms:
            continue
        if stream not in named:
            named[stream] = await _named_ledgers(store, namespace, stream)
        ids = named[stream]
        if ids is not None and ledger_id in ids:
            continue
        job = metadata.custom_metadata.get(SPARK_JOB_KEY)
        yield OrphanLedger(
            ledger_id=ledger_id,
            stream=stream,
            epoch=_int_or_none(metadata.custom_metadata.get(STREAM_EPOCH_KEY)),
            job=None if job is None else job.decode(errors="replace"),
            state=metadata.state.name,
            bytes=metadata.length,
            ctime_ms=metadata.ctime_ms,
            stream_exists=ids is not None,
        )


async def delete_orphans(
    bk: BookKeeper, namespace: str, orphans: Iterable[OrphanLedger]
) -> AsyncIterator[OrphanOutcome]:
    """Delete each of `orphans` unless its stream's record, read again right before, names it
    now; one outcome per orphan, in order."""
    store = StreamStore(metadata_of(bk))
    registry = metadata_of(bk).store
    for orphan in orphans:
        ids = await _named_ledgers(store, namespace, orphan.stream)
        kept = None
        if ids is not None and orphan.ledger_id in ids:
            kept = "the stream's record names it now"
        elif orphan.job is not None:
            key = f"{SPARK_JOBS_PREFIX}{orphan.job}/{orphan.ledger_id}"
            if await registry.get(key) is not None:
                kept = f"Spark job {orphan.job} still lists it ({key}): it may commit it yet"
        if kept is not None:
            log.info("stream_orphan_kept", stream=f"{namespace}/{orphan.stream}",
                     ledger_id=orphan.ledger_id, reason=kept)  # fmt: skip
            yield OrphanOutcome(orphan, False, kept)
            continue
        try:
            await bk.delete_ledger(orphan.ledger_id)
        except NoSuchLedgerError:
            yield OrphanOutcome(orphan, False, "already deleted")
            continue
        log.info("stream_orphan_deleted", stream=f"{namespace}/{orphan.stream}",
                 ledger_id=orphan.ledger_id)  # fmt: skip
        yield OrphanOutcome(orphan, True, "named by no stream record")
