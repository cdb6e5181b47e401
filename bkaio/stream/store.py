"""Typed access to the stream layer's metadata records, over `bkaio.meta`.

Namespaces and streams go through `meta.namespaces` (`/namespaces/<ns>`,
`/streams/<ns>/<stream>`); durable cursors live beside them under `/cursors/<ns>/<stream>/<name>`
on the raw store, so a reader's acknowledgements never race the writer's compare-and-swap on
the stream record. Every write is a CAS on the version read, except cursor positions, which
have one owner (the reader holding the cursor) and are written last-wins.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import msgpack

from bkaio.meta import Metadata
from bkaio.meta.errors import InvalidMetadataError
from bkaio.meta.records import check_name
from bkaio.meta.store import EventKind
from bkaio.stream.errors import (
    NamespaceDeletingError,
    NamespaceNotFoundError,
    StreamNotFoundError,
)
from bkaio.stream.model import CursorState, NamespaceSettings, StreamMeta

if TYPE_CHECKING:
    from bkaio.ledger_client import BookKeeper

CURSORS_PREFIX = "/cursors/"


def now_ms() -> int:
    return int(time.time() * 1000)


def metadata_of(bk: BookKeeper) -> Metadata:
    """The `Metadata` facade a `BookKeeper` client holds."""
    metadata = bk.metadata
    if not isinstance(metadata, Metadata):
        raise TypeError(f"{type(bk).__name__} has no metadata connection (need a BookKeeper)")
    return metadata


class StreamStore:
    """Namespace, stream and cursor records of one metadata store."""

    def __init__(self, metadata: Metadata) -> None:
        self.metadata = metadata
        self._records = metadata.namespaces
        self._store = metadata.store

    # ------------------------------------------------------------------ namespaces

    async def get_namespace(self, namespace: str) -> NamespaceSettings:
        record = await self._records.get_namespace(namespace)
        if record is None:
            raise NamespaceNotFoundError(f"namespace {namespace!r} does not exist")
        return NamespaceSettings.from_dict(f"namespace {namespace}", record.value, record.version)

    async def get_live_namespace(self, namespace: str) -> NamespaceSettings:
        """The settings of a namespace streams may be created and written in: refuses one
        absent (NamespaceNotFoundError) or being deleted (NamespaceDeletingError)."""
        settings = await self.get_namespace(namespace)
        if settings.deleting:
            raise NamespaceDeletingError(
                f"namespace {namespace!r} is being deleted: no stream can be created or "
                "opened for writing in it"
            )
        return settings

    async def create_namespace(self, namespace: str, settings: NamespaceSettings) -> int:
        """CAS-create; MetadataVersionError when it exists already."""
        return await self._records.put_namespace(namespace, settings.to_dict(), expected_version=0)

    async def put_namespace(self, namespace: str, settings: NamespaceSettings) -> int:
        return await self._records.put_namespace(
            namespace, settings.to_dict(), expected_version=settings.version
        )

    async def delete_namespace(
        self, namespace: str, *, expected_version: int | None = None
    ) -> bool:
        """MetadataVersionError when `expected_version` is given and the record is at another."""
        return await self._records.delete_namespace(namespace, expected_version=expected_version)

    async def list_namespaces(self) -> list[str]:
        return await self._records.list_namespaces()

    # ------------------------------------------------------------------ streams

    @staticmethod
    def stream_key(namespace: str, stream: str) -> str:
        from bkaio.meta.records import NamespaceStore

        return NamespaceStore.stream_key(namespace, stream)

    async def find_stream(self, namespace: str, stream: str) -> StreamMeta | None:
        record = await self._records.get_stream(namespace, stream)
        if record is None:
            return None
        return StreamMeta.from_dict(f"stream {namespace}/{stream}", record.value, record.version)

    async def get_stream(self, namespace: str, stream: str) -> StreamMeta:
        meta = await self.find_stream(namespace, stream)
        if meta is None:
            raise StreamNotFoundError(f"stream {namespace}/{stream} does not exist")
        return meta

    async def put_stream(self, namespace: str, stream: str, meta: StreamMeta) -> StreamMeta:
        """CAS on `meta.version` (0: create). Returns `meta` with its new version."""
        version = await self._records.put_stream(
            namespace, stream, meta.to_dict(), expected_version=meta.version
        )
        return StreamMeta(meta.epoch, meta.first_seq, meta.segments, meta.ctime_ms, version)

    async def delete_stream(self, namespace: str, stream: str, *, version: int) -> bool:
        return await self._records.delete_stream(namespace, stream, expected_version=version)

    async def list_streams(self, namespace: str) -> list[str]:
        return await self._records.list_streams(namespace)

    async def current_revision(self) -> int:
        return await self._store.current_revision()

    async def watch_stream(
        self, namespace: str, stream: str, start_revision: int
    ) -> AsyncIterator[StreamMeta | None]:
        """Every version of the stream record from `start_revision` on (None once deleted)."""
        key = self.stream_key(namespace, stream)
        async for event in self._store.watch_prefix(key, start_revision=start_revision):
            if event.key != key:
                continue  # A stream whose name starts with this one's.
            if event.kind is EventKind.DELETE:
                yield None
                continue
            try:
                value = msgpack.unpackb(event.value, raw=False)
            except (ValueError, msgpack.ExtraData, msgpack.FormatError) as error:
                raise InvalidMetadataError(
                    f"stream {key}: record does not decode: {error}"
                ) from None
            yield StreamMeta.from_dict(f"stream {namespace}/{stream}", value, event.version)

    # ------------------------------------------------------------------ cursors

    @staticmethod
    def cursor_prefix(namespace: str, stream: str) -> str:
        check_name("namespace", namespace)
        check_name("stream", stream)
        return f"{CURSORS_PREFIX}{namespace}/{stream}/"

    def cursor_key(self, namespace: str, stream: str, cursor: str) -> str:
        check_name("cursor", cursor)
        return self.cursor_prefix(namespace, stream) + cursor

    async def get_cursor(self, namespace: str, stream: str, cursor: str) -> CursorState | None:
        key = self.cursor_key(namespace, stream, cursor)
        kv = await self._store.get(key)
        if kv is None:
            return None
        return CursorState.from_dict(key, _unpack(key, kv.value))

    async def put_cursor(
        self, namespace: str, stream: str, cursor: str, state: CursorState
    ) -> None:
        key = self.cursor_key(namespace, stream, cursor)
        await self._store.put(key, msgpack.packb(state.to_dict(), use_bin_type=True))

    async def list_cursors(self, namespace: str, stream: str) -> dict[str, CursorState]:
        prefix = self.cursor_prefix(namespace, stream)
        cursors: dict[str, CursorState] = {}
        async for kv in self._store.iterate_prefix(prefix):
            cursors[kv.key[len(prefix) :]] = CursorState.from_dict(
                kv.key, _unpack(kv.key, kv.value)
            )
        return cursors

    async def delete_cursor(self, namespace: str, stream: str, cursor: str) -> bool:
        return await self._store.delete(self.cursor_key(namespace, stream, cursor))

    async def delete_cursors(self, namespace: str, stream: str) -> None:
        for name in await self.list_cursors(namespace, stream):
            await self.delete_cursor(namespace, stream, name)


def _unpack(key: str, data: bytes) -> dict[str, Any]:
    try:
        value = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError) as error:
        raise InvalidMetadataError(f"record {key} does not decode: {error}") from None
    if not isinstance(value, dict):
        raise InvalidMetadataError(f"record {key} is not a map")
    return value
