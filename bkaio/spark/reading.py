"""Reading one partition from the bookies into Arrow record batches (executor side).

The client checks every entry's CRC32C digest and fails over between replicas, so what comes
out here is what the writer wrote. Rows follow `SCHEMA_DDL`; `seq` and `stream` are null for
raw ledgers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import structlog

from bkaio.errors import NoSuchLedgerError
from bkaio.ledger_client import BookKeeper, Entry
from bkaio.spark.errors import DataLossError
from bkaio.spark.planner import ReadRange

if TYPE_CHECKING:
    import pyarrow

log = structlog.get_logger(__name__)

SCHEMA_DDL = "stream string, ledger_id long, entry_id long, seq long, payload binary"
COLUMNS = ("stream", "ledger_id", "entry_id", "seq", "payload")


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
    bk: BookKeeper, item: ReadRange, batch_entries: int, fail_on_data_loss: bool
) -> AsyncIterator[list[Entry]]:
    """The range's entries in order, `batch_entries` at a time."""
    try:
        handle = await bk.open_ledger(item.ledger_id, password=item.password, recovery=False)
    except NoSuchLedgerError:
        if fail_on_data_loss:
            raise DataLossError(
                f"ledger {item.ledger_id} (entries {item.first_entry_id}..{item.last_entry_id}"
                f" of {item.stream or 'no stream'}) was deleted before it was read; set "
                "failOnDataLoss=false to skip it"
            ) from None
        log.warning("spark_read_skips_deleted_ledger", ledger_id=item.ledger_id)
        return
    first = item.first_entry_id
    while first <= item.last_entry_id:
        last = min(item.last_entry_id, first + batch_entries - 1)
        entries = await handle.read(first, last)
        assert [e.entry_id for e in entries] == list(range(first, last + 1)), (first, last)
        yield entries
        first = last + 1


def to_record_batch(item: ReadRange, entries: list[Entry]) -> pyarrow.RecordBatch:
    import pyarrow as pa

    count = len(entries)
    first_entry = entries[0].entry_id
    seqs: Any
    if item.first_seq >= 0:
        base = item.first_seq - item.first_entry_id
        seqs = pa.array(range(base + first_entry, base + first_entry + count), pa.int64())
    else:
        seqs = pa.nulls(count, pa.int64())
    return pa.RecordBatch.from_arrays(
        [
            pa.array([item.stream] * count, pa.string()),
            pa.array([item.ledger_id] * count, pa.int64()),
            pa.array(range(first_entry, first_entry + count), pa.int64()),
            seqs,
            pa.array([e.payload for e in entries], pa.binary()),
        ],
        schema=arrow_schema(),
    )


def to_rows(item: ReadRange, entries: list[Entry]) -> list[tuple[Any, ...]]:
    """Plain tuples in `COLUMNS` order (for the Spark 3.5 RDD path)."""
    base = item.first_seq - item.first_entry_id
    return [
        (
            item.stream,
            item.ledger_id,
            e.entry_id,
            base + e.entry_id if item.first_seq >= 0 else None,
            e.payload,
        )
        for e in entries
    ]
