"""What a query reads, resolved against the metadata: streams, their bounds, ledger ranges.

Async, run on the connector's loop (`bkaio.spark.runtime`) by the planner hooks. Turns the
typed options into concrete seq bounds per stream and into `ReadRange`s (planner.py), and
applies `failOnDataLoss`: a start before a stream's first available seq (truncated) or a
ledger that no longer exists is a `DataLossError`, or is skipped when the option is false.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import structlog

from bkaio.errors import NoSuchLedgerError
from bkaio.ledger_client import BookKeeper
from bkaio.spark.errors import DataLossError, SparkOptionError
from bkaio.spark.options import (
    EARLIEST,
    EARLIEST_SEQ,
    LATEST,
    LATEST_SEQ,
    OffsetSpec,
    ReadOptions,
    StreamBound,
    split_stream_name,
)
from bkaio.spark.planner import ReadRange, plan_partitions, stream_ranges
from bkaio.stream.ends import end_seq
from bkaio.stream.errors import StreamNotFoundError
from bkaio.stream.model import StreamMeta
from bkaio.stream.segments import STREAM_PASSWORD
from bkaio.stream.store import StreamStore, metadata_of

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class StreamState:
    """A stream as seen now: its record, first available seq and readable end."""

    name: str
    meta: StreamMeta
    first_seq: int
    end_seq: int  # The seq the next record will get, as far as the bookies confirm.

    @property
    def entry_bytes(self) -> float:
        """Average record size over the sealed segments (0.0 when none is sealed)."""
        sealed = [s for s in self.meta.segments if not s.is_open and s.record_count > 0]
        count = sum(s.record_count for s in sealed)
        return sum(s.bytes for s in sealed) / count if count else 0.0


async def resolve_streams(bk: BookKeeper, options: ReadOptions) -> list[str]:
    """The "namespace/stream" names the options select, sorted. A named stream that does not
    exist is an error; a pattern may match none (yet)."""
    store = StreamStore(metadata_of(bk))
    if options.streams_pattern is None:
        for name in options.streams:
            namespace, stream = split_stream_name(name)
            if await store.find_stream(namespace, stream) is None:
                raise StreamNotFoundError(f"bkaio read: stream {name} does not exist")
        return sorted(set(options.streams))
    pattern = re.compile(options.streams_pattern)
    names: list[str] = []
    for namespace in await store.list_namespaces():
        for stream in await store.list_streams(namespace):
            name = f"{namespace}/{stream}"
            if pattern.fullmatch(name):
                names.append(name)
    return sorted(names)


async def stream_state(bk: BookKeeper, name: str) -> StreamState:
    namespace, stream = split_stream_name(name)
    meta = await StreamStore(metadata_of(bk)).get_stream(namespace, stream)
    return StreamState(name, meta, meta.first_seq, await end_seq(bk, meta))


def resolve_bound(state: StreamState, bound: StreamBound, key: str) -> int:
    """A seq for `bound` in this stream (not yet checked against the available range)."""
    if bound == EARLIEST_SEQ:
        return state.first_seq
    if bound == LATEST_SEQ:
        return state.end_seq
    if isinstance(bound, int):
        return bound
    ledger_id, entry_id = bound
    for segment in state.meta.segments:
        if segment.ledger_id != ledger_id:
            continue
        # A sealed segment's entries end at its record count: the position just past its last
        # entry is the next segment's first record; one further would be counted on into it.
        if not segment.is_open and entry_id > segment.record_count:
            raise SparkOptionError(
                f"option {key}: entry {entry_id} of ledger {ledger_id} is past the end of that "
                f"segment of stream {state.name} (entries 0..{segment.record_count - 1}); "
                "give a seq instead"
            )
        return segment.first_seq + entry_id
    raise SparkOptionError(
        f"option {key}: ledger {ledger_id} is not a segment of stream {state.name} "
        f"(its first available seq is {state.first_seq}); give a seq instead"
    )


def bound_for(spec: OffsetSpec, name: str, default: StreamBound) -> StreamBound:
    if spec == EARLIEST:
        return EARLIEST_SEQ
    if spec == LATEST:
        return LATEST_SEQ
    assert isinstance(spec, dict)
    return spec.get(name, default)


def check_offset_streams(options: ReadOptions, names: list[str]) -> None:
    """Refuse JSON offsets naming a stream the query does not read (as Kafka's source does):
    a misspelt name would otherwise leave its stream at the default bound unnoticed."""
    for key, spec in (("startingOffsets", options.starting), ("endingOffsets", options.ending)):
        if not isinstance(spec, dict):
            continue
        unknown = sorted(set(spec) - set(names))
        if unknown:
            raise SparkOptionError(
                f"option {key} names stream(s) {', '.join(unknown)} that this query does not "
                f"read; it reads: {', '.join(names) or 'none (no stream matches yet)'}"
            )


def check_start(state: StreamState, start: int, fail_on_data_loss: bool) -> int:
    """`start`, or the first available seq when it was truncated and data loss is allowed."""
    if start >= state.first_seq:
        return start
    if fail_on_data_loss:
        raise DataLossError(
            f"stream {state.name}: seqs {start}..{state.first_seq - 1} were truncated (the "
            f"first available seq is {state.first_seq}); set failOnDataLoss=false to skip them"
        )
    log.warning("spark_read_skips_truncated", stream=state.name, start=start, to=state.first_seq)
    return state.first_seq


async def plan_batch(bk: BookKeeper, options: ReadOptions) -> list[tuple[ReadRange, ...]]:
    """Every partition of a batch read, in (stream, seq) or (ledger id) order."""
    if options.ledgers:
        ranges = await ledger_ranges(bk, options)
    else:
        ranges = []
        names = await resolve_streams(bk, options)
        check_offset_streams(options, names)
        for name in names:
            state = await stream_state(bk, name)
            start = resolve_bound(
                state, bound_for(options.starting, name, EARLIEST_SEQ), "startingOffsets"
            )
            end = resolve_bound(state, bound_for(options.ending, name, LATEST_SEQ), "endingOffsets")
            if start > end:
                raise SparkOptionError(
                    f"bkaio read of {name}: startingOffsets (seq {start}) is past endingOffsets "
                    f"(seq {end}, exclusive): nothing lies between them"
                )
            start = check_start(state, start, options.fail_on_data_loss)
            end = min(end, state.end_seq)
            ranges += stream_ranges(name, state.meta.segments, start, end, STREAM_PASSWORD)
    return plan_partitions(
        ranges,
        max_entries=options.max_entries_per_partition,
        max_bytes=options.max_bytes_per_partition,
        min_partitions=options.min_partitions,
    )


async def ledger_ranges(bk: BookKeeper, options: ReadOptions) -> list[ReadRange]:
    """Whole raw ledgers: a closed one to its last entry, an open one to its LAC."""
    ranges: list[ReadRange] = []
    for ledger_id in options.ledgers:
        try:
            md = await bk.get_ledger_metadata(ledger_id)
            if md.is_closed:
                last, length = md.last_entry_id, md.length
            else:
                handle = await bk.open_ledger(ledger_id, password=options.password, recovery=False)
                last, length = await handle.read_last_add_confirmed(), 0
        except NoSuchLedgerError:
            if options.fail_on_data_loss:
                raise DataLossError(
                    f"bkaio read: ledger {ledger_id} does not exist (deleted?); set "
                    "failOnDataLoss=false to skip missing ledgers"
                ) from None
            log.warning("spark_read_skips_missing_ledger", ledger_id=ledger_id)
            continue
        if last >= 0:
            ranges.append(ReadRange(None, ledger_id, 0, last, -1, length, options.password))
    return ranges


async def plan_stream_batch(
    bk: BookKeeper, options: ReadOptions, start: dict[str, int], end: dict[str, int]
) -> list[tuple[ReadRange, ...]]:
    """The partitions of one micro-batch: seqs [start[s], end[s]) of every stream s."""
    ranges: list[ReadRange] = []
    store = StreamStore(metadata_of(bk))
    for name in sorted(end):
        namespace, stream = split_stream_name(name)
        meta = await store.find_stream(namespace, stream)
        first = start.get(name, meta.first_seq if meta is not None else 0)
        if end[name] <= first:
            continue
        if meta is None:
            if options.fail_on_data_loss:
                raise DataLossError(
                    f"stream {name} was deleted with seqs {first}..{end[name] - 1} unread; set "
                    "failOnDataLoss=false to skip them"
                )
            continue
        state = StreamState(name, meta, meta.first_seq, end[name])
        first = check_start(state, first, options.fail_on_data_loss)
        ranges += stream_ranges(name, meta.segments, first, end[name], STREAM_PASSWORD)
    return plan_partitions(
        ranges,
        max_entries=options.max_entries_per_partition,
        max_bytes=options.max_bytes_per_partition,
        min_partitions=options.min_partitions,
    )


async def initial_offsets(bk: BookKeeper, options: ReadOptions) -> dict[str, int]:
    """Where a new streaming query starts: startingOffsets resolved per stream."""
    offsets: dict[str, int] = {}
    names = await resolve_streams(bk, options)
    check_offset_streams(options, names)
    for name in names:
        state = await stream_state(bk, name)
        seq = resolve_bound(
            state, bound_for(options.starting, name, EARLIEST_SEQ), "startingOffsets"
        )
        offsets[name] = min(check_start(state, seq, options.fail_on_data_loss), state.end_seq)
    return offsets


async def latest_offsets(
    bk: BookKeeper, options: ReadOptions, known: dict[str, int], *, require_named: bool = True
) -> tuple[dict[str, int], dict[str, int], dict[str, float]]:
    """(start, end, average entry bytes) per stream, now. `start` is `known`, plus the first
    available seq of streams that appeared since (a pattern's new match starts at its start).

    A stream of `known` that is gone was deleted under the query: DataLossError (what was
    written after its offset was never read), or with failOnDataLoss=false it stays where it
    was; so does one whose end is behind its offset (deleted and created again). A named
    stream the query never read must exist, unless `require_named` is false (the ends of
    Trigger.AvailableNow, fixed before Spark tells what the query read: it is skipped)."""
    start = dict(known)
    end: dict[str, int] = {}
    sizes: dict[str, float] = {}
    if options.streams_pattern is None:
        listed = set(options.streams)  # Not resolve_streams: a deleted one is handled below.
    else:
        listed = set(await resolve_streams(bk, options))
    for name in sorted(listed | set(known)):
        try:
            state = await stream_state(bk, name)
        except StreamNotFoundError:
            if name in known:
                end[name] = _deleted_stream(name, known[name], options.fail_on_data_loss)
            elif options.streams_pattern is None and require_named:
                raise  # Named, never read, and not there.
            continue  # A pattern's match deleted since the listing: never read, not read now.
        start.setdefault(name, state.first_seq)
        if state.end_seq < start[name]:
            # A stream's end never moves back: this one was deleted and created again (seqs
            # from 0), and its records below the offset would never be read.
            _recreated_stream(name, state.end_seq, start[name], options.fail_on_data_loss)
        end[name] = max(state.end_seq, start[name])
        sizes[name] = state.entry_bytes
    return start, end, sizes


def _recreated_stream(name: str, end: int, offset: int, fail_on_data_loss: bool) -> None:
    message = (
        f"stream {name} ends at seq {end}, before the query's offset, seq {offset}: it was "
        "deleted and created again, and its records up to that offset are not read"
    )
    if fail_on_data_loss:
        raise DataLossError(f"{message}; set failOnDataLoss=false to skip them")
    log.warning("spark_read_skips_recreated_stream", stream=name, end=end, seq=offset)


def _deleted_stream(name: str, offset: int, fail_on_data_loss: bool) -> int:
    """The end of a stream deleted under the query, which had read it up to `offset`."""
    if fail_on_data_loss:
        raise DataLossError(
            f"stream {name} was deleted while the query read it (up to seq {offset}); what "
            "was written to it after that is lost; set failOnDataLoss=false to go on without it"
        )
    log.warning("spark_read_skips_deleted_stream", stream=name, seq=offset)
    return offset  # Stays where it was.
