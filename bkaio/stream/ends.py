"""Where a stream starts and ends, as readers, the namespace, the CLI and Spark ask it: the
first available position, the exact end (`end_seq`), and the checks of a reader's start.

"The end" of a stream is exact: the seq after the last record acknowledged to its writer, not
after the bookies' LAC, which lags the writer by whatever it had in flight
(ReadHandle.read_last_acknowledged). An empty last segment ends where it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bkaio.stream.errors import InvalidStreamArgumentError, StreamTruncatedError
from bkaio.stream.model import StreamMeta, StreamPosition
from bkaio.stream.segments import STREAM_PASSWORD

if TYPE_CHECKING:
    from bkaio.ledger_client import BookKeeper


def first_available(meta: StreamMeta) -> StreamPosition | None:
    """The first readable position of the stream (None when nothing is readable yet)."""
    for segment in meta.segments:
        readable = segment.is_open or segment.last_seq >= segment.first_seq
        if readable and segment.first_seq >= meta.first_seq:
            return segment.position(segment.first_seq)
    return None


def truncated_error(where: str, seq: int, meta: StreamMeta) -> StreamTruncatedError:
    first = first_available(meta)
    shown = str(first) if first is not None else f"seq {meta.first_seq} (not written yet)"
    return StreamTruncatedError(
        f"stream {where}: seq {seq} was truncated; the first available position is {shown}",
        first,
    )


def check_start(where: str, start: object) -> None:
    """InvalidStreamArgumentError unless `start` is "earliest", "latest" or a StreamPosition
    whose fields are whole numbers >= 0 (what the stream hands out)."""
    if start in ("earliest", "latest"):
        return
    if not isinstance(start, StreamPosition):
        raise InvalidStreamArgumentError(
            f"stream {where}: start must be 'earliest', 'latest' or a StreamPosition, got {start!r}"
        )
    fields = (("seq", start.seq), ("ledger id", start.ledger_id), ("entry id", start.entry_id))
    for field, value in fields:
        if not isinstance(value, int) or value < 0:
            raise InvalidStreamArgumentError(
                f"stream {where}: start {start} has {field} {value!r}: a position's ledger id, "
                "entry id and seq are whole numbers >= 0"
            )


async def check_written(
    bk: BookKeeper, where: str, seq: int, meta: StreamMeta, *, cursor: str | None = None
) -> None:
    """InvalidStreamArgumentError when `seq` lies past the stream's next seq: no record was
    ever written there, so there is nothing to resume from (a position of another stream, a
    mistyped one), and a reader there would wait in silence for records that may never come.
    The next seq itself is a good start: the next record written.

    With `cursor`, `seq` is where that cursor resumes: past the end, it was written for an
    earlier stream of this name (this stream's readers never ack past its end), and resuming
    there would skip this stream's records before it."""
    end = await _end_if_past(bk, seq, meta)
    if end is None:
        return
    if cursor is not None:
        raise InvalidStreamArgumentError(
            f"stream {where}: cursor {cursor!r} resumes at seq {seq}, past the end of the "
            f"stream (next seq {end}): it was left by an earlier stream of this name; delete "
            "the cursor to read this stream with it"
        )
    raise InvalidStreamArgumentError(
        f"stream {where}: start seq {seq} is past the end of the stream (next seq {end}): "
        f"no record was written there; start at seq {end} or before, or at 'latest'"
    )


def check_position(where: str, start: StreamPosition, meta: StreamMeta) -> None:
    """InvalidStreamArgumentError unless `start`'s ledger and entry are where this stream holds
    its seq: the record's own, or one past the last entry of a sealed segment (the position
    after a segment's last record, which is how a resume point is often made). A position from
    another stream or a mistyped ledger would otherwise start wherever its seq falls here. A
    stream with no segment (nothing written since it was created or emptied) has no ledger to
    compare: its start is judged by the seq alone (`check_written`)."""
    if not meta.segments:
        return
    for segment in meta.segments:
        if segment.ledger_id != start.ledger_id:
            continue
        at_seq = segment.first_seq + start.entry_id == start.seq
        if at_seq and (segment.is_open or start.seq <= segment.last_seq + 1):
            return
    index = meta.segment_index_for(start.seq)
    # None: the next seq of a sealed stream, one past its last segment.
    segment = meta.segments[-1 if index is None else index]
    here = f"{segment.ledger_id}:{start.seq - segment.first_seq}@{start.seq}"
    raise InvalidStreamArgumentError(
        f"stream {where}: start {start} is not a position of this stream (from another "
        f"stream, or mistyped?): seq {start.seq} is at {here} in it; give that position, or "
        "the seq alone where a seq is taken"
    )


async def check_truncation_point(bk: BookKeeper, where: str, seq: int, meta: StreamMeta) -> None:
    """InvalidStreamArgumentError unless 0 <= `seq` <= the stream's next seq. Truncating before
    a seq never written would remove every sealed segment, so a mistyped seq (a zero too many)
    is refused rather than taken as "everything"; truncating before the next seq itself is how
    every sealed segment is removed on purpose."""
    if type(seq) is int and seq >= 0:
        end = await _end_if_past(bk, seq, meta)
        if end is None:
            return
    else:
        end = await end_seq(bk, meta)
    raise InvalidStreamArgumentError(
        f"stream {where}: truncate before seq {seq!r} is outside the stream (next seq {end}): "
        f"give a seq in [0, {end}]; {end} removes every sealed segment"
    )


async def _end_if_past(bk: BookKeeper, seq: int, meta: StreamMeta) -> int | None:
    """The stream's next seq when `seq` lies past it, else None. The bookies are asked only
    when `seq` lies past the open segment's first record."""
    segment = meta.open_segment
    if segment is not None and seq <= segment.first_seq:
        return None  # Written, or the open segment's first record.
    end = meta.end_seq_if_closed if segment is None else await end_seq(bk, meta)
    return end if seq > end else None


async def end_seq(bk: BookKeeper, meta: StreamMeta) -> int:
    """The seq after the last record acknowledged by now (exact: see the module doc)."""
    segment = meta.open_segment
    if segment is None:
        return meta.end_seq_if_closed
    handle = await bk.open_ledger(segment.ledger_id, password=STREAM_PASSWORD, recovery=False)
    last: int = await handle.read_last_acknowledged()
    return segment.first_seq + last + 1
