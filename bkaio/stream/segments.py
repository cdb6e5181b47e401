"""A stream's ledgers as the writer, the namespace and the Spark sink all handle them: the
password every stream ledger carries, the custom metadata that names its stream, sealing the
segment a crashed writer left open, removing a stream whole, and the bytes a namespace's
sealed segments hold.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import structlog

from bkaio.errors import BKError, MetadataError, MetadataVersionError, NoSuchLedgerError
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, metadata_attempts_exhausted
from bkaio.stream.model import Segment, StreamMeta
from bkaio.stream.store import StreamStore, now_ms

if TYPE_CHECKING:
    from bkaio.ledger_client import BookKeeper

log = structlog.get_logger(__name__)

STREAM_PASSWORD = b"bkaio-stream"  # Guards stream ledgers against stray ledger-API writers.
# Custom metadata keys of stream ledgers: the stream ("ns/stream"), the writer epoch that
# created the ledger, and (on a Spark task's ledger) the Spark job (bkaio/stream/orphans.py).
STREAM_KEY = "bkaio.stream"
STREAM_EPOCH_KEY = "bkaio.epoch"
SPARK_JOB_KEY = "bkaio.spark.job"
# The Spark sink's job registry: /spark/jobs/<job id>/<ledger id> for each ledger a job's tasks
# created, until the job commits or aborts (bkaio/spark/sink.py).
SPARK_JOBS_PREFIX = "/spark/jobs/"


async def seal_open_segment(bk: BookKeeper, meta: StreamMeta, where: str) -> StreamMeta:
    """`meta` with its open segment (if any) recovered and sealed; not yet written back.

    Recovering the ledger fences whoever still writes it, so its end can no longer move.
    """
    segment = meta.open_segment
    if segment is None:
        return meta
    try:
        handle = await bk.open_ledger(segment.ledger_id, password=STREAM_PASSWORD, recovery=True)
    except NoSuchLedgerError:
        # Created, named in the record, then deleted by hand: nothing can be read from it.
        log.warning("stream_segment_ledger_missing", stream=where, ledger_id=segment.ledger_id)
        sealed = segment.closed(-1, 0, now_ms())
    else:
        sealed = segment.closed(handle.last_entry_id, handle.metadata.length, now_ms())
    log.info(
        "stream_segment_recovered",
        stream=where,
        ledger_id=segment.ledger_id,
        last_seq=sealed.last_seq,
        bytes=sealed.bytes,
    )
    return replace(meta, segments=(*meta.segments[:-1], sealed))


async def remove_stream(
    bk: BookKeeper, store: StreamStore, namespace: str, stream: str
) -> StreamMeta | None:
    """Fence the writer, then delete the stream record, its ledgers and its cursors; the
    record as deleted (its open segment sealed), None when there was no stream. At most
    MAX_METADATA_ATTEMPTS deletions of the record, then MetadataError (kept whole)."""
    where = f"{namespace}/{stream}"
    for _attempt in range(MAX_METADATA_ATTEMPTS):
        meta = await store.find_stream(namespace, stream)
        if meta is None:
            return None
        sealed = await seal_open_segment(bk, meta, where)
        try:
            deleted = await store.delete_stream(namespace, stream, version=meta.version)
        except MetadataVersionError:
            continue
        except MetadataOutcomeUnknownError:
            # The store lost every answer (each one resolved below this). Landed unless the
            # record is still there: raising then would leave its ledgers and cursors behind
            # for good (a second call finds no stream to delete). Still there: the store gave
            # up, and the last copy may still land; a second call finishes the deletion.
            fresh = await store.find_stream(namespace, stream)
            if fresh is not None and fresh.ctime_ms == meta.ctime_ms:
                raise
            deleted = True
        if not deleted:
            return None  # Deleted by another since it was read: its ledgers are theirs to drop.
        break
    else:
        raise metadata_attempts_exhausted(f"stream {where}", "deleting its record")
    try:
        await delete_unnamed_ledgers(bk, sealed.segments, f"stream {where}: deleted")
    finally:
        await store.delete_cursors(namespace, stream)
    log.info("stream_deleted", stream=where, ledgers=len(sealed.segments))
    return sealed


async def delete_unnamed_ledgers(bk: BookKeeper, segments: tuple[Segment, ...], done: str) -> None:
    """Delete the ledgers of `segments`, which the stream record no longer names (`done` says
    what removed them). Nothing else would find them, so each is tried whatever the others
    did, and MetadataError names the ones left (gone already is fine)."""
    left: dict[int, BKError] = {}
    for segment in segments:
        try:
            await bk.delete_ledger(segment.ledger_id)
        except NoSuchLedgerError:
            pass
        except BKError as error:
            left[segment.ledger_id] = error
    if left:
        log.warning("stream_ledgers_left", stream=done, ledger_ids=sorted(left))
        first_id, first = next(iter(left.items()))
        raise MetadataError(
            f"{done}, but {len(left)} of its ledgers could not be deleted: "
            f"{', '.join(map(str, left))} (ledger {first_id}: {type(first).__name__}: "
            f"{first}); delete them with the ledger API"
        ) from first


def stream_ledger_metadata(namespace: str, stream: str, epoch: int) -> dict[str, bytes]:
    """Custom metadata on every stream ledger: lets an operator find orphans after a crash."""
    return {
        STREAM_KEY: f"{namespace}/{stream}".encode(),
        STREAM_EPOCH_KEY: str(epoch).encode(),
    }


async def namespace_sealed_bytes(store: StreamStore, namespace: str) -> int:
    """Bytes in the sealed segments of every stream of `namespace`."""
    total = 0
    for stream in await store.list_streams(namespace):
        meta = await store.find_stream(namespace, stream)
        if meta is not None:
            total += meta.sealed_bytes
    return total
