"""The Spark side of the tests: a stream read as a batch or a streaming `DataFrame`, a frame
appended to a stream, and a streaming query run once over what is available (into parquet or
another sink)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter


def batch_frame(spark: SparkSession, uri: str, name: str, **options: str) -> DataFrame:
    """`spark.read.format("bkaio")` of stream `name` ("namespace/stream"), with `options`."""
    return (
        spark.read.format("bkaio")
        .option("metadata", uri)
        .option("stream", name)
        .options(**options)
        .load()
    )


def streaming_frame(
    spark: SparkSession, uri: str, name: str, *, max_entries_per_trigger: int
) -> DataFrame:
    """`spark.readStream.format("bkaio")` of stream `name`, so many entries a micro-batch."""
    return (
        spark.readStream.format("bkaio")
        .option("metadata", uri)
        .option("stream", name)
        .option("maxEntriesPerTrigger", str(max_entries_per_trigger))
        .load()
    )


def append_frame(frame: DataFrame, uri: str, name: str) -> None:
    """A batch write of `frame` (a `payload` column) to the end of stream `name`."""
    frame.write.format("bkaio").option("metadata", uri).option("stream", name).mode("append").save()


def stream_to_parquet(
    spark: SparkSession,
    uri: str,
    name: str,
    out: Path,
    checkpoint: Path,
    *,
    max_entries_per_trigger: int,
) -> StreamingQuery:
    """One availableNow run of stream `name` -> parquet files in `out`, resuming from (and
    recording in) `checkpoint`; the query, ended."""
    frame = streaming_frame(spark, uri, name, max_entries_per_trigger=max_entries_per_trigger)
    return run_available_now(
        frame.writeStream.format("parquet").option("path", str(out)), checkpoint
    )


def run_available_now(writer: DataStreamWriter, checkpoint: Path) -> StreamingQuery:
    """`writer` started with `checkpoint`, once over all that is available now; the query, ended."""
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()
    return query
