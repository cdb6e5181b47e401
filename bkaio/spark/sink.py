"""The sink's commit protocol: private ledgers per task, published atomically by the driver.

Each Spark task appends its rows to a ledger of its own (created lazily, so an empty task
creates none), closes (seals) it and reports `(ledger_id, last_entry_id, bytes)`. Until the
driver publishes them, those ledgers are invisible: no stream record names them. A task that
fails deletes its own ledger before re-raising; `abort` deletes whatever the successful tasks
reported, and every ledger the job registry names, except those the stream record names (a
commit that failed after its CAS landed is aborted too); first it fences any CAS of the commit
still on its way (`fence_late_writes`), so what it deletes can never be named later. A task
still running when its job is aborted (Spark cancels it, and may start it late) can register
its ledger after the abort read the registry: so the abort first leaves a tombstone, and a task
that finds it right after registering deletes its ledger and fails. A task killed outright
between creating its ledger and that check leaves an unnamed ledger behind, tagged with
`bkaio.spark.job` in its custom metadata so an operator (or GC) can find it. Readers never see
any of it.

`publish` appends the sealed ledgers as closed segments at the end of the stream in one
compare-and-swap of the stream record, in task order (a missing stream is created empty
first). Like `open_writer`, it first recovers and seals the stream's open segment and bumps the
writer epoch, so a live `StreamWriter` on the same stream is fenced: a stream has one writer at
a time, and a committing Spark job is that writer for an instant.

Streaming sinks with a `sink_id` are idempotent per batch id: a marker under
`/spark/sinks/<ns>/<stream>/<id>` records the batch and its ledgers *before* the stream CAS,
and is marked done after it. A batch replayed after a driver crash finds the marker: if the
marked ledgers are already segments, the replay is dropped; if not, the first run's CAS is
fenced as an abort fences it (it may still land), then the old ledgers are deleted and the
batch is published. A batch id below the marker's is no replay (Spark re-runs
only a query's last batch): batch 0 is a new query reusing the sink id and fails; any other is
skipped as already written, with a WARNING (`_refuse_or_skip_older_batch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgpack
import structlog
from prometheus_client import Counter

from bkaio.errors import BKError, MetadataVersionError, NoSuchLedgerError
from bkaio.ledger_client import BookKeeper, LedgerHandle
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, metadata_attempts_exhausted
from bkaio.spark.errors import SparkJobAbortedError, SparkOptionError
from bkaio.spark.options import WriteOptions
from bkaio.stream.errors import InvalidStreamArgumentError
from bkaio.stream.model import Segment, SegmentState, StreamMeta
from bkaio.stream.namespace import Namespace
from bkaio.stream.opening import undo_if_namespace_closed
from bkaio.stream.segments import (
    SPARK_JOB_KEY,
    SPARK_JOBS_PREFIX,
    STREAM_PASSWORD,
    seal_open_segment,
    stream_ledger_metadata,
)
from bkaio.stream.store import StreamStore, metadata_of, now_ms

log = structlog.get_logger(__name__)

SINKS_PREFIX = "/spark/sinks/"
JOBS_PREFIX = SPARK_JOBS_PREFIX  # /spark/jobs/<job id>/<ledger id>: ledgers a job's tasks created.
JOB_METADATA_KEY = SPARK_JOB_KEY
# /spark/aborted/<job id>: the job was aborted. Bound to a lease that nobody keeps alive, so it
# expires on its own once the job's cancelled tasks are long gone.
ABORTED_PREFIX = "/spark/aborted/"
ABORTED_TOMBSTONE_SECONDS = 3600.0

STALE_BATCHES = Counter(
    "bkaio_spark_sink_stale_batches",
    "Streaming batches skipped because their batch id was below the last one published under "
    "their sinkId (a query restarted from an older checkpoint)",
)


@dataclass(frozen=True, slots=True)
class WrittenLedger:
    """What one task wrote: a sealed ledger holding entries 0..last_entry_id."""

    ledger_id: int
    last_entry_id: int
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Quorums:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int


async def resolve_quorums(bk: BookKeeper, options: WriteOptions) -> Quorums:
    """The options' quorums, defaulting to the namespace's (NamespaceNotFoundError if absent)."""
    settings = await StreamStore(metadata_of(bk)).get_namespace(options.namespace)
    quorums = Quorums(
        ensemble_size=options.ensemble_size or settings.ensemble_size,
        write_quorum=options.write_quorum or settings.write_quorum,
        ack_quorum=options.ack_quorum or settings.ack_quorum,
    )
    if not 1 <= quorums.ack_quorum <= quorums.write_quorum <= quorums.ensemble_size:
        raise InvalidStreamArgumentError(
            f"bkaio write to {options.full_name}: need ensembleSize ({quorums.ensemble_size}) "
            f">= writeQuorum ({quorums.write_quorum}) >= ackQuorum ({quorums.ack_quorum}) >= 1"
        )
    return quorums


class TaskLedgerWriter:
    """One task's private ledger. Methods run on the connector's loop."""

    def __init__(
        self, bk: BookKeeper, options: WriteOptions, quorums: Quorums, job_id: str
    ) -> None:
        self._bk = bk
        self._options = options
        self._quorums = quorums
        self._job_id = job_id
        self._handle: LedgerHandle | None = None

    @property
    def ledger_id(self) -> int | None:
        return None if self._handle is None else self._handle.ledger_id

    async def append(self, payloads: Sequence[bytes]) -> None:
        """Append `payloads` (pipelined) and wait until all are acknowledged."""
        if not payloads:
            return
        if self._handle is None:
            custom = stream_ledger_metadata(self._options.namespace, self._options.stream, 0)
            custom[JOB_METADATA_KEY] = self._job_id.encode()
            self._handle = await self._bk.create_ledger(
                ensemble_size=self._quorums.ensemble_size,
                write_quorum=self._quorums.write_quorum,
                ack_quorum=self._quorums.ack_quorum,
                password=STREAM_PASSWORD,
                custom_metadata=custom,
            )
            # Named before any entry goes in, so the driver finds the ledger even when this
            # task is killed before it can report or delete it.
            await register_task_ledger(self._bk, self._job_id, self._handle.ledger_id)
            if await job_aborted(self._bk, self._job_id):
                # The abort may have read the registry before this ledger was named in it.
                await self.discard()
                raise SparkJobAbortedError(
                    f"bkaio write to {self._options.full_name}: job {self._job_id} was aborted"
                )
        handle = self._handle
        acks: list[asyncio.Future[int]] = []
        try:
            for payload in payloads:
                # A chunk (batchEntries rows) may be larger than the handle's room for adds in
                # flight and queued (TooManyRequestsError past it): wait for acknowledgements.
                await handle.wait_for_capacity()
                acks.append(handle.append(payload))
        except BaseException:
            # The ledger failed (append raises its failure) or a row was refused: the acks
            # asked for fail with it or complete unawaited; their outcome is this raise.
            for ack in acks:
                ack.add_done_callback(_retrieve)
            raise
        await asyncio.gather(*acks)

    async def finish(self) -> WrittenLedger | None:
        """Seal the ledger; what to publish (None when the task wrote nothing)."""
        if self._handle is None:
            return None
        await self._handle.close()
        handle = self._handle
        return WrittenLedger(handle.ledger_id, handle.last_add_confirmed, handle.length)

    async def discard(self) -> None:
        """Delete the ledger (the task failed): nothing it wrote may ever become visible."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        with contextlib.suppress(BKError):
            await handle.close()
        await discard_ledgers(self._bk, [handle.ledger_id])
        with contextlib.suppress(BKError):
            await metadata_of(self._bk).store.delete(job_key(self._job_id, handle.ledger_id))


def _retrieve(ack: asyncio.Future[int]) -> None:
    if not ack.cancelled():
        ack.exception()


def job_key(job_id: str, ledger_id: int) -> str:
    return f"{JOBS_PREFIX}{job_id}/{ledger_id}"


async def register_task_ledger(bk: BookKeeper, job_id: str, ledger_id: int) -> None:
    await metadata_of(bk).store.put(job_key(job_id, ledger_id), b"")


async def mark_aborted(bk: BookKeeper, job_id: str) -> None:
    """The abort's first step: from now on a task of the job that registers a ledger finds
    this and deletes the ledger itself (`TaskLedgerWriter.append`)."""
    store = metadata_of(bk).store
    lease = await store.grant_lease(ABORTED_TOMBSTONE_SECONDS)
    await store.put(f"{ABORTED_PREFIX}{job_id}", b"", lease=lease)


async def job_aborted(bk: BookKeeper, job_id: str) -> bool:
    return await metadata_of(bk).store.get(f"{ABORTED_PREFIX}{job_id}") is not None


async def job_ledgers(bk: BookKeeper, job_id: str) -> list[int]:
    """Every ledger a task of `job_id` created and nobody has cleaned up yet."""
    prefix = f"{JOBS_PREFIX}{job_id}/"
    return [
        int(kv.key[len(prefix) :])
        async for kv in metadata_of(bk).store.iterate_prefix(prefix, keys_only=True)
    ]


async def finish_job(bk: BookKeeper, job_id: str, keep: Sequence[int]) -> None:
    """After a commit (`keep`: the published ledgers) or an abort (`keep` empty): delete every
    other ledger the job's tasks created (failed or killed attempts), then forget them all."""
    created = await job_ledgers(bk, job_id)
    kept = set(keep)
    await discard_ledgers(bk, [i for i in created if i not in kept])
    store = metadata_of(bk).store
    for ledger_id in created:
        with contextlib.suppress(BKError):
            await store.delete(job_key(job_id, ledger_id))


async def discard_ledgers(bk: BookKeeper, ledger_ids: Sequence[int]) -> None:
    for ledger_id in ledger_ids:
        try:
            await bk.delete_ledger(ledger_id)
        except NoSuchLedgerError:
            pass
        except BKError as error:  # GC finds it later by its job tag; the data stays unnamed.
            log.warning("spark_sink_discard_failed", ledger_id=ledger_id, error=str(error))


async def abort_job(
    bk: BookKeeper, options: WriteOptions, job_id: str, reported: Sequence[int]
) -> None:
    """Abort a job: delete the ledgers its tasks reported and every other one it registered,
    except those the stream record names. Spark aborts a job whose commit raised, also when
    the raise came after the stream CAS landed (a later clean-up step failed, or the CAS's
    reply was lost and the re-read failed): those ledgers are the stream's records now.

    A commit's CAS whose answer was lost may also land later than this (a store member that
    was paused or cut off forwards it when it comes back): before deleting anything, the abort
    fences such writes (`fence_late_writes`), so what it keeps and deletes is final. Raises
    (deleting nothing) when the stream record cannot be read or fenced."""
    await mark_aborted(bk, job_id)  # Before reading the registry.
    store = StreamStore(metadata_of(bk))
    stream = await store.find_stream(options.namespace, options.stream)
    unnamed = {*reported, *await job_ledgers(bk, job_id)} - _named(stream)
    if unnamed and stream is not None:
        stream = await fence_late_writes(store, options, stream)
    published = _named(stream)
    await discard_ledgers(bk, [i for i in reported if i not in published])
    await finish_job(bk, job_id, keep=sorted(published))


def _named(stream: StreamMeta | None) -> set[int]:
    return {s.ledger_id for s in stream.segments} if stream is not None else set()


async def fence_late_writes(
    store: StreamStore, options: WriteOptions, read: StreamMeta
) -> StreamMeta | None:
    """The stream record once no write sent before `read` was read can land any more.

    Every write of the record is a CAS on the version its sender read (`publish` creates a
    missing stream empty first, so the ledgers always go in under the version of an existing
    record), and versions only grow: a write still on its way was sent on `read.version` or
    an older one, and fails once the record is past it. So `read` is written back unchanged
    under a CAS on its version. When something else moved the record first (a late write of
    the commit, the stream's writer), the record as read again is past it too. A live
    `StreamWriter` meeting the new version reads the record again, finds its epoch and
    segment, and goes on. At most MAX_METADATA_ATTEMPTS writes (lost answers), then
    MetadataError."""
    namespace, stream = options.namespace, options.stream
    for _attempt in range(MAX_METADATA_ATTEMPTS):
        try:
            return await store.put_stream(namespace, stream, read)
        except MetadataVersionError:
            return await store.find_stream(namespace, stream)
        except MetadataOutcomeUnknownError:
            current = await store.find_stream(namespace, stream)
            if current is None or current.version != read.version:
                return current
    raise metadata_attempts_exhausted(
        f"stream {options.full_name}", "fencing a failed commit's writes before its abort"
    )


def appended(meta: StreamMeta, written: Sequence[WrittenLedger], ctime_ms: int) -> StreamMeta:
    """`meta` (no open segment) with `written` appended as closed segments, epoch bumped."""
    assert meta.open_segment is None, meta
    segments = list(meta.segments)
    next_seq = meta.end_seq_if_closed
    for item in written:
        assert item.last_entry_id >= 0, item
        segments.append(
            Segment(
                ledger_id=item.ledger_id,
                first_seq=next_seq,
                last_seq=next_seq + item.last_entry_id,
                state=SegmentState.CLOSED,
                ctime_ms=ctime_ms,
                closed_ms=ctime_ms,
                bytes=item.bytes,
            )
        )
        next_seq += item.last_entry_id + 1
    return replace(meta, epoch=meta.epoch + 1, segments=tuple(segments))


async def publish(bk: BookKeeper, options: WriteOptions, written: Sequence[WrittenLedger]) -> int:
    """Append `written` to the stream in one CAS; the first new seq.

    A missing stream is created empty first (`Namespace.create_stream`: its limits and
    checks), so the CAS that names the ledgers is always on an existing record's version and
    an abort can fence it when its answer was lost (`fence_late_writes`).

    NamespaceNotFoundError (NamespaceDeletingError) when the namespace is gone (being
    deleted), also when found once a record landed: a stream this publish created in a
    namespace being deleted, or any in one that is gone, is then removed whole, with the
    job's ledgers if the CAS named them (`undo_if_namespace_closed`, as for a stream writer's
    open); ledgers no record named are the abort's to delete."""
    store = StreamStore(metadata_of(bk))
    settings = await store.get_live_namespace(options.namespace)  # Clearly, if absent.
    where = options.full_name
    written = [w for w in written if w.last_entry_id >= 0]
    if not written:
        return -1  # Nothing to add: leave the stream (and its writer) alone.
    ids = {w.ledger_id for w in written}
    for _attempt in range(MAX_METADATA_ATTEMPTS):
        meta = await store.find_stream(options.namespace, options.stream)
        if meta is None:
            namespace = Namespace(bk, store, options.namespace, settings)
            try:
                meta = await namespace.create_stream(options.stream)
            except MetadataOutcomeUnknownError:
                continue  # The next round re-reads and sees whether it landed.
        if ids <= _named(meta):
            # A retried commit whose first attempt landed.
            await undo_if_namespace_closed(
                bk, store, options.namespace, options.stream, created=False
            )
            return -1
        meta = await seal_open_segment(bk, meta, where)
        target = appended(meta, written, now_ms())
        try:
            await store.put_stream(options.namespace, options.stream, target)
        except MetadataVersionError:
            continue
        except MetadataOutcomeUnknownError:
            continue  # The next round re-reads and sees whether it landed.
        # The stream existed before this CAS: one created meanwhile in a namespace being
        # deleted is the deletion's (its creation checked, so the listing finds it).
        await undo_if_namespace_closed(bk, store, options.namespace, options.stream, created=False)
        first_seq = meta.end_seq_if_closed
        log.info(
            "spark_sink_published",
            stream=where,
            ledgers=[w.ledger_id for w in written],
            first_seq=first_seq,
            records=sum(w.last_entry_id + 1 for w in written),
        )
        return first_seq
    raise metadata_attempts_exhausted(f"stream {where}", "adding the job's ledgers to it")


def marker_key(options: WriteOptions, sink_id: str) -> str:
    digest = hashlib.sha256(sink_id.encode()).hexdigest()[:32]
    return f"{SINKS_PREFIX}{options.namespace}/{options.stream}/{digest}"


async def publish_batch(
    bk: BookKeeper, options: WriteOptions, batch_id: int, written: Sequence[WrittenLedger]
) -> bool:
    """Publish one streaming batch exactly once per `options.sink_id` (see module doc).

    False when the batch had been published already (its new ledgers are then deleted).
    Without a sink id, publishes unconditionally (at least once).
    """
    if options.sink_id is None:
        await publish(bk, options, written)
        return True
    store = metadata_of(bk).store
    key = marker_key(options, options.sink_id)
    kv = await store.get(key)
    marker: dict[str, Any] = msgpack.unpackb(kv.value, raw=False) if kv is not None else {}
    marked_batch = int(marker.get("batch_id", -1))
    if marked_batch > batch_id:
        await discard_ledgers(bk, [w.ledger_id for w in written])
        _refuse_or_skip_older_batch(options, options.sink_id, batch_id, marked_batch)
        return False
    if marked_batch == batch_id and marker.get("done"):
        await discard_ledgers(bk, [w.ledger_id for w in written])
        log.info("spark_sink_batch_replayed", stream=options.full_name, batch_id=batch_id)
        return False
    if marked_batch == batch_id:
        streams = StreamStore(metadata_of(bk))
        stream = await streams.find_stream(options.namespace, options.stream)
        old_ids = [int(i) for i in marker.get("ledgers", [])]
        if old_ids and stream is not None and not set(old_ids) <= _named(stream):
            # The first run's CAS may still be on its way (its driver died waiting for the
            # reply): fenced before its ledgers are judged unpublished and deleted.
            stream = await fence_late_writes(streams, options, stream)
        segment_ids = _named(stream)
        if old_ids and set(old_ids) <= segment_ids:
            await discard_ledgers(bk, [w.ledger_id for w in written if w.ledger_id not in old_ids])
            await store.put(key, _pack_marker(batch_id, old_ids, done=True))
            return False
        await discard_ledgers(bk, [i for i in old_ids if i not in segment_ids])
    ids = [w.ledger_id for w in written if w.last_entry_id >= 0]
    await store.put(key, _pack_marker(batch_id, ids, done=False))
    await publish(bk, options, written)
    await store.put(key, _pack_marker(batch_id, ids, done=True))
    return True


def _refuse_or_skip_older_batch(
    options: WriteOptions, sink_id: str, batch_id: int, marked_batch: int
) -> None:
    """A batch id below the marker's. Spark re-runs at most the last batch of a query (the
    marker's), so this is not a replay of the same query: batch 0 is a new query (a reset
    checkpointLocation, or a sinkId another query used) and fails rather than have every batch
    dropped; any other id (an older checkpoint restored) is skipped as already written, as
    Spark's own file sink does, with a WARNING and a count."""
    where = f"bkaio write to {options.full_name}: sinkId/checkpointLocation {sink_id!r}"
    if batch_id == 0:
        raise SparkOptionError(
            f"{where} already published batch {marked_batch} of an earlier query, and this "
            "query starts at batch 0: its batches would all be dropped as already written; "
            "give a new query its own sinkId (or checkpointLocation)"
        )
    STALE_BATCHES.inc()
    log.warning(
        "spark_sink_batch_behind_marker",
        stream=options.full_name,
        sink_id=sink_id,
        batch_id=batch_id,
        last_batch_id=marked_batch,
        action="skipped as already written",
    )


def _pack_marker(batch_id: int, ledger_ids: list[int], *, done: bool) -> bytes:
    packed: bytes = msgpack.packb(
        {"batch_id": batch_id, "ledgers": ledger_ids, "done": done, "mtime_ms": now_ms()}
    )
    return packed
