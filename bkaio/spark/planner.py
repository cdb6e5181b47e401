"""Partition planning and offset arithmetic for the Spark connector. Pure: no I/O, no pyspark.

A `ReadRange` is an inclusive entry range of one ledger, with everything `read()` needs to
fetch it (the stream it belongs to, the seq of its first entry, the ledger password). A Spark
input partition is a run of them (`plan_partitions`): planning maps a stream's seq range onto
its segments, splits ranges above the partition size (entries and estimated bytes), gathers
consecutive small ones (a stream that rolls often has many small ledgers; a task per ledger
would cost more in task overhead than in reading), then halves the largest partitions until
there are `minPartitions`.

Streaming offsets are `{"namespace/stream": next_seq}`: the seq of the first record *not*
yet covered, per stream. A seq names a record for the life of a stream (ledger ids need not
grow along it), so offsets survive rolls, and a restart from a checkpoint re-plans exactly the
same records.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter

from bkaio.stream.model import Segment


@dataclass(frozen=True, slots=True)
class ReadRange:
    """Entries first..last (inclusive) of one ledger: one Spark partition."""

    stream: str | None  # "namespace/stream"; None for a raw ledger.
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    first_seq: int  # Seq of first_entry_id; -1 for a raw ledger (seq column is null).
    bytes_estimate: int = 0  # 0: unknown (an open ledger).
    password: bytes = b""

    def __post_init__(self) -> None:
        assert 0 <= self.first_entry_id <= self.last_entry_id, self

    @property
    def entry_count(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1

    def split_at(self, entry_id: int) -> tuple[ReadRange, ReadRange]:
        """[first, entry_id) and [entry_id, last], the bytes estimate shared pro rata."""
        assert self.first_entry_id < entry_id <= self.last_entry_id, (self, entry_id)
        head_count = entry_id - self.first_entry_id
        head_bytes = self.bytes_estimate * head_count // self.entry_count
        head = replace(self, last_entry_id=entry_id - 1, bytes_estimate=head_bytes)
        tail_first_seq = self.first_seq + head_count if self.first_seq >= 0 else -1
        tail = replace(
            self,
            first_entry_id=entry_id,
            first_seq=tail_first_seq,
            bytes_estimate=self.bytes_estimate - head_bytes,
        )
        return head, tail


def stream_ranges(
    stream: str,
    segments: Sequence[Segment],
    start_seq: int,
    end_seq: int,
    password: bytes,
) -> list[ReadRange]:
    """The ledger ranges holding seqs [start_seq, end_seq) of a stream, in seq order.

    `end_seq` must not pass what is readable: for an open last segment the caller derives it
    from the ledger's LAC. Empty segments contribute nothing.
    """
    ranges: list[ReadRange] = []
    if end_seq <= start_seq:
        return ranges
    for segment in segments:
        segment_end = end_seq if segment.is_open else min(end_seq, segment.last_seq + 1)
        first = max(start_seq, segment.first_seq)
        if first >= segment_end:
            continue
        count = segment.record_count if not segment.is_open else 0
        share = segment.bytes * (segment_end - first) // count if count > 0 else 0
        ranges.append(
            ReadRange(
                stream=stream,
                ledger_id=segment.ledger_id,
                first_entry_id=first - segment.first_seq,
                last_entry_id=segment_end - 1 - segment.first_seq,
                first_seq=first,
                bytes_estimate=share,
                password=password,
            )
        )
    return ranges


def split_ranges(
    ranges: Sequence[ReadRange],
    *,
    max_entries: int,
    max_bytes: int,
    min_partitions: int = 0,
) -> list[ReadRange]:
    """Split each range into even pieces of at most `max_entries` entries and (by the bytes
    estimate) `max_bytes`; then halve the largest until there are `min_partitions`."""
    assert max_entries >= 1 and max_bytes >= 1, (max_entries, max_bytes)
    pieces: list[ReadRange] = []
    for item in ranges:
        count = item.entry_count
        parts = max(math.ceil(count / max_entries), math.ceil(item.bytes_estimate / max_bytes), 1)
        parts = min(parts, count)
        rest = item
        for index in range(parts - 1):
            size = (count * (index + 1)) // parts - (count * index) // parts
            head, rest = rest.split_at(rest.first_entry_id + size)
            pieces.append(head)
        pieces.append(rest)
    if 0 < len(pieces) < min_partitions:
        # Each piece a partition of one range: halving one splits its range in the middle.
        halved = _halve_largest([[piece] for piece in pieces], min_partitions)
        pieces = [piece for partition in halved for piece in partition]
    return pieces


def plan_partitions(
    ranges: Sequence[ReadRange],
    *,
    max_entries: int,
    max_bytes: int,
    min_partitions: int = 0,
) -> list[tuple[ReadRange, ...]]:
    """Spark partitions of `ranges` (kept in order): each a run of ranges of at most
    `max_entries` entries and (by the estimates) `max_bytes` bytes, at least `min_partitions`
    of them while a partition can be split."""
    pieces = split_ranges(ranges, max_entries=max_entries, max_bytes=max_bytes)
    partitions: list[list[ReadRange]] = []
    entries = size = 0
    for piece in pieces:
        if partitions and (
            entries + piece.entry_count <= max_entries and size + piece.bytes_estimate <= max_bytes
        ):
            partitions[-1].append(piece)
            entries += piece.entry_count
            size += piece.bytes_estimate
        else:
            partitions.append([piece])
            entries, size = piece.entry_count, piece.bytes_estimate
    if 0 < len(partitions) < min_partitions:
        partitions = _halve_largest(partitions, min_partitions)
    return [tuple(p) for p in partitions]


def _halve_largest(partitions: list[list[ReadRange]], wanted: int) -> list[list[ReadRange]]:
    """`partitions` with the largest halved (the first of equals) until there are `wanted`,
    or every one holds a single entry. A heap of (-entries, place, partition): each halving
    costs O(log n), not a pass over all partitions (minPartitions=10000 took minutes). A
    place is a path, (i,) for the i-th and place + (0,) / (1,) for the halves of one, so
    places sort in seq order and never tie."""
    heap: list[tuple[int, tuple[int, ...], list[ReadRange]]] = [
        (-sum(r.entry_count for r in partition), (index,), partition)
        for index, partition in enumerate(partitions)
    ]
    heapq.heapify(heap)
    while len(heap) < wanted and -heap[0][0] >= 2:  # Else: no more splits possible.
        negative, place, partition = heapq.heappop(heap)
        entries = -negative
        head, tail = _halve(partition, entries)
        heapq.heappush(heap, (-(entries // 2), (*place, 0), head))
        heapq.heappush(heap, (-(entries - entries // 2), (*place, 1), tail))
    return [partition for _, _, partition in sorted(heap, key=itemgetter(1))]


def _halve(partition: list[ReadRange], entries: int) -> tuple[list[ReadRange], list[ReadRange]]:
    """Two runs of about half the entries each, splitting a range where the middle falls."""
    half = entries // 2
    head: list[ReadRange] = []
    for index, item in enumerate(partition):
        if half >= item.entry_count:
            head.append(item)
            half -= item.entry_count
            continue
        if half == 0:
            return head, partition[index:]
        first, second = item.split_at(item.first_entry_id + half)
        return [*head, first], [second, *partition[index + 1 :]]
    raise AssertionError(f"half of {entries} entries not found in {partition}")


def limit_offsets(
    start: Mapping[str, int],
    end: Mapping[str, int],
    *,
    max_entries: int | None,
    max_bytes: int | None,
    entry_bytes: Mapping[str, float] | None = None,
) -> dict[str, int]:
    """`end`, pulled back so that at most `max_entries` records and (by each stream's average
    entry size in `entry_bytes`) about `max_bytes` bytes lie between `start` and it.

    The budget is shared in proportion to each stream's backlog; every stream with a backlog
    advances by at least one record, so a trigger always makes progress.
    """
    backlog = {name: max(0, seq - start.get(name, seq)) for name, seq in end.items()}
    total = sum(backlog.values())
    if total == 0:
        return dict(end)
    fraction = 1.0
    if max_entries is not None:
        fraction = min(fraction, max_entries / total)
    if max_bytes is not None and entry_bytes:
        total_bytes = sum(backlog[n] * entry_bytes.get(n, 0.0) for n in backlog)
        if total_bytes > 0:
            fraction = min(fraction, max_bytes / total_bytes)
    if fraction >= 1.0:
        return dict(end)
    limited: dict[str, int] = {}
    for name, seq in end.items():
        first = start.get(name, seq)
        if backlog[name] == 0:
            limited[name] = seq
            continue
        take = max(1, math.floor(backlog[name] * fraction))
        limited[name] = min(seq, first + take)
    return limited
