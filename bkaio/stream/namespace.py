"""Namespaces: a tenant's streams, settings, quota; truncation, retention and cursors.

`open_namespace(bk, name, create=...)` is what `BookKeeper.namespace(...)` delegates to. A
`Namespace` only ever touches keys under its own name (`/namespaces/<ns>`, `/streams/<ns>/`,
`/cursors/<ns>/`), so operations on one namespace never see another's streams.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import structlog

from bkaio.errors import BKError, MetadataVersionError
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.records import name_problem
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, metadata_attempts_exhausted
from bkaio.stream.ends import check_truncation_point, end_seq, first_available
from bkaio.stream.errors import (
    InvalidStreamArgumentError,
    NamespaceExistsError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    StreamNotFoundError,
    TooManyStreamsError,
)
from bkaio.stream.model import (
    NamespaceSettings,
    StreamMeta,
    StreamPosition,
    retention_count,
    truncated,
    truncation_count,
)
from bkaio.stream.opening import open_writer as _open_writer
from bkaio.stream.opening import undo_if_namespace_closed
from bkaio.stream.reader import ReaderOptions, Start, StreamReader
from bkaio.stream.reader import open_reader as _open_reader
from bkaio.stream.segments import delete_unnamed_ledgers, namespace_sealed_bytes, remove_stream
from bkaio.stream.store import StreamStore, metadata_of, now_ms
from bkaio.stream.writer import StreamWriter, WriterOptions

if TYPE_CHECKING:
    from bkaio.ledger_client import BookKeeper

log = structlog.get_logger(__name__)


def refuse_deleting_setting(namespace: str, settings: dict[str, Any]) -> None:
    """`deleting` is `delete_namespace`'s mark, not a setting a caller gives."""
    if "deleting" in settings:
        raise InvalidStreamArgumentError(
            f"namespace {namespace}: 'deleting' is not a setting (delete_namespace sets it)"
        )


def check_names(**names: object) -> None:
    """InvalidStreamArgumentError saying which rule a name breaks (`name_problem`), for each
    `kind=name`: a bad name is the caller's argument, refused before metadata is touched."""
    for kind, name in names.items():
        problem = name_problem(kind, name)
        if problem is not None:
            raise InvalidStreamArgumentError(problem)


@dataclass(frozen=True, slots=True)
class CursorInfo:
    name: str
    position: StreamPosition
    lag: int  # Records written after the cursor's position (as far as the bookies confirm).
    mtime_ms: int


@dataclass(frozen=True, slots=True)
class TruncationResult:
    removed_ledgers: tuple[int, ...]
    first_seq: int  # The stream's first available seq afterwards.


@dataclass(frozen=True, slots=True)
class RetentionReport:
    namespace: str
    removed: dict[str, tuple[int, ...]]  # stream -> ledger ids removed

    @property
    def removed_ledgers(self) -> int:
        return sum(len(ids) for ids in self.removed.values())


class Namespace:
    """One namespace of a cluster, bound to a `BookKeeper` client."""

    def __init__(
        self, bk: BookKeeper, store: StreamStore, name: str, settings: NamespaceSettings
    ) -> None:
        self._bk = bk
        self._store = store
        self.name = name
        self.settings = settings

    def __repr__(self) -> str:
        return f"Namespace({self.name!r})"

    async def refresh(self) -> NamespaceSettings:
        """Re-read the settings from metadata."""
        self.settings = await self._store.get_namespace(self.name)
        return self.settings

    async def update_settings(self, **changes: Any) -> NamespaceSettings:
        """Change settings (quota_bytes, retention_seconds, ...) with a CAS; the new settings.
        At most MAX_METADATA_ATTEMPTS CASes (each lost one re-reads), then MetadataError."""
        refuse_deleting_setting(self.name, changes)
        for _attempt in range(MAX_METADATA_ATTEMPTS):
            current = await self._store.get_namespace(self.name)
            try:
                target = replace(current, **changes)
            except TypeError as error:
                raise InvalidStreamArgumentError(f"namespace {self.name}: {error}") from None
            try:
                version = await self._store.put_namespace(self.name, target)
            except MetadataVersionError:
                continue
            self.settings = replace(target, version=version)
            return self.settings
        raise metadata_attempts_exhausted(f"namespace {self.name}", "updating its settings")

    # ------------------------------------------------------------------ streams

    async def list_streams(self) -> list[str]:
        return await self._store.list_streams(self.name)

    async def stream_metadata(self, stream: str) -> StreamMeta:
        """The stream record: epoch, first available seq and segments (StreamNotFoundError)."""
        check_names(stream=stream)
        return await self._store.get_stream(self.name, stream)

    async def create_stream(self, stream: str) -> StreamMeta:
        """Create an empty stream (no segment until a writer opens); existing ones are kept.
        NamespaceDeletingError (nothing kept) once `delete_namespace` marked the namespace."""
        check_names(stream=stream)
        for _attempt in range(MAX_METADATA_ATTEMPTS):
            meta = await self._store.find_stream(self.name, stream)
            if meta is not None:
                return meta
            await self._check_stream_limit(stream)
            try:
                meta = await self._store.put_stream(
                    self.name, stream, StreamMeta(ctime_ms=now_ms())
                )
            except MetadataVersionError:
                continue
            except MetadataOutcomeUnknownError:  # Raised, but it may have landed: check.
                await undo_if_namespace_closed(
                    self._bk, self._store, self.name, stream, created=True
                )
                raise
            await undo_if_namespace_closed(self._bk, self._store, self.name, stream, created=True)
            return meta
        raise metadata_attempts_exhausted(f"stream {self.name}/{stream}", "creating it")

    async def _check_stream_limit(self, stream: str) -> None:
        self.settings = await self._store.get_live_namespace(self.name)
        limit = self.settings.max_streams
        if limit is None:
            return
        count = len(await self.list_streams())
        if count >= limit:
            raise TooManyStreamsError(
                f"namespace {self.name}: creating stream {stream!r} would exceed "
                f"max_streams={limit} ({count} exist)"
            )

    async def open_writer(
        self,
        stream: str,
        *,
        roll_bytes: int = 256 << 20,
        roll_seconds: float = 600.0,
        ensemble_size: int | None = None,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
    ) -> StreamWriter:
        """Become the stream's one writer (creating the stream if needed); fences the last one.
        NamespaceDeletingError once `delete_namespace` marked the namespace (nothing kept)."""
        check_names(stream=stream)
        settings = self.settings = await self._store.get_live_namespace(self.name)
        options = WriterOptions(
            roll_bytes=roll_bytes,
            roll_seconds=roll_seconds,
            ensemble_size=ensemble_size if ensemble_size is not None else settings.ensemble_size,
            write_quorum=write_quorum if write_quorum is not None else settings.write_quorum,
            ack_quorum=ack_quorum if ack_quorum is not None else settings.ack_quorum,
        )
        return await _open_writer(
            self._bk,
            self._store,
            self.name,
            stream,
            settings,
            options,
            on_create=self._check_stream_limit,
        )

    async def open_reader(
        self,
        stream: str,
        start: Start = "earliest",
        *,
        cursor: str | None = None,
        batch_entries: int = 256,
        long_poll_seconds: float = 1.0,
    ) -> StreamReader:
        """A reader from `start` ("earliest", "latest" or a StreamPosition, inclusive).

        With `cursor`, an existing cursor wins over `start`: the reader resumes after its
        last ack. StreamTruncatedError when the start lies before the first available record;
        InvalidStreamArgumentError when it lies past the stream's next seq (never written) or
        a position has a negative field.
        """
        check_names(stream=stream)
        if cursor is not None:
            check_names(cursor=cursor)
        options = ReaderOptions(batch_entries=batch_entries, long_poll_seconds=long_poll_seconds)
        return await _open_reader(self._bk, self._store, self.name, stream, start, cursor, options)

    async def end_seq(self, stream: str) -> int:
        """The seq the stream's next record will get."""
        check_names(stream=stream)
        return await end_seq(self._bk, await self._store.get_stream(self.name, stream))

    async def first_position(self, stream: str) -> StreamPosition | None:
        check_names(stream=stream)
        return first_available(await self._store.get_stream(self.name, stream))

    async def delete_stream(self, stream: str) -> None:
        """Fence the writer, then delete the stream record, its ledgers and its cursors. At
        most MAX_METADATA_ATTEMPTS deletions of the record, then MetadataError (kept whole)."""
        check_names(stream=stream)
        if await remove_stream(self._bk, self._store, self.name, stream) is None:
            raise StreamNotFoundError(f"stream {self.name}/{stream} does not exist")

    # ------------------------------------------------------------------ truncation

    async def truncate(
        self, stream: str, *, before: StreamPosition, force: bool = False
    ) -> TruncationResult:
        """Remove the whole sealed segments that end before `before` and delete their ledgers.

        Never past the slowest durable cursor unless `force` or the namespace allows it
        (`retention_ignores_cursors`); never the open segment. `before.seq` must lie in
        [0, next seq] (InvalidStreamArgumentError naming the next seq): the next seq removes
        every sealed segment, a later one is refused as a mistake.
        """
        check_names(stream=stream)
        if not isinstance(before, StreamPosition):
            raise InvalidStreamArgumentError(
                f"truncate before= must be a StreamPosition, got {type(before).__name__}"
            )
        where = f"{self.name}/{stream}"
        meta = await self._store.get_stream(self.name, stream)
        await check_truncation_point(self._bk, where, before.seq, meta)  # The end only grows.
        keep_from = None if force else await self._cursor_floor(stream)

        def plan(meta: StreamMeta) -> int:
            limit = before.seq if keep_from is None else min(before.seq, keep_from)
            return truncation_count(meta.segments, limit)

        return await self._truncate(stream, plan)

    async def _cursor_floor(self, stream: str) -> int | None:
        """The lowest seq some durable cursor still needs (None: no cursor, or ignored)."""
        if self.settings.retention_ignores_cursors:
            return None
        cursors = await self._store.list_cursors(self.name, stream)
        if not cursors:
            return None
        return min(state.position.seq for state in cursors.values()) + 1

    async def _truncate(self, stream: str, plan: Callable[[StreamMeta], int]) -> TruncationResult:
        """Drop the first `plan(record)` segments: at most MAX_METADATA_ATTEMPTS CASes (each
        lost one re-reads and plans again), then MetadataError, no ledger deleted."""
        for _attempt in range(MAX_METADATA_ATTEMPTS):
            meta = await self._store.get_stream(self.name, stream)
            count = plan(meta)
            if count == 0:
                return TruncationResult((), meta.first_seq)
            target = truncated(meta, count)
            try:
                await self._store.put_stream(self.name, stream, target)
            except (MetadataVersionError, MetadataOutcomeUnknownError) as error:
                # Refused, or every answer lost: ours (a copy landed before the record changed
                # again) or another truncation's may have dropped the segments already; then
                # no record names them and they are deleted here (both may try: one does).
                fresh = await self._store.get_stream(self.name, stream)
                if fresh.first_seq < target.first_seq:
                    if isinstance(error, MetadataOutcomeUnknownError):
                        raise  # The store gave up; its last copy may still land.
                    continue
            removed = meta.segments[:count]
            where = f"stream {self.name}/{stream}"
            await delete_unnamed_ledgers(self._bk, removed, f"{where}: truncated")
            log.info(
                "stream_truncated",
                stream=f"{self.name}/{stream}",
                removed_ledgers=[s.ledger_id for s in removed],
                first_seq=target.first_seq,
            )
            return TruncationResult(tuple(s.ledger_id for s in removed), target.first_seq)
        raise metadata_attempts_exhausted(f"stream {self.name}/{stream}", "truncating it")

    async def apply_retention(self, *, now_ms_value: int | None = None) -> RetentionReport:
        """Apply the namespace's time/size retention to every stream once."""
        settings = await self.refresh()
        removed: dict[str, tuple[int, ...]] = {}
        if settings.retention_seconds is None and settings.retention_bytes is None:
            return RetentionReport(self.name, removed)
        now = now_ms() if now_ms_value is None else now_ms_value
        for stream in await self.list_streams():
            keep_from = await self._cursor_floor(stream)

            def plan(meta: StreamMeta, keep_from: int | None = keep_from) -> int:
                return retention_count(
                    meta.segments,
                    now_ms=now,
                    retention_seconds=settings.retention_seconds,
                    retention_bytes=settings.retention_bytes,
                    keep_from_seq=keep_from,
                )

            with contextlib.suppress(StreamNotFoundError):
                result = await self._truncate(stream, plan)
                if result.removed_ledgers:
                    removed[stream] = result.removed_ledgers
        return RetentionReport(self.name, removed)

    # ------------------------------------------------------------------ cursors and usage

    async def cursors(self, stream: str) -> list[CursorInfo]:
        """The stream's durable cursors with their lag behind the end of the stream."""
        check_names(stream=stream)
        meta = await self._store.get_stream(self.name, stream)
        end = await end_seq(self._bk, meta)
        states = await self._store.list_cursors(self.name, stream)
        return [
            CursorInfo(name, state.position, max(0, end - state.position.seq - 1), state.mtime_ms)
            for name, state in sorted(states.items())
        ]

    async def delete_cursor(self, stream: str, cursor: str) -> bool:
        check_names(stream=stream, cursor=cursor)
        return await self._store.delete_cursor(self.name, stream, cursor)

    async def usage_bytes(self) -> int:
        """Bytes in the sealed segments of every stream (what quota counts, open ones aside)."""
        return await namespace_sealed_bytes(self._store, self.name)


# ---------------------------------------------------------------------- module functions


async def open_namespace(
    bk: BookKeeper,
    name: str,
    *,
    create: bool = False,
    quota_bytes: int | None = None,
    max_streams: int | None = None,
    **settings: Any,
) -> Namespace:
    """The namespace `name`; with `create`, made first if absent (settings apply then only).

    `settings` are the other `NamespaceSettings` fields: ensemble_size, write_quorum,
    ack_quorum, rack_labels, retention_seconds, retention_bytes, retention_ignores_cursors.
    NamespaceNotFoundError when absent and not `create`.
    """
    check_names(namespace=name)
    refuse_deleting_setting(name, settings)
    store = StreamStore(metadata_of(bk))
    try:
        return Namespace(bk, store, name, await store.get_namespace(name))
    except NamespaceNotFoundError:
        if not create:
            raise
    try:
        wanted = NamespaceSettings(
            quota_bytes=quota_bytes, max_streams=max_streams, ctime_ms=now_ms(), **settings
        )
    except TypeError as error:
        raise InvalidStreamArgumentError(f"namespace {name}: {error}") from None
    with contextlib.suppress(MetadataVersionError):  # Lost a creation race: use theirs.
        await store.create_namespace(name, wanted)
        log.info("namespace_created", namespace=name, **wanted.to_dict())
    return Namespace(bk, store, name, await store.get_namespace(name))


async def create_namespace(bk: BookKeeper, name: str, **settings: Any) -> Namespace:
    """Create `name` (NamespaceExistsError if it exists)."""
    check_names(namespace=name)
    refuse_deleting_setting(name, settings)
    store = StreamStore(metadata_of(bk))
    try:
        wanted = NamespaceSettings(ctime_ms=now_ms(), **settings)
    except TypeError as error:
        raise InvalidStreamArgumentError(f"namespace {name}: {error}") from None
    try:
        await store.create_namespace(name, wanted)
    except MetadataVersionError:
        raise NamespaceExistsError(f"namespace {name!r} already exists") from None
    return Namespace(bk, store, name, await store.get_namespace(name))


async def list_namespaces(bk: BookKeeper) -> list[str]:
    return await StreamStore(metadata_of(bk)).list_namespaces()


async def delete_namespace(bk: BookKeeper, name: str, *, force: bool = False) -> None:
    """Delete a namespace; with `force` its streams (their ledgers and cursors) too.

    The namespace is marked `deleting` first: from then on no stream is created or opened for
    writing in it (NamespaceDeletingError; an opener whose record landed after the streams
    were listed removes its stream itself, bkaio/stream/opening.py). Then its streams are
    listed and removed until a listing finds none, and the record is deleted at the version
    read with the mark before that listing (changed since: marked and listed again). Without
    `force`, a namespace with streams is left as it was and NamespaceNotEmptyError raised. A
    forced deletion that fails part way leaves the namespace marked; calling it again
    finishes it.
    """
    check_names(namespace=name)
    store = StreamStore(metadata_of(bk))
    if not force:
        await store.get_namespace(name)  # NamespaceNotFoundError first.
        _refuse_not_empty(name, await store.list_streams(name))
    removed = 0
    for _round in range(MAX_METADATA_ATTEMPTS):
        version, marked_here = await _set_deleting(store, name, deleting=True)
        streams = await store.list_streams(name)  # After the mark: see opening.py.
        if streams and not force:  # Created between the first listing and the mark.
            if marked_here:
                await _set_deleting(store, name, deleting=False)
            _refuse_not_empty(name, streams)
        for stream in streams:
            if await remove_stream(bk, store, name, stream) is not None:
                removed += 1
        if not streams and await _delete_marked(store, name, version):
            log.info("namespace_deleted", namespace=name, streams=removed)
            return
    raise metadata_attempts_exhausted(
        f"namespace {name}", "deleting its streams", "it stays marked deleting; try again"
    )


def _refuse_not_empty(name: str, streams: list[str]) -> None:
    if streams:
        raise NamespaceNotEmptyError(
            f"namespace {name!r} still has {len(streams)} streams ({', '.join(streams[:5])}"
            f"{', ...' if len(streams) > 5 else ''}); delete them first, or delete the "
            "namespace with force=True (the CLI's --force) to delete its streams with it"
        )


async def _set_deleting(store: StreamStore, name: str, *, deleting: bool) -> tuple[int, bool]:
    """Set (or clear) the namespace's `deleting` mark; its version then, and whether this call
    changed it (a lost reply found applied counts as this call's). At most
    MAX_METADATA_ATTEMPTS CASes, then MetadataError."""
    sent = False
    for _attempt in range(MAX_METADATA_ATTEMPTS):
        current = await store.get_namespace(name)
        if current.deleting == deleting:
            return current.version, sent
        try:
            return await store.put_namespace(name, replace(current, deleting=deleting)), True
        except MetadataVersionError:
            continue
        except MetadataOutcomeUnknownError:
            sent = True  # The next read tells whether it landed.
    step = "marking it deleted" if deleting else "clearing its deletion mark"
    raise metadata_attempts_exhausted(f"namespace {name}", step)


async def _delete_marked(store: StreamStore, name: str, version: int) -> bool:
    """Delete the namespace record if it is still at `version` (marked, as it was before the
    last listing of its streams): False when it changed since (a mark cleared by a deletion
    without force and set again, settings updated), so its streams are listed again."""
    try:
        await store.delete_namespace(name, expected_version=version)
    except MetadataVersionError:
        return False
    except MetadataOutcomeUnknownError:
        with contextlib.suppress(NamespaceNotFoundError):
            await store.get_namespace(name)
            return False
    return True


async def apply_retention(
    bk: BookKeeper, namespaces: list[str] | None = None
) -> list[RetentionReport]:
    """One retention pass over `namespaces` (default: all). A namespace named in `namespaces`
    that does not exist is NamespaceNotFoundError, raised before any is touched, as the other
    namespace calls do; with the default, one deleted since the listing is skipped."""
    if namespaces is None:
        opened = []
        for name in await list_namespaces(bk):
            with contextlib.suppress(NamespaceNotFoundError):  # Deleted since the listing.
                opened.append(await open_namespace(bk, name))
    else:
        opened = [await open_namespace(bk, name) for name in namespaces]
    reports = []
    for namespace in opened:
        try:
            reports.append(await namespace.apply_retention())
        except NamespaceNotFoundError:
            if namespaces is not None:
                raise
    return reports


async def run_retention(
    bk: BookKeeper,
    *,
    interval_seconds: float = 60.0,
    namespaces: list[str] | None = None,
    on_report: Callable[[RetentionReport], Awaitable[None] | None] | None = None,
) -> None:
    """Apply retention every `interval_seconds`, forever (cancel to stop). The background task
    a standalone or bookie process runs. Each namespace of `namespaces` is a pass of its own: one
    that fails (deleted since: NamespaceNotFoundError) is logged and retried next interval, and
    does not hold back the others."""
    targets: list[list[str] | None] = (
        [None] if namespaces is None else [[name] for name in namespaces]
    )
    while True:
        for target in targets:
            try:
                for report in await apply_retention(bk, target):
                    if report.removed and on_report is not None:
                        outcome = on_report(report)
                        if outcome is not None:
                            await outcome
                    if report.removed:
                        log.info(
                            "retention_applied",
                            namespace=report.namespace,
                            removed_ledgers=report.removed_ledgers,
                        )
            except BKError as error:
                shown = "all" if target is None else target[0]
                log.warning("retention_pass_failed", namespaces=shown, error=str(error))
        await asyncio.sleep(interval_seconds)
