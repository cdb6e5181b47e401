"""Streams and namespaces on top of ledgers (the DistributedLog layer; docs/streams.md).

A namespace holds streams; a stream is an ordered list of segments, one ledger each, with one
writer at a time (fenced by epoch and ledger recovery), readers that cross segments and tail
the live one, truncation and retention by whole segments, and durable cursors.

    ns = await open_namespace(bk, "tenant-a", create=True)    # BookKeeper.namespace delegates here
    w = await ns.open_writer("orders"); pos = await w.write(b"record"); await w.close()
    async for record in await ns.open_reader("orders", start="earliest"): ...

Imports `bkaio.ledger_client` (through the BookKeeper object it is given) and `bkaio.meta`.
"""

from __future__ import annotations

from bkaio.errors import QuotaExceededError
from bkaio.stream.errors import (
    InvalidStreamArgumentError,
    NamespaceDeletingError,
    NamespaceExistsError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    StreamNotFoundError,
    StreamSegmentUnreadableError,
    StreamTruncatedError,
    TooManyStreamsError,
)
from bkaio.stream.model import (
    CursorState,
    NamespaceSettings,
    Segment,
    SegmentState,
    StreamMeta,
    StreamPosition,
    StreamRecord,
)
from bkaio.stream.namespace import (
    CursorInfo,
    Namespace,
    RetentionReport,
    TruncationResult,
    apply_retention,
    create_namespace,
    delete_namespace,
    list_namespaces,
    open_namespace,
    run_retention,
)
from bkaio.stream.reader import StreamReader
from bkaio.stream.writer import StreamWriter

__all__ = [
    "CursorInfo",
    "CursorState",
    "InvalidStreamArgumentError",
    "Namespace",
    "NamespaceDeletingError",
    "NamespaceExistsError",
    "NamespaceNotEmptyError",
    "NamespaceNotFoundError",
    "NamespaceSettings",
    "QuotaExceededError",
    "RetentionReport",
    "Segment",
    "SegmentState",
    "StreamMeta",
    "StreamNotFoundError",
    "StreamPosition",
    "StreamReader",
    "StreamRecord",
    "StreamSegmentUnreadableError",
    "StreamTruncatedError",
    "StreamWriter",
    "TooManyStreamsError",
    "TruncationResult",
    "apply_retention",
    "create_namespace",
    "delete_namespace",
    "list_namespaces",
    "open_namespace",
    "run_retention",
]
