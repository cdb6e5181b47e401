"""Reading one partition from the bookies into Arrow record batches (executor side).

A partition's ranges are read with the client's range reads (`ReadHandle.read_batches`: range
requests to every bookie of the ensemble, read ahead of the consumer), and each batch becomes
one `pyarrow.RecordBatch` (several when its payload passes read_batch_bytes) built column by
column: ids from numpy, the stream and ledger columns as repeats, the payloads in one
conversion; no Python object per cell. The client checks every entry's CRC32C digest and
fails over between replicas, so what comes out here is what the writer wrote. Rows follow
`SCHEMA_DDL`; `seq` and `stream` are null for raw ledgers.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import structlog

from bkaio.errors import NoSuchEntryError, NoSuchLedgerError
from bkaio.ledger_client import BookKeeper, Entry, ReadHandle
from bkaio.ledger_client.types import ClientConfig
from bkaio.spark.errors import DataLossError
from bkaio.spark.options import ReadOptions
from bkaio.spark.planner import ReadRange
from bkaio.spark.runtime import get_runtime

if TYPE_CHECKING:
    import pyarrow

log = structlog.get_logger(__name__)

_payload_of = itemgetter(2)  # Of an `Entry` (a NamedTuple): its payload, without a Python call.
SCHEMA_DDL = "stream string, ledger_id long, entry_id long, seq long, payload binary"
COLUMNS = ("stream", "ledger_id", "entry_id", "seq", "payload")
# An open segment is read in runs of this many batches (read ahead within a run), each run's
# batches sized by the entries read in the run before.
_BATCHES_PER_RUN = 8


def arrow_schema() -> pyarrow.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("stream", pa.string()),
            ("ledger_id", pa.int64()),
            ("entry_id", pa.int64()),
            ("seq", pa.int64()),
            ("payload", pa.binary()),
        ]
    )


async def read_entries(
    bk: BookKeeper,
    item: ReadRange,
    batch_entries: int,
    fail_on_data_loss: bool,
    *,
    batch_bytes: int,
) -> AsyncIterator[list[Entry]]:
    """The range's entries in order, in batches of about `batch_entries` (`batch_entries`
    per bookie of a striped ledger), fewer when the range's bytes estimate (a sealed
    segment's) says that many would pass `batch_bytes` of payload."""
    try:
        handle = await bk.open_ledger(item.ledger_id, password=item.password, recovery=False)
    except NoSuchLedgerError:
        _deleted_ledger(item, fail_on_data_loss, "before it was read")
        return
    try:
        async for entries in _read_open(handle, item, batch_entries, batch_bytes):
            yield entries
    except (NoSuchLedgerError, NoSuchEntryError) as error:
        # A ledger deleted once opened: its bookies drop its entries at their next GC and
        # answer "no such entry". Data loss only when the metadata says it is gone (an entry
        # missing from a ledger that exists is the client's error, as raised).
        if not await _ledger_gone(bk, item.ledger_id):
            raise
        _deleted_ledger(item, fail_on_data_loss, "while it was read", error)


async def _read_open(
    handle: ReadHandle, item: ReadRange, batch_entries: int, batch_bytes: int
) -> AsyncIterator[list[Entry]]:
    # The planner ends an open segment at the last record acknowledged to its writer
    # (`stream.ends.end_seq`), which the bookies' LAC lags until the next add or WRITE_LAC
    # carries it (never, when the writer died): learn that end here too, or the range read
    # refuses the last entries as beyond the LAC.
    last = item.last_entry_id
    if not handle.is_closed and last > await handle.read_last_add_confirmed():
        await handle.read_last_acknowledged()
    # A striped ledger's batch holds batch_entries per bookie of its ensemble.
    md = handle.metadata
    stripes = 1 if md.ensemble_size == md.write_quorum else md.ensemble_size

    def fitting(entries: int, payload: int) -> int:
        """Entries per bookie in a batch of about batch_bytes, at `payload / entries` each."""
        return max(1, min(batch_entries, int(batch_bytes * entries / payload) // stripes))

    if item.bytes_estimate > 0:  # A sealed segment: its size is known.
        per_batch = fitting(item.entry_count, item.bytes_estimate)
        async for entries in _read_batches(handle, item.first_entry_id, last, per_batch):
            yield entries
        return
    # An open segment's size is known only once read: a first batch of one entry per bookie,
    # then runs of _BATCHES_PER_RUN batches, each run's sized by the entries of the one before
    # (a batch of batchEntries entries of 1 MiB each was 4 GiB in the executor's memory).
    first, per_batch, batches = item.first_entry_id, 1, 1
    while first <= last:
        end = min(last, first + per_batch * stripes * batches - 1)
        count = payload = 0
        async for entries in _read_batches(handle, first, end, per_batch):
            count += len(entries)
            payload += sum(map(len, map(_payload_of, entries)))
            yield entries
        first, batches = end + 1, _BATCHES_PER_RUN
        per_batch = fitting(count, payload) if payload > 0 else batch_entries


async def _read_batches(
    handle: ReadHandle, first: int, last: int, per_batch: int
) -> AsyncIterator[list[Entry]]:
    batches = handle.read_batches(first, last, batch_entries=per_batch)
    try:
        async for entries in batches:
            yield entries
    finally:
        await batches.aclose()


async def _ledger_gone(bk: BookKeeper, ledger_id: int) -> bool:
    try:
        await bk.get_ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        return True
    return False


def _deleted_ledger(
    item: ReadRange, fail_on_data_loss: bool, when: str, error: BaseException | None = None
) -> None:
    """DataLossError for a deleted ledger the plan named, or (failOnDataLoss=false) a warning:
    the rest of its range is skipped."""
    where = (
        f"ledger {item.ledger_id} (entries {item.first_entry_id}..{item.last_entry_id}"
        f" of {item.stream or 'no stream'})"
    )
    if fail_on_data_loss:
        raise DataLossError(
            f"{where} was deleted {when}; set failOnDataLoss=false to skip it"
        ) from error
    log.warning(
        "spark_read_skips_deleted_ledger",
        ledger_id=item.ledger_id,
        stream=item.stream,
        when=when,
        error=None if error is None else str(error),
    )


def runs_of_bytes(entries: list[Entry], max_bytes: int) -> Iterator[list[Entry]]:
    """`entries` in runs of at most `max_bytes` of payload (an entry larger than that alone):
    an Arrow binary column holds at most 2 GiB, and an executor's memory not much more."""
    sizes = list(map(len, map(_payload_of, entries)))
    if sum(sizes) <= max_bytes:
        yield entries
        return
    start = total = 0
    for index, size in enumerate(sizes):
        if total + size > max_bytes and index > start:
            yield entries[start:index]
            start, total = index, 0
        total += size
    yield entries[start:]


def to_record_batch(item: ReadRange, entries: list[Entry]) -> pyarrow.RecordBatch:
    import numpy as np
    import pyarrow as pa

    count = len(entries)
    first_entry = entries[0].entry_id
    entry_ids = np.arange(first_entry, first_entry + count, dtype=np.int64)
    seqs: Any
    if item.first_seq >= 0:
        seqs = pa.array(entry_ids + (item.first_seq - item.first_entry_id))
    else:
        seqs = pa.nulls(count, pa.int64())
    if item.stream is not None:
        streams = pa.repeat(pa.scalar(item.stream, pa.string()), count)
    else:
        streams = pa.nulls(count, pa.string())
    return pa.RecordBatch.from_arrays(
        [
            streams,
            pa.repeat(pa.scalar(item.ledger_id, pa.int64()), count),
            pa.array(entry_ids),
            seqs,
            pa.array(list(map(_payload_of, entries)), pa.binary()),
        ],
        schema=arrow_schema(),
    )


def read_partition(
    options: ReadOptions, ranges: Sequence[ReadRange]
) -> Iterator[pyarrow.RecordBatch]:
    """Arrow record batches of one partition's ranges, in order, read on this process's loop
    (`bkaio.spark.runtime`)."""
    if not ranges:
        return iter(())
    runtime = get_runtime()
    # A record batch holds at most about this much payload: what the client asks of a bookie
    # at once (bkaio.client.read_batch_bytes).
    batch_bytes = ClientConfig(**options.client).read_batch_bytes

    async def batches() -> AsyncGenerator[pyarrow.RecordBatch, None]:
        async with runtime.client(options.metadata, options.client) as bk:
            for item in ranges:
                async for entries in read_entries(
                    bk,
                    item,
                    options.batch_entries,
                    options.fail_on_data_loss,
                    batch_bytes=batch_bytes,
                ):
                    for run in runs_of_bytes(entries, batch_bytes):
                        yield to_record_batch(item, run)

    return runtime.iterate(batches())
