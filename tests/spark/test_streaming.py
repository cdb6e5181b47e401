"""Structured Streaming: `readStream.format("bkaio")` across ledger rolls and restarts, and the
streaming sink."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.spark.cluster import (
    Cluster,
    open_writer,
    stream_segments,
    wait_readable,
    write_all,
    write_stream,
)
from tests.spark.queries import (
    batch_frame,
    run_available_now,
    stream_to_parquet,
    streaming_frame,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def event(seq: int) -> bytes:
    return f'{{"n": {seq}, "pad": "{"p" * 40}"}}'.encode()


def micro_batches_to_parquet(
    spark: SparkSession, uri: str, name: str, out: Path, checkpoint: Path
) -> int:
    """One availableNow run of stream -> parquet; the number of micro-batches it made."""
    query = stream_to_parquet(spark, uri, name, out, checkpoint, max_entries_per_trigger=70)
    return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)


def test_stream_read_across_rolls_and_a_restart_gives_each_record_once(
    spark: SparkSession, bk_cluster: Cluster, tmp_path: Path
) -> None:
    namespace = bk_cluster.new_namespace()
    name = f"{namespace}/events"
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    writer = open_writer(bk_cluster, namespace, "events", roll_bytes=2_000)
    bk_cluster.run(write_all(writer, [event(i) for i in range(100)]))
    wait_readable(bk_cluster, namespace, "events", 100)
    assert micro_batches_to_parquet(spark, bk_cluster.uri, name, out, checkpoint) >= 2
    assert spark.read.parquet(str(out)).count() == 100

    # More rolls while the query is down; the writer stays open.
    bk_cluster.run(write_all(writer, [event(i) for i in range(100, 250)]))
    wait_readable(bk_cluster, namespace, "events", 250)
    micro_batches_to_parquet(spark, bk_cluster.uri, name, out, checkpoint)
    bk_cluster.run(writer.close())

    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.seq for r in rows) == list(range(250))  # No duplicate, no gap.
    assert {r.seq: bytes(r.payload) for r in rows} == {i: event(i) for i in range(250)}
    assert len({r.ledger_id for r in rows}) >= 5
    assert len(stream_segments(bk_cluster, namespace, "events")) >= 5


def test_streaming_sink_copies_a_stream(
    spark: SparkSession, bk_cluster: Cluster, tmp_path: Path
) -> None:
    namespace = bk_cluster.new_namespace()
    payloads = [event(i) for i in range(300)]
    write_stream(bk_cluster, namespace, "in", payloads, roll_bytes=5_000)
    checkpoint = tmp_path / "checkpoint"
    for _ in range(2):  # The second run finds nothing new and must add nothing.
        copy = (
            streaming_frame(spark, bk_cluster.uri, f"{namespace}/in", max_entries_per_trigger=120)
            .select("payload")
            .writeStream.format("bkaio")
            .option("metadata", bk_cluster.uri)
            .option("stream", f"{namespace}/out")
        )
        run_available_now(copy, checkpoint)
    copied = batch_frame(spark, bk_cluster.uri, f"{namespace}/out").collect()
    assert sorted(bytes(r.payload) for r in copied) == sorted(payloads)
    assert sorted(r.seq for r in copied) == list(range(300))
    assert sink_markers(bk_cluster, namespace) == 1  # checkpointLocation reached the sink.


def sink_markers(cluster: Cluster, namespace: str) -> int:
    """How many exactly-once markers the streaming sink keeps for `namespace/out`."""
    from bkaio.spark.sink import SINKS_PREFIX
    from bkaio.stream.store import metadata_of

    async def count() -> int:
        store = metadata_of(await cluster.client()).store
        return len(await store.list_prefix(f"{SINKS_PREFIX}{namespace}/out/"))

    return cluster.run(count())
