"""Opening a stream's writer, and the namespace check every stream creation makes.

Opening (BookKeeper's log-level rule, reference/bookkeeper.md 3.4; DistributedLog's writer):
read the stream record; if its last segment is still OPEN, recover that ledger (which fences
the previous writer: its adds fail with LedgerFencedError) and seal the segment at the agreed
end; create a new ledger; then CAS the record with the epoch bumped and the new segment
appended. A lost CAS means another writer got in first: its record is read again and its
segment fenced in turn, so the last opener wins and exactly one writer owns the stream.

No stream outlives its namespace. `delete_namespace` marks the namespace `deleting` before it
lists its streams; a writer's open (and `create_stream`, the Spark sink's publish) reads the
namespace again after its record landed. Either the listing comes after the record (and
removes the stream) or the read comes after the mark (and the one that created the stream
removes it itself and fails with NamespaceDeletingError): a stream whose creation lands after
the listing is never left behind. A stream that existed before is the deletion's: its creator
made the same check, so the listing found it or its creator removed it.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from bkaio.errors import BKError, MetadataVersionError
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, metadata_attempts_exhausted
from bkaio.stream.errors import NamespaceDeletingError, NamespaceNotFoundError
from bkaio.stream.model import NamespaceSettings, Segment, SegmentState, StreamMeta
from bkaio.stream.segments import (
    STREAM_PASSWORD,
    namespace_sealed_bytes,
    remove_stream,
    seal_open_segment,
    stream_ledger_metadata,
)
from bkaio.stream.store import StreamStore, now_ms
from bkaio.stream.writer import StreamWriter, WriterOptions

if TYPE_CHECKING:
    from bkaio.ledger_client import BookKeeper

log = structlog.get_logger(__name__)


async def undo_if_namespace_closed(
    bk: BookKeeper, store: StreamStore, namespace: str, stream: str, *, created: bool
) -> None:
    """Called once a record of `stream` landed. The namespace gone (NamespaceNotFoundError), or
    being deleted (NamespaceDeletingError) and the stream `created` by that record: the stream
    is removed whole (record, ledgers, cursors) and the error raised. A stream that existed
    before (taken over by a writer, appended to) in a namespace being deleted is left to the
    deletion, whose listing finds it: removing it here would delete its records even when that
    deletion, without force, then finds the namespace empty. See module doc."""
    try:
        await store.get_live_namespace(namespace)
    except NamespaceNotFoundError as error:
        if isinstance(error, NamespaceDeletingError) and not created:
            return
        where = f"{namespace}/{stream}"
        log.info("stream_removed_namespace_closed", stream=where, error=str(error))
        await remove_stream(bk, store, namespace, stream)
        raise


async def open_writer(
    bk: BookKeeper,
    store: StreamStore,
    namespace: str,
    stream: str,
    settings: NamespaceSettings,
    options: WriterOptions,
    *,
    on_create: Any = None,
) -> StreamWriter:
    """Fence any previous writer, seal its segment, and start a new one (see module doc).

    `on_create(stream)`, awaited before a new stream is created, may refuse it. Once the
    record landed, NamespaceNotFoundError when the namespace was deleted, and
    NamespaceDeletingError when it is being deleted and this open created the stream: the
    stream removed whole (`undo_if_namespace_closed`).
    """
    where = f"{namespace}/{stream}"
    for _attempt in range(MAX_METADATA_ATTEMPTS):  # Each CAS lost to a rival drops its ledger.
        meta = await store.find_stream(namespace, stream)
        if meta is None:
            if on_create is not None:
                await on_create(stream)
            meta = StreamMeta(ctime_ms=now_ms())
        meta = await seal_open_segment(bk, meta, where)
        epoch = meta.epoch + 1
        handle = await bk.create_ledger(
            ensemble_size=options.ensemble_size,
            write_quorum=options.write_quorum,
            ack_quorum=options.ack_quorum,
            password=STREAM_PASSWORD,
            custom_metadata=stream_ledger_metadata(namespace, stream, epoch),
        )
        first_seq = meta.end_seq_if_closed
        segment = Segment(handle.ledger_id, first_seq, -1, SegmentState.OPEN, now_ms())
        target = replace(meta, epoch=epoch, segments=(*meta.segments, segment))
        try:
            meta = await store.put_stream(namespace, stream, target)
        except MetadataVersionError:
            # Usually another writer won; but a copy of ours whose answer was lost may have
            # landed before the record changed again (a truncation): the new segment tells.
            current = await store.find_stream(namespace, stream)
            if not (
                current is not None and current.epoch == epoch and current.open_segment == segment
            ):
                log.info("stream_writer_open_raced", stream=where, epoch=epoch)
                with contextlib.suppress(BKError):
                    await bk.delete_ledger(handle.ledger_id)
                continue
            meta = current
        except MetadataOutcomeUnknownError:
            # The store lost every answer, and the last copy may still land naming the new
            # ledger: it is kept (an orphan at worst, found by `bkaio stream orphans`).
            log.warning("stream_open_ledger_kept", stream=where, ledger_id=handle.ledger_id)
            raise
        except BKError:
            # Not applied (a write whose outcome is unknown raises the error above): the
            # record does not name the new ledger, which would be left behind.
            with contextlib.suppress(BKError):
                await bk.delete_ledger(handle.ledger_id)
            raise
        created = target.version == 0
        await undo_if_namespace_closed(bk, store, namespace, stream, created=created)
        sealed_bytes = await namespace_sealed_bytes(store, namespace)
        log.info(
            "stream_writer_opened",
            stream=where,
            epoch=epoch,
            ledger_id=handle.ledger_id,
            first_seq=first_seq,
        )
        return StreamWriter(
            bk=bk,
            store=store,
            namespace=namespace,
            stream=stream,
            settings=settings,
            options=options,
            meta=meta,
            handle=handle,
            sealed_namespace_bytes=sealed_bytes,
        )
    raise metadata_attempts_exhausted(f"stream {where}", "opening a writer")
