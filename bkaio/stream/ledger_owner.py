"""Which stream, if any, names a ledger as one of its segments: the check every ledger delete
that is not the stream layer's own (`bkaio shell deleteledger`, the bookie admin API's
`DELETE /api/v1/ledger/delete`) makes before it deletes.

Deleting a segment loses its records, and the stream then fails every read from that segment
on; the stream layer removes segments whole (`truncate`, `delete_stream`). A stream ledger
carries its stream in its custom metadata (`bkaio.stream` = "ns/stream", bkaio/stream/
segments.py), so one read of that stream's record answers: no full scan of the streams.
A ledger tagged for a stream whose record does not name it (an orphan, or a deleted stream's;
`bkaio stream orphans` lists those), and an untagged one, belong to no stream.

    owner = await stream_naming_ledger(metadata, ledger_id)   # StreamSegmentOwner or None
    await refuse_a_stream_segment(metadata, ledger_id, override="--force")

Imports only `bkaio.meta` and the stream layer's own modules (never the bookie or the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass

from bkaio.errors import BKError
from bkaio.meta import Metadata
from bkaio.meta.records import name_problem
from bkaio.stream.segments import STREAM_KEY
from bkaio.stream.store import StreamStore


@dataclass(frozen=True, slots=True)
class StreamSegmentOwner:
    """The stream whose record names a ledger as a segment, and the seqs that segment holds."""

    ledger_id: int
    namespace: str
    stream: str
    first_seq: int
    last_seq: int | None  # None while the segment is open (its writer's current ledger).

    @property
    def stream_name(self) -> str:
        return f"{self.namespace}/{self.stream}"

    @property
    def seqs(self) -> str:
        """'seq 0..2' for a sealed segment, 'seq 3..' for the open one."""
        end = "" if self.last_seq is None else str(self.last_seq)
        return f"seq {self.first_seq}..{end}"

    def refusal(self, override: str) -> str:
        """Why deleting the ledger is refused; `override` names how the caller insists."""
        return (
            f"ledger {self.ledger_id} is a segment of stream {self.stream_name} ({self.seqs}): "
            "deleting it loses its records; use `bkaio stream truncate` or `bkaio stream "
            f"delete`, or pass {override}"
        )


class LedgerNamedByStreamError(BKError):
    """A ledger delete refused because a stream's record names the ledger as a segment."""

    def __init__(self, owner: StreamSegmentOwner, override: str) -> None:
        super().__init__(owner.refusal(override))
        self.owner = owner


async def stream_naming_ledger(metadata: Metadata, ledger_id: int) -> StreamSegmentOwner | None:
    """The stream whose record names `ledger_id` as a segment, with its seqs; None when no
    stream does (the ledger is untagged, its tag is unreadable, or its stream's record does not
    name it). NoSuchLedgerError when the ledger does not exist."""
    tag = (await metadata.ledgers.get(ledger_id)).custom_metadata.get(STREAM_KEY)
    if tag is None:
        return None
    namespace, _, stream = tag.decode(errors="replace").partition("/")
    if name_problem("namespace", namespace) or name_problem("stream", stream):
        return None  # No stream could carry this name, so no record names the ledger.
    meta = await StreamStore(metadata).find_stream(namespace, stream)
    if meta is None:
        return None
    for segment in meta.segments:
        if segment.ledger_id == ledger_id:
            return StreamSegmentOwner(
                ledger_id=ledger_id,
                namespace=namespace,
                stream=stream,
                first_seq=segment.first_seq,
                last_seq=None if segment.is_open else segment.last_seq,
            )
    return None


async def refuse_a_stream_segment(metadata: Metadata, ledger_id: int, *, override: str) -> None:
    """LedgerNamedByStreamError (naming the stream, its seqs and `override`, the caller's way
    to delete it anyway) when a stream's record names `ledger_id` as a segment."""
    owner = await stream_naming_ledger(metadata, ledger_id)
    if owner is not None:
        raise LedgerNamedByStreamError(owner, override)
