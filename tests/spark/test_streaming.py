"""Structured Streaming: `readStream.format("bkaio")` across ledger rolls and restarts, and the
streaming sink."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.spark.conftest import Cluster, stream_segments, wait_readable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def event(seq: int) -> bytes:
    return f'{{"n": {seq}, "pad": "{"p" * 40}"}}'.encode()


def run_available_now(spark: SparkSession, uri: str, name: str, out: Path, checkpoint: Path) -> int:
    """One availableNow run of stream -> parquet; the number of micro-batches it made."""
    query = (
        spark.readStream.format("bkaio")
        .option("metadata", uri)
        .option("stream", name)
        .option("maxEntriesPerTrigger", "70")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)


def test_stream_read_across_rolls_and_a_restart_gives_each_record_once(
    spark: SparkSession, bk_cluster: Cluster, tmp_path: Path
) -> None:
    from bkaio.stream import open_namespace

    namespace = bk_cluster.new_namespace()
    name = f"{namespace}/events"
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    async def open_writer() -> object:
        ns = await open_namespace(await bk_cluster.client(), namespace)
        return await ns.open_writer("events", roll_bytes=2_000)

    writer = bk_cluster.run(open_writer())

    async def write(first: int, count: int) -> None:
        await asyncio.gather(*(writer.write(event(i)) for i in range(first, first + count)))  # type: ignore[attr-defined]

    bk_cluster.run(write(0, 100))
    wait_readable(bk_cluster, namespace, "events", 100)
    assert run_available_now(spark, bk_cluster.uri, name, out, checkpoint) >= 2
    assert spark.read.parquet(str(out)).count() == 100

    bk_cluster.run(write(100, 150))  # More rolls while the query is down; the writer stays open.
    wait_readable(bk_cluster, namespace, "events", 250)
    run_available_now(spark, bk_cluster.uri, name, out, checkpoint)
    bk_cluster.run(writer.close())  # type: ignore[attr-defined]

    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.seq for r in rows) == list(range(250))  # No duplicate, no gap.
    assert {r.seq: bytes(r.payload) for r in rows} == {i: event(i) for i in range(250)}
    assert len({r.ledger_id for r in rows}) >= 5
    assert len(stream_segments(bk_cluster, namespace, "events")) >= 5


def test_streaming_sink_copies_a_stream(
    spark: SparkSession, bk_cluster: Cluster, tmp_path: Path
) -> None:
    from tests.spark.conftest import write_stream

    namespace = bk_cluster.new_namespace()
    payloads = [event(i) for i in range(300)]
    write_stream(bk_cluster, namespace, "in", payloads, roll_bytes=5_000)
    checkpoint = tmp_path / "checkpoint"
    for _ in range(2):  # The second run finds nothing new and must add nothing.
        query = (
            spark.readStream.format("bkaio")
            .option("metadata", bk_cluster.uri)
            .option("stream", f"{namespace}/in")
            .option("maxEntriesPerTrigger", "120")
            .load()
            .select("payload")
            .writeStream.format("bkaio")
            .option("metadata", bk_cluster.uri)
            .option("stream", f"{namespace}/out")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    copied = (
        spark.read.format("bkaio")
        .option("metadata", bk_cluster.uri)
        .option("stream", f"{namespace}/out")
        .load()
        .collect()
    )
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
