"""Spark reads give exactly what the plain client reads: batch and streaming, across ledger
rolls and with a bookie down; and a streaming query to a file sink killed in the middle of a
micro-batch ends, restarted from its checkpoint, with every record exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.spark.cluster import Cluster, stream_segments, write_stream
from tests.spark.queries import batch_frame, stream_to_parquet
from tests.spark.session import worker_environment

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

Row = tuple[int, int, int, bytes]  # seq, ledger_id, entry_id, payload


def payload(seq: int) -> bytes:
    return b"rec-%06d-" % seq + bytes([seq % 199]) * (seq % 37)


def plain_client_rows(cluster: Cluster, name: str, count: int) -> list[Row]:
    """The stream read from its start with the plain client's stream reader."""
    namespace, stream = name.split("/")

    async def read() -> list[Row]:
        ns = await cluster.namespace(namespace)
        rows: list[Row] = []
        async with await ns.open_reader(stream, start="earliest") as reader:
            while len(rows) < count:
                for record in await reader.read_batch(count - len(rows), timeout=30.0):
                    p = record.position
                    rows.append((p.seq, p.ledger_id, p.entry_id, record.payload))
        return rows

    return cluster.run(read())


def spark_rows(rows: list[Any]) -> list[Row]:
    return sorted((r.seq, r.ledger_id, r.entry_id, bytes(r.payload)) for r in rows)


def batch_rows(spark: SparkSession, uri: str, name: str) -> list[Row]:
    df = batch_frame(spark, uri, name, maxEntriesPerPartition="700")
    return spark_rows(df.collect())


def streaming_rows(
    spark: SparkSession, uri: str, name: str, tmp: Path, *, max_entries_per_trigger: int = 900
) -> list[Row]:
    """Stream `name` run to its end into parquet under `tmp` (from the checkpoint there, if
    any), and every row written there."""
    out, checkpoint = tmp / "out", tmp / "checkpoint"
    stream_to_parquet(
        spark, uri, name, out, checkpoint, max_entries_per_trigger=max_entries_per_trigger
    )
    return spark_rows(spark.read.parquet(str(out)).collect())


def test_batch_and_streaming_equal_the_client_across_rolls_and_with_a_bookie_down(
    spark: SparkSession, bk_cluster: Cluster, tmp_path: Path
) -> None:
    namespace = bk_cluster.new_namespace()
    name = f"{namespace}/events"
    count = 4000
    write_stream(
        bk_cluster, namespace, "events", [payload(i) for i in range(count)], roll_bytes=20_000
    )
    assert len(stream_segments(bk_cluster, namespace, "events")) >= 5
    expected = plain_client_rows(bk_cluster, name, count)
    assert [row[0] for row in expected] == list(range(count))
    assert [row[3] for row in expected] == [payload(i) for i in range(count)]
    assert batch_rows(spark, bk_cluster.uri, name) == expected
    assert streaming_rows(spark, bk_cluster.uri, name, tmp_path / "up") == expected
    down = 1
    bk_cluster.run(bk_cluster.bookies.stop(down))
    try:
        assert plain_client_rows(bk_cluster, name, count) == expected
        assert batch_rows(spark, bk_cluster.uri, name) == expected
        assert streaming_rows(spark, bk_cluster.uri, name, tmp_path / "down") == expected
    finally:
        bk_cluster.run(bk_cluster.bookies.start(down))


_QUERY = textwrap.dedent(
    """
    import sys, time
    from pyspark.sql.functions import udf
    from tests.spark.session import local_session

    uri, name, out, checkpoint = sys.argv[1:5]
    spark = local_session("local[1]", shuffle_partitions=1)

    @udf("binary")
    def slowly(value):  # Each micro-batch takes seconds: time to be killed in the middle.
        time.sleep(0.005)
        return value

    query = (
        spark.readStream.format("bkaio").option("metadata", uri).option("stream", name)
        .option("maxEntriesPerTrigger", "100").load()
        .withColumn("payload", slowly("payload"))
        .writeStream.format("parquet").option("path", out)
        .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start()
    )
    query.awaitTermination()
    """
)


def _batches(checkpoint: Path, kind: str) -> set[int]:
    directory = checkpoint / kind
    if not directory.exists():
        return set()
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}


def test_a_streaming_query_killed_mid_batch_resumes_with_every_record_once(
    spark: SparkSession, bk_cluster: Cluster, tmp_path: Path
) -> None:
    namespace = bk_cluster.new_namespace()
    name = f"{namespace}/events"
    count = 1200
    write_stream(
        bk_cluster, namespace, "events", [payload(i) for i in range(count)], roll_bytes=8_000
    )
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    script = tmp_path / "query.py"
    script.write_text(_QUERY)
    env = {**os.environ, **worker_environment()}
    command = [sys.executable, str(script), bk_cluster.uri, name, str(out), str(checkpoint)]
    query = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        # Killed once a batch was planned (its offsets written) and an earlier one committed,
        # but before it committed: in the middle of a micro-batch.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            planned, committed = _batches(checkpoint, "offsets"), _batches(checkpoint, "commits")
            if committed and planned - committed:
                break
            assert query.poll() is None, "the query ended by itself"
            time.sleep(0.05)
        else:
            raise AssertionError("no micro-batch in flight within 240 s")
        os.killpg(query.pid, signal.SIGKILL)
        query.wait()
    finally:
        if query.poll() is None:
            os.killpg(query.pid, signal.SIGKILL)
            query.wait()
    in_flight = _batches(checkpoint, "offsets") - _batches(checkpoint, "commits")
    assert in_flight, "the kill did not land inside a micro-batch"
    # Restarted from its checkpoint, to the end.
    rows = streaming_rows(spark, bk_cluster.uri, name, tmp_path, max_entries_per_trigger=400)
    assert [row[0] for row in rows] == list(range(count))  # Each seq once: no gap, no duplicate.
    assert [row[3] for row in rows] == [payload(i) for i in range(count)]
