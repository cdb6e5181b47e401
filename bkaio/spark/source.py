"""`format("bkaio")`: the PySpark (4.x) Python Data Source: batch and streaming read and write.

Where each hook runs (docs/spark.md): `partitions()` and the streaming offset hooks run in
planner / streaming-runner Python processes, `read()` and `write()` in executor Python workers,
`commit()`/`abort()` on the driver side. Every object Spark pickles between them (readers,
writers, partitions, commit messages) holds plain data only; connections live in the
per-process runtime (`bkaio.spark.runtime`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)

from bkaio.errors import BKError
from bkaio.spark import catalog, sink
from bkaio.spark.errors import SparkOptionError
from bkaio.spark.options import ReadOptions, WriteOptions, parse_read_options, parse_write_options
from bkaio.spark.planner import ReadRange, limit_offsets
from bkaio.spark.reading import SCHEMA_DDL, arrow_schema, read_partition
from bkaio.spark.runtime import get_runtime

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql.types import StructType

try:  # Spark 4.2+: admission control and Trigger.AvailableNow.
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxBytes,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # Spark 4.0/4.1: rate limits come from the options alone.
    ReadAllAvailable = ReadMaxBytes = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in on Spark < 4.2 (the engine never calls it there)."""


SOURCE_NAME = "bkaio"


class BkaioPartition(InputPartition):
    """A run of `ReadRange`s (planner.plan_partitions); empty for the single partition of an
    empty read."""

    def __init__(self, value: tuple[ReadRange, ...]) -> None:
        super().__init__(value)


def _partitions(partitions: Sequence[tuple[ReadRange, ...]]) -> list[BkaioPartition]:
    return [BkaioPartition(p) for p in partitions] or [BkaioPartition(())]


class BkaioDataSource(DataSource):
    """`spark.read/readStream/write/writeStream.format("bkaio")`; see docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return BkaioBatchReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return BkaioStreamReader(parse_read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise SparkOptionError(
                "bkaio write: streams are append-only; use mode('append') (not overwrite)"
            )
        return BkaioBatchWriter(*_writer_setup(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return BkaioStreamWriter(*_writer_setup(self.options, schema))


def _check_schema(schema: StructType) -> None:
    """Refuse a schema set with `.schema(...)` other than the source's own (which is what Spark
    passes otherwise): the rows read have that one, and would fail each task's first batch."""
    from pyspark.sql.pandas.types import from_arrow_schema

    fixed = from_arrow_schema(arrow_schema())
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in fixed]:
        raise SparkOptionError(
            f"bkaio read: the source has a fixed schema, {fixed.simpleString()}; got "
            f"{schema.simpleString()}: leave .schema(...) out and select or cast after load()"
        )


# --------------------------------------------------------------------------- batch read


class BkaioBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[BkaioPartition]:
        runtime = get_runtime()

        async def plan() -> list[tuple[ReadRange, ...]]:
            async with runtime.client(self.options.metadata, self.options.client) as bk:
                return await catalog.plan_batch(bk, self.options)

        return _partitions(runtime.run(plan()))

    def read(self, partition: InputPartition) -> Iterator[pyarrow.RecordBatch]:
        return read_partition(self.options, partition.value)


# --------------------------------------------------------------------------- streaming read


class BkaioStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are `{"namespace/stream": next_seq}` (see planner.py)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._last_end: dict[str, int] | None = None  # For Spark < 4.2 (no start given).
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow's end.

    def _run(self, work: Any) -> Any:
        runtime = get_runtime()

        async def call() -> Any:
            async with runtime.client(self.options.metadata, self.options.client) as bk:
                return await work(bk)

        return runtime.run(call())

    def initialOffset(self) -> dict[str, int]:
        offsets: dict[str, int] = self._run(lambda bk: catalog.initial_offsets(bk, self.options))
        if self._last_end is None:
            self._last_end = dict(offsets)  # A new query: its first batch starts here.
        return offsets

    def getDefaultReadLimit(self) -> Any:
        if ReadMaxRows is not None and self.options.max_entries_per_trigger is not None:
            return ReadMaxRows(self.options.max_entries_per_trigger)
        if ReadMaxBytes is not None and self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        # Called before any offset: on a restart, what the query read is not known yet, and
        # a named stream deleted since is for latestOffset (and failOnDataLoss) to judge.
        known = self._last_end or {}
        _, end, _ = self._run(
            lambda bk: catalog.latest_offsets(bk, self.options, known, require_named=False)
        )
        self._target = end

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: Any = None
    ) -> dict[str, int]:
        max_entries = self.options.max_entries_per_trigger
        max_bytes = self.options.max_bytes_per_trigger
        if start is not None:
            known = start
        elif self._last_end is not None:
            known = self._last_end  # Spark < 4.2: where the previous batch (or the query) ends.
        else:
            # Spark < 4.2, a query restarted from its checkpoint: it starts from an offset it
            # does not tell. Every stream's end is at or past it (ends never move back), so
            # this batch goes to the end unlimited; a limit counted from anywhere else could
            # end it before its start, and the next batch would read those records again.
            known, max_entries, max_bytes = {}, None, None
        begin, end, sizes = self._run(lambda bk: catalog.latest_offsets(bk, self.options, known))
        if self._target is not None:
            end = {n: min(seq, self._target.get(n, begin[n])) for n, seq in end.items()}
            end = {n: max(seq, begin[n]) for n, seq in end.items()}
        if ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable):
            max_entries = max_bytes = None
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_entries = min(limit.max_rows, max_entries or limit.max_rows)
        elif ReadMaxBytes is not None and isinstance(limit, ReadMaxBytes):
            max_bytes = min(limit.max_bytes, max_bytes or limit.max_bytes)
        limited = limit_offsets(
            begin, end, max_entries=max_entries, max_bytes=max_bytes, entry_bytes=sizes
        )
        self._last_end = limited
        return limited

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[BkaioPartition]:
        partitions: list[tuple[ReadRange, ...]] = self._run(
            lambda bk: catalog.plan_stream_batch(bk, self.options, start, end)
        )
        self._last_end = dict(end)  # Spark < 4.2: the next batch starts here (also a replay's).
        return _partitions(partitions)

    def read(self, partition: InputPartition) -> Iterator[pyarrow.RecordBatch]:
        return read_partition(self.options, partition.value)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint (and this call lags a batch)."""

    def stop(self) -> None:
        """The runtime's client is shared by the process; it closes when the process exits."""


# --------------------------------------------------------------------------- write


@dataclass
class BkaioCommitMessage(WriterCommitMessage):
    """What one task wrote: its sealed private ledger (ledger_id -1: the task wrote nothing)."""

    ledger_id: int
    last_entry_id: int
    bytes: int
    partition_id: int

    def written(self) -> sink.WrittenLedger | None:
        if self.ledger_id < 0:
            return None
        return sink.WrittenLedger(self.ledger_id, self.last_entry_id, self.bytes)


def _payload_column(options: WriteOptions, schema: StructType) -> tuple[int, bool]:
    """(index, is_string) of the column whose values become records."""
    from pyspark.sql.types import BinaryType, StringType

    names = [f.name for f in schema.fields]
    if options.payload_column is not None:
        wanted = options.payload_column
    elif "payload" in names:
        wanted = "payload"
    elif "value" in names:
        wanted = "value"
    elif len(names) == 1:
        wanted = names[0]
    else:
        raise SparkOptionError(
            f"bkaio write: no 'payload' or 'value' column among {names}; select one binary or "
            "string column, or name it with option payloadColumn"
        )
    if wanted not in names:
        raise SparkOptionError(f"bkaio write: payloadColumn {wanted!r} is not among {names}")
    index = names.index(wanted)
    data_type = schema.fields[index].dataType
    if not isinstance(data_type, BinaryType | StringType):
        raise SparkOptionError(
            f"bkaio write: column {wanted!r} is {data_type.simpleString()}; it must be binary or "
            "string (cast it, or serialize with to_json/to_avro first)"
        )
    return index, isinstance(data_type, StringType)


def _writer_setup(
    raw: Any, schema: StructType
) -> tuple[WriteOptions, sink.Quorums, int, bool, str]:
    options = parse_write_options(raw)
    index, is_string = _payload_column(options, schema)
    runtime = get_runtime()

    async def quorums() -> sink.Quorums:
        async with runtime.client(options.metadata, options.client) as bk:
            return await sink.resolve_quorums(bk, options)

    return options, runtime.run(quorums()), index, is_string, uuid.uuid4().hex


class _TaskWriting:
    """The shared body of `write()`: a task's rows into its own ledger, or nothing at all."""

    def __init__(
        self,
        options: WriteOptions,
        quorums: sink.Quorums,
        column: int,
        is_string: bool,
        job_id: str,
    ) -> None:
        self.options = options
        self.quorums = quorums
        self.column = column
        self.is_string = is_string
        self.job_id = job_id

    def write_rows(self, rows: Iterator[Any]) -> BkaioCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else -1
        runtime = get_runtime()
        # Leased for the whole task (its rows come between `run()` calls), so the runtime
        # does not close it under the task when other queries' clients push it out.
        lease = runtime.run(runtime.lease(self.options.metadata, self.options.client))
        task = sink.TaskLedgerWriter(lease.bk, self.options, self.quorums, self.job_id)
        try:
            chunk: list[bytes] = []
            for number, row in enumerate(rows):
                chunk.append(self._payload(row, number, partition_id))
                if len(chunk) >= self.options.batch_entries:
                    runtime.run(task.append(chunk))
                    chunk = []
            runtime.run(task.append(chunk))
            written = runtime.run(task.finish())
        except BaseException:
            runtime.run(task.discard())  # Nothing this task wrote may ever be published.
            raise
        finally:
            runtime.run(runtime.release(lease))
        if written is None:
            return BkaioCommitMessage(-1, -1, 0, partition_id)
        return BkaioCommitMessage(
            written.ledger_id, written.last_entry_id, written.bytes, partition_id
        )

    def _payload(self, row: Any, number: int, partition_id: int) -> bytes:
        value = row[self.column]
        if value is None:
            raise SparkOptionError(
                f"bkaio write to {self.options.full_name}: row {number} of partition "
                f"{partition_id} has a null payload; filter nulls out first"
            )
        if self.is_string:
            return str(value).encode()
        return bytes(value)

    def written(self, messages: Sequence[Any]) -> list[sink.WrittenLedger]:
        found = (m.written() for m in messages if isinstance(m, BkaioCommitMessage))
        return [w for w in found if w is not None]

    def discard(self, messages: Sequence[Any]) -> None:
        """Abort: delete what the tasks reported and what the job registry still names."""
        runtime = get_runtime()
        ids = [w.ledger_id for w in self.written(messages)]

        async def discard() -> None:
            async with runtime.client(self.options.metadata, self.options.client) as bk:
                await sink.abort_job(bk, self.options, self.job_id, ids)

        runtime.run(discard())

    def publish(self, messages: Sequence[Any], batch_id: int | None) -> None:
        """Commit: publish the reported ledgers, then drop any other the job created."""
        runtime = get_runtime()
        written = self.written(messages)

        async def publish() -> None:
            async with runtime.client(self.options.metadata, self.options.client) as bk:
                if batch_id is None:
                    await sink.publish(bk, self.options, written)
                else:
                    await sink.publish_batch(bk, self.options, batch_id, written)
                await sink.finish_job(bk, self.job_id, keep=[w.ledger_id for w in written])

        runtime.run(publish())


class BkaioBatchWriter(_TaskWriting, DataSourceWriter):
    def write(self, iterator: Iterator[Any]) -> BkaioCommitMessage:
        return self.write_rows(iterator)

    def commit(self, messages: list[Any]) -> None:
        try:
            self.publish(messages, None)
        except BKError:
            self.discard(messages)
            raise

    def abort(self, messages: list[Any]) -> None:
        self.discard(messages)


class BkaioStreamWriter(_TaskWriting, DataSourceStreamWriter):
    def write(self, iterator: Iterator[Any]) -> BkaioCommitMessage:
        return self.write_rows(iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        self.publish(messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        self.discard(messages)
