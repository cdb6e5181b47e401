"""Batch reads through `spark.read.format("bkaio")` and the Spark 3.5 helper."""

from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING

import pytest

from tests.spark.cluster import (
    Cluster,
    job_tags,
    stream_segments,
    tagged_ledgers,
    write_stream,
)
from tests.spark.queries import append_frame, batch_frame

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

ENTRIES = 20_000


def payload(seq: int) -> bytes:
    return f"record-{seq:06d}-".encode() + bytes([seq % 251]) * 40


def test_batch_read_of_20k_entries_over_several_ledgers(
    spark: SparkSession, bk_cluster: Cluster
) -> None:
    """20k entries over 3+ ledgers and 4+ partitions: what a larger read would prove (ledger
    boundaries, partition splits, every seq once) at a fifth of the time."""
    namespace = bk_cluster.new_namespace()
    payloads = [payload(i) for i in range(ENTRIES)]
    write_stream(bk_cluster, namespace, "big", payloads, roll_bytes=300_000)
    assert len(stream_segments(bk_cluster, namespace, "big")) >= 3
    df = batch_frame(spark, bk_cluster.uri, f"{namespace}/big", maxEntriesPerPartition="6000")
    # Checked inside Spark (collecting every row costs more than reading them): every seq once,
    # each with its own payload, bound together by a CRC of payload + seq.
    summary = df.selectExpr(
        "count(*) AS rows",
        "count(DISTINCT seq) AS seqs",
        "min(seq) AS first",
        "max(seq) AS last",
        "sum(crc32(concat(payload, CAST(CAST(seq AS STRING) AS BINARY)))) AS checksum",
        "count(DISTINCT stream) AS streams",
    ).collect()[0]
    expected = sum(zlib.crc32(p + str(i).encode()) for i, p in enumerate(payloads))
    assert (summary.rows, summary.seqs, summary.first, summary.last) == (ENTRIES,) * 2 + (
        0,
        ENTRIES - 1,
    )
    assert (summary.checksum, summary.streams) == (expected, 1)
    head = df.where("seq < 1000").orderBy("seq").collect()  # And the order by seq, spot-checked.
    assert [(r.seq, bytes(r.payload), r.stream) for r in head] == [
        (i, payloads[i], f"{namespace}/big") for i in range(1000)
    ]
    assert df.rdd.getNumPartitions() >= 4


def test_sink_output_equals_its_input(spark: SparkSession, bk_cluster: Cluster) -> None:
    namespace = bk_cluster.new_namespace()
    source = spark.range(0, 3000, numPartitions=3).selectExpr(
        "CAST(concat('row-', CAST(id AS STRING)) AS STRING) AS payload"
    )
    append_frame(source, bk_cluster.uri, f"{namespace}/out")
    rows = batch_frame(spark, bk_cluster.uri, f"{namespace}/out").collect()
    assert sorted(r.seq for r in rows) == list(range(3000))
    by_seq = [bytes(r.payload).decode() for r in sorted(rows, key=lambda r: r.seq)]
    assert by_seq == [f"row-{i}" for i in range(3000)]  # Task order, then row order.
    assert len(stream_segments(bk_cluster, namespace, "out")) == 3


def test_a_task_failing_mid_write_leaves_no_partial_records(
    spark: SparkSession, bk_cluster: Cluster
) -> None:
    namespace = bk_cluster.new_namespace()
    before = [payload(i) for i in range(50)]
    write_stream(bk_cluster, namespace, "out", before, roll_bytes=1 << 20)
    # Partition 1 holds a null payload at its 500th row: that task fails after 499 appends.
    bad = spark.range(0, 2000, numPartitions=2).selectExpr(
        "IF(id = 1499, NULL, CAST(id AS STRING)) AS payload"
    )
    with pytest.raises(Exception, match="null payload"):
        append_frame(bad, bk_cluster.uri, f"{namespace}/out")
    rows = batch_frame(spark, bk_cluster.uri, f"{namespace}/out").collect()
    assert sorted((r.seq, bytes(r.payload)) for r in rows) == list(enumerate(before))
    # And nothing is left behind: abort deleted every ledger the job's tasks created (a task
    # cancelled after the abort deletes its own on the way out, hence the short wait).
    deadline = time.monotonic() + 15
    while orphans := tagged_ledgers(bk_cluster) - set(_published_elsewhere(bk_cluster)):
        assert time.monotonic() < deadline, (
            f"orphan sink ledgers remain (ledger -> job): {job_tags(bk_cluster, orphans)}"
        )
        time.sleep(0.2)


def _published_elsewhere(cluster: Cluster) -> list[int]:
    """Ledgers of every stream (other tests' sinks published theirs)."""
    from bkaio.stream.store import StreamStore, metadata_of

    async def ids() -> list[int]:
        store = StreamStore(metadata_of(await cluster.client()))
        found: list[int] = []
        for namespace in await store.list_namespaces():
            for stream in await store.list_streams(namespace):
                meta = await store.get_stream(namespace, stream)
                found += [s.ledger_id for s in meta.segments]
        return found

    return cluster.run(ids())


def test_spark35_helper_returns_the_same_rows_as_the_data_source(
    spark: SparkSession, bk_cluster: Cluster
) -> None:
    from bkaio.spark import read_dataframe

    namespace = bk_cluster.new_namespace()
    write_stream(bk_cluster, namespace, "s", [payload(i) for i in range(1500)], roll_bytes=20_000)
    options = {
        "metadata": bk_cluster.uri,
        "stream": f"{namespace}/s",
        "startingOffsets": f'{{"{namespace}/s": 100}}',
        "maxEntriesPerPartition": "400",
    }
    via_source = spark.read.format("bkaio").options(**options).load()
    via_helper = read_dataframe(spark, **options)
    assert via_helper.schema == via_source.schema
    assert sorted(via_helper.collect()) == sorted(via_source.collect())
    assert via_helper.count() == 1400
    assert via_helper.rdd.getNumPartitions() == via_source.rdd.getNumPartitions()
