"""A bkaio + Spark pipeline: produce JSON events, aggregate them in batch, and keep a running
aggregate of the live tail with Structured Streaming, written into another stream.

    bkaio standalone --data-dir /tmp/bkaio-demo            # prints the metadata URI
    python examples/spark_pipeline.py --metadata sqlite:///tmp/bkaio-demo/meta.db

Steps (each prints what it did):
1. an asyncio application writes `--events` JSON events {"user", "kind", "amount"} into
   `demo/events` through a StreamWriter;
2. a Spark batch job reads `demo/events` with `format("bkaio")` and totals amount by kind;
3. a Structured Streaming job reads the stream's tail and computes the running total by
   kind, appending each micro-batch's updated totals to `demo/totals` (foreachBatch + the
   bkaio batch sink, as the streaming sink takes append mode only);
   more events arrive while it runs (the job picks them up on its next trigger);
4. the last total per kind is read back from `demo/totals`.
Needs `pip install -e '.[spark]'` (pyspark >= 4.0) and Java 17+.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from bkaio.ledger_client import BookKeeper
from bkaio.stream import open_namespace

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KINDS = ("click", "view", "buy")


def make_event(number: int, rng: random.Random) -> bytes:
    event = {"n": number, "user": f"u{rng.randrange(50)}", "kind": rng.choice(KINDS)}
    event["amount"] = rng.randrange(1, 100)
    return json.dumps(event).encode()


async def produce(uri: str, namespace: str, first: int, count: int, seed: int) -> int:
    """Append `count` events; the sum of their amounts."""
    rng = random.Random(seed)
    total = 0
    async with BookKeeper.connect(uri) as bk:
        ns = await open_namespace(bk, namespace, create=True)
        writer = await ns.open_writer("events", roll_bytes=256 << 10)
        events = [make_event(first + i, rng) for i in range(count)]
        total = sum(json.loads(e)["amount"] for e in events)
        await asyncio.gather(*(writer.write(e) for e in events))
        await writer.close()
    return total


def batch_totals(spark: SparkSession, uri: str, namespace: str) -> dict[str, int]:
    from pyspark.sql import functions as F

    events = (
        spark.read.format("bkaio")
        .option("metadata", uri)
        .option("stream", f"{namespace}/events")
        .load()
        .select(F.from_json(F.col("payload").cast("string"), "kind string, amount long").alias("e"))
    )
    rows = events.groupBy("e.kind").agg(F.sum("e.amount").alias("total")).collect()
    return {row["kind"]: int(row["total"]) for row in rows}


def stream_totals(spark: SparkSession, uri: str, namespace: str, checkpoint: str) -> None:
    """One availableNow run of the running aggregate, appending updates to `<ns>/totals`."""
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("bkaio")
        .option("metadata", uri)
        .option("stream", f"{namespace}/events")
        .option("maxEntriesPerTrigger", "5000")
        .load()
        .select(F.from_json(F.col("payload").cast("string"), "kind string, amount long").alias("e"))
    )
    totals = events.groupBy("e.kind").agg(F.sum("e.amount").alias("total"))

    def append_updates(updates: DataFrame, batch_id: int) -> None:
        # The bkaio streaming sink takes append mode only; a running aggregate emits updates,
        # so each micro-batch's updated rows go out with the batch sink.
        (
            updates.select(F.to_json(F.struct("kind", "total")).alias("payload"))
            .write.format("bkaio")
            .option("metadata", uri)
            .option("stream", f"{namespace}/totals")
            .mode("append")
            .save()
        )

    query = (
        totals.writeStream.outputMode("update")
        .foreachBatch(append_updates)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def latest_totals(spark: SparkSession, uri: str, namespace: str) -> dict[str, int]:
    """The last total per kind the streaming job wrote (later seqs win)."""
    rows = (
        spark.read.format("bkaio")
        .option("metadata", uri)
        .option("stream", f"{namespace}/totals")
        .load()
        .orderBy("seq")
        .collect()
    )
    latest: dict[str, int] = {}
    for row in rows:
        record = json.loads(bytes(row["payload"]))
        latest[record["kind"]] = int(record["total"])
    return latest


def run_pipeline(
    spark: SparkSession, uri: str, namespace: str, checkpoint: str, events: int
) -> dict[str, Any]:
    """The whole demo; returns what each step found (the test checks it)."""
    from bkaio.spark import register

    register(spark)
    half = events // 2
    produced = asyncio.run(produce(uri, namespace, 0, half, seed=1))
    batch = batch_totals(spark, uri, namespace)
    print(f"batch totals after {half} events: {batch}")
    stream_totals(spark, uri, namespace, checkpoint)
    produced += asyncio.run(produce(uri, namespace, half, events - half, seed=2))
    stream_totals(spark, uri, namespace, checkpoint)  # Resumes from the checkpoint.
    running = latest_totals(spark, uri, namespace)
    print(f"running totals after {events} events: {running}")
    return {"produced": produced, "batch": batch, "running": running}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metadata", default=os.environ.get("BKAIO_METADATA"), required=False)
    parser.add_argument("--namespace", default="demo")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--checkpoint", default=None, help="default: a new temporary directory")
    args = parser.parse_args()
    if not args.metadata:
        parser.error("--metadata URI (or BKAIO_METADATA) is required; `bkaio standalone` prints it")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bkaio-spark-pipeline")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="bkaio-pipeline-")
    try:
        run_pipeline(spark, args.metadata, args.namespace, checkpoint, args.events)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
