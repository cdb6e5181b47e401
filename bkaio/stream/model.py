"""Stream and namespace records, positions, and the pure policy over them. No I/O.

Owns the msgpack-map form of the three records the stream layer keeps in metadata:

- `/namespaces/<ns>`: `NamespaceSettings` (default quorums, placement rack labels, retention,
  quota, stream limit).
- `/streams/<ns>/<stream>`: `StreamMeta`: the writer epoch and the ordered segment list. Every
  change is a compare-and-swap on the version that was read.
- `/cursors/<ns>/<stream>/<cursor>`: `CursorState`, the last acknowledged position.

A stream's records carry a global sequence number `seq`, dense from 0: the record at entry `e`
of a segment whose first seq is `f` has seq `f + e` (one record per ledger entry). Positions
compare by `seq` alone. Must not import `ledger_client` or any driver.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bkaio.meta.errors import InvalidMetadataError
from bkaio.stream.errors import InvalidStreamArgumentError

RECORD_FORMAT = 1
MAX_SETTING = 2**63 - 1  # The largest int a record holds (msgpack's signed 64 bits).


@functools.total_ordering
@dataclass(frozen=True, slots=True)
class StreamPosition:
    """Where a record sits: its ledger and entry, and its global sequence number in the stream.

    Totally ordered by `seq` (ledger ids need not grow along a stream).
    """

    ledger_id: int
    entry_id: int
    seq: int

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, StreamPosition):
            return NotImplemented
        return self.seq < other.seq

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}@{self.seq}"

    @classmethod
    def parse(cls, text: str) -> StreamPosition:
        """The inverse of `str()`: `LEDGER:ENTRY@SEQ`."""
        try:
            ledger_part, _, seq_part = text.partition("@")
            ledger_id, _, entry_id = ledger_part.partition(":")
            return cls(int(ledger_id), int(entry_id), int(seq_part))
        except ValueError:
            raise InvalidStreamArgumentError(
                f"position {text!r} is not LEDGER:ENTRY@SEQ (for example 12:0@4000)"
            ) from None

    def to_dict(self) -> dict[str, int]:
        return {"ledger_id": self.ledger_id, "entry_id": self.entry_id, "seq": self.seq}


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """One record read from a stream."""

    position: StreamPosition
    payload: bytes


class SegmentState(enum.Enum):
    OPEN = "open"  # The writer's current ledger; its end is the ledger's LAC.
    CLOSED = "closed"  # Sealed: last_seq and bytes are final.


@dataclass(frozen=True, slots=True)
class Segment:
    """One ledger of a stream. For an OPEN segment `last_seq` and `bytes` are not known yet."""

    ledger_id: int
    first_seq: int
    last_seq: int  # first_seq - 1 when closed empty; -1 while OPEN.
    state: SegmentState
    ctime_ms: int
    closed_ms: int = 0
    bytes: int = 0

    @property
    def is_open(self) -> bool:
        return self.state is SegmentState.OPEN

    @property
    def record_count(self) -> int:
        assert not self.is_open, self
        return self.last_seq - self.first_seq + 1

    def position(self, seq: int) -> StreamPosition:
        assert seq >= self.first_seq, (seq, self)
        assert self.is_open or seq <= self.last_seq, (seq, self)
        return StreamPosition(self.ledger_id, seq - self.first_seq, seq)

    def closed(self, last_entry_id: int, length: int, now_ms: int) -> Segment:
        assert self.is_open, self
        assert last_entry_id >= -1 and length >= 0, (last_entry_id, length)
        return replace(
            self,
            state=SegmentState.CLOSED,
            last_seq=self.first_seq + last_entry_id,
            closed_ms=now_ms,
            bytes=length,
        )

    def to_wire(self) -> list[Any]:
        return [
            self.ledger_id,
            self.first_seq,
            self.last_seq,
            self.state.value,
            self.ctime_ms,
            self.closed_ms,
            self.bytes,
        ]

    @classmethod
    def from_wire(cls, where: str, item: Any) -> Segment:
        try:
            ledger_id, first_seq, last_seq, state, ctime_ms, closed_ms, size = item
            segment = cls(
                int(ledger_id),
                int(first_seq),
                int(last_seq),
                SegmentState(state),
                int(ctime_ms),
                int(closed_ms),
                int(size),
            )
        except (TypeError, ValueError) as error:
            raise InvalidMetadataError(f"{where}: bad segment {item!r}: {error}") from None
        if segment.first_seq < 0 or segment.bytes < 0:
            raise InvalidMetadataError(f"{where}: negative seq or size in segment {item!r}")
        if not segment.is_open and segment.last_seq < segment.first_seq - 1:
            raise InvalidMetadataError(f"{where}: closed segment ends before it starts: {item!r}")
        return segment


@dataclass(frozen=True, slots=True)
class StreamMeta:
    """The stream record: writer epoch, first available seq, segments in seq order."""

    epoch: int = 0
    first_seq: int = 0  # Everything before was truncated.
    segments: tuple[Segment, ...] = ()
    ctime_ms: int = 0
    version: int = 0  # Metadata store version; not serialized.

    def __post_init__(self) -> None:
        check_segments(self.segments, self.first_seq)

    @property
    def open_segment(self) -> Segment | None:
        if self.segments and self.segments[-1].is_open:
            return self.segments[-1]
        return None

    @property
    def end_seq_if_closed(self) -> int:
        """The seq the next record will get, when no segment is open."""
        assert self.open_segment is None
        return self.segments[-1].last_seq + 1 if self.segments else self.first_seq

    @property
    def sealed_bytes(self) -> int:
        return sum(s.bytes for s in self.segments if not s.is_open)

    def segment_index_for(self, seq: int) -> int | None:
        """Index of the segment holding `seq`; for an open last segment, any seq from its
        start on. None when `seq` is past the end of a stream whose segments are all closed."""
        for index, segment in enumerate(self.segments):
            if seq < segment.first_seq:
                return index  # In a gap only empty segments can leave: start of the next one.
            if segment.is_open or seq <= segment.last_seq:
                return index
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "epoch": self.epoch,
            "first_seq": self.first_seq,
            "segments": [segment.to_wire() for segment in self.segments],
            "ctime_ms": self.ctime_ms,
        }

    @classmethod
    def from_dict(cls, where: str, value: dict[str, Any], version: int) -> StreamMeta:
        _check_format(where, value)
        try:
            segments = tuple(Segment.from_wire(where, item) for item in value["segments"])
            return cls(
                epoch=int(value["epoch"]),
                first_seq=int(value["first_seq"]),
                segments=segments,
                ctime_ms=int(value.get("ctime_ms", 0)),
                version=version,
            )
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidMetadataError(f"{where}: bad stream record: {error!r}") from None


def check_segments(segments: Sequence[Segment], first_seq: int) -> None:
    """Segments tile the seq space: each starts where the previous ended; only the last is open."""
    if first_seq < 0:
        raise InvalidMetadataError(f"stream first_seq {first_seq} < 0")
    expected = None
    for index, segment in enumerate(segments):
        if segment.is_open and index != len(segments) - 1:
            raise InvalidMetadataError(f"segment {index} (ledger {segment.ledger_id}) is open")
        if expected is not None and segment.first_seq != expected:
            raise InvalidMetadataError(
                f"segment {index} (ledger {segment.ledger_id}) starts at seq "
                f"{segment.first_seq}, expected {expected}"
            )
        expected = segment.last_seq + 1
    if segments and segments[0].first_seq > first_seq:
        raise InvalidMetadataError(
            f"first segment starts at seq {segments[0].first_seq} after first_seq {first_seq}"
        )


def _check_format(where: str, value: dict[str, Any]) -> None:
    found = value.get("format")
    if found != RECORD_FORMAT:
        raise InvalidMetadataError(
            f"{where}: record format {found!r} is not {RECORD_FORMAT}; this build cannot read it"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NamespaceSettings:
    """A namespace's policy, stored in `/namespaces/<ns>`."""

    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    rack_labels: tuple[str, ...] = ()  # Placement hint: racks this namespace's ledgers prefer.
    retention_seconds: float | None = None  # Sealed segments older than this are removed.
    retention_bytes: int | None = None  # Oldest sealed segments go while a stream is larger.
    quota_bytes: int | None = None  # Writes beyond this many bytes in the namespace fail.
    max_streams: int | None = None
    retention_ignores_cursors: bool = False  # True: retention may pass the slowest cursor.
    ctime_ms: int = 0
    # Set by `delete_namespace` before it lists the streams, never by a caller: no stream is
    # created or opened for writing in the namespace from then on (NamespaceDeletingError).
    deleting: bool = False
    version: int = field(default=0, compare=False)  # Metadata store version; not serialized.

    def __post_init__(self) -> None:
        """Refuse what the record could not hold or would hold wrongly (an int past msgpack's
        range, a bool or a fraction for a count, a str for the rack labels), naming the
        setting and its range: a bad value never reaches the metadata write."""
        for name in ("ensemble_size", "write_quorum", "ack_quorum"):
            _check_setting(name, getattr(self, name), whole=True, optional=False)
        for name in ("retention_bytes", "quota_bytes", "max_streams"):
            _check_setting(name, getattr(self, name), whole=True, optional=True)
        _check_setting("retention_seconds", self.retention_seconds, whole=False, optional=True)
        if not 1 <= self.ack_quorum <= self.write_quorum <= self.ensemble_size:
            raise InvalidStreamArgumentError(
                f"namespace quorums need ensemble_size ({self.ensemble_size}) >= write_quorum "
                f"({self.write_quorum}) >= ack_quorum ({self.ack_quorum}) >= 1"
            )
        labels = self.rack_labels
        if not isinstance(labels, tuple | list) or not all(isinstance(x, str) for x in labels):
            raise InvalidStreamArgumentError(
                f"namespace rack_labels={labels!r} must be a tuple (or list) of str"
            )
        object.__setattr__(self, "rack_labels", tuple(labels))  # frozen: a list becomes one.
        for name in ("retention_ignores_cursors", "deleting"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidStreamArgumentError(
                    f"namespace {name}={getattr(self, name)!r} must be True or False"
                )
        if type(self.ctime_ms) is not int or not 0 <= self.ctime_ms <= MAX_SETTING:
            raise InvalidStreamArgumentError(
                f"namespace ctime_ms={self.ctime_ms!r} must be a whole number in [0, 2**63 - 1]"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "rack_labels": list(self.rack_labels),
            "retention_seconds": self.retention_seconds,
            "retention_bytes": self.retention_bytes,
            "quota_bytes": self.quota_bytes,
            "max_streams": self.max_streams,
            "retention_ignores_cursors": self.retention_ignores_cursors,
            "ctime_ms": self.ctime_ms,
            "deleting": self.deleting,
        }

    @classmethod
    def from_dict(cls, where: str, value: dict[str, Any], version: int) -> NamespaceSettings:
        _check_format(where, value)
        try:
            return cls(
                ensemble_size=int(value["ensemble_size"]),
                write_quorum=int(value["write_quorum"]),
                ack_quorum=int(value["ack_quorum"]),
                rack_labels=tuple(str(label) for label in value.get("rack_labels", ())),
                retention_seconds=value.get("retention_seconds"),
                retention_bytes=_stored_count(value.get("retention_bytes")),
                quota_bytes=_stored_count(value.get("quota_bytes")),
                max_streams=_stored_count(value.get("max_streams")),
                retention_ignores_cursors=bool(value.get("retention_ignores_cursors", False)),
                ctime_ms=int(value.get("ctime_ms", 0)),
                deleting=bool(value.get("deleting", False)),
                version=version,
            )
        except (KeyError, TypeError, ValueError, InvalidStreamArgumentError) as error:
            raise InvalidMetadataError(f"{where}: bad namespace record: {error}") from None


def _stored_count(value: Any) -> Any:
    """A count as an older build may have stored it (a bool or a fraction, accepted then): its
    whole part, at least 1, so such a namespace stays readable. Anything else is kept for
    `_check_setting` to judge."""
    if isinstance(value, bool | float) and math.isfinite(value) and value > 0:
        return max(1, math.floor(value))
    return value


def _check_setting(name: str, value: object, *, whole: bool, optional: bool) -> None:
    """InvalidStreamArgumentError unless `value` is an int in [1, 2**63 - 1] (`whole`) or a
    number in (0, 2**63 - 1] (seconds), or None when `optional`."""
    if value is None and optional:
        return
    if whole:
        good = type(value) is int and 1 <= value <= MAX_SETTING
        wanted = "a whole number in [1, 2**63 - 1]"
    else:  # NaN and infinities fail the comparison.
        good = type(value) in (int, float) and 0 < value <= MAX_SETTING  # type: ignore[operator]
        wanted = "a number of seconds in (0, 2**63 - 1]"
    if not good:
        shown = f"{value!r}" if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
        none = " or None" if optional else ""
        raise InvalidStreamArgumentError(f"namespace {name}={shown} must be {wanted}{none}")


@dataclass(frozen=True, slots=True)
class CursorState:
    """A durable cursor: the last position its reader acknowledged."""

    position: StreamPosition
    mtime_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, **self.position.to_dict(), "mtime_ms": self.mtime_ms}

    @classmethod
    def from_dict(cls, where: str, value: dict[str, Any]) -> CursorState:
        _check_format(where, value)
        try:
            position = StreamPosition(
                int(value["ledger_id"]), int(value["entry_id"]), int(value["seq"])
            )
            return cls(position, int(value["mtime_ms"]))
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidMetadataError(f"{where}: bad cursor record: {error!r}") from None


# --------------------------------------------------------------------------- policy


def truncation_count(segments: Sequence[Segment], before_seq: int) -> int:
    """How many leading segments lie wholly before `before_seq` (closed ones only)."""
    count = 0
    for segment in segments:
        if segment.is_open or segment.last_seq >= before_seq:
            break
        count += 1
    return count


def retention_count(
    segments: Sequence[Segment],
    *,
    now_ms: int,
    retention_seconds: float | None,
    retention_bytes: int | None,
    keep_from_seq: int | None,
) -> int:
    """How many leading segments the retention policy removes.

    A sealed segment goes when it was sealed more than `retention_seconds` ago, or while the
    sealed bytes of the stream exceed `retention_bytes` (oldest first). Nothing at or after
    `keep_from_seq` goes (the slowest durable cursor), and the open segment always stays.
    """
    closed = [s for s in segments if not s.is_open]
    count = 0
    if retention_seconds is not None:
        horizon_ms = now_ms - retention_seconds * 1000
        while count < len(closed) and closed[count].closed_ms < horizon_ms:
            count += 1
    if retention_bytes is not None:
        total = sum(s.bytes for s in closed[count:])
        while count < len(closed) and total > retention_bytes:
            total -= closed[count].bytes
            count += 1
    if keep_from_seq is not None:
        count = min(count, truncation_count(segments, keep_from_seq))
    return count


def truncated(meta: StreamMeta, count: int) -> StreamMeta:
    """`meta` without its first `count` segments; first_seq moves past them."""
    assert 0 <= count <= len(meta.segments), (count, len(meta.segments))
    if count == 0:
        return meta
    assert not meta.segments[count - 1].is_open, "the open segment is never truncated"
    return replace(
        meta,
        segments=meta.segments[count:],
        first_seq=max(meta.first_seq, meta.segments[count - 1].last_seq + 1),
    )
