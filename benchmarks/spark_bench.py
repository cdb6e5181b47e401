"""Batch read throughput: `spark.read.format("bkaio")` on local[N] vs the plain async client.

    .venv/bin/python benchmarks/spark_bench.py [--entries 100000] [--payload-bytes 100]
        [--cores 2] [--roll-bytes 2000000]

Starts 3 real bookies (SQLite metadata in a temp dir), writes one stream, then reads it:
1. the plain client on one event loop, ledger ranges one after another (what one Python
   process does), and the same ranges concurrently;
2. Spark: `count()` (cold: first data-source query, starts the Python workers), then warm
   `count()` runs, and a warm `collect()`.
Prints entries/s and MB/s (payload bytes) per mode as JSON lines. Timings belong here, never
in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def report(mode: str, entries: int, payload_bytes: int, seconds: float) -> None:
    print(
        json.dumps(
            {
                "mode": mode,
                "entries": entries,
                "seconds": round(seconds, 3),
                "entries_per_s": round(entries / seconds),
                "mb_per_s": round(entries * payload_bytes / seconds / 1e6, 2),
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--roll-bytes", type=int, default=2_000_000)
    args = parser.parse_args()

    from bkaio.ledger_client.types import ClientConfig
    from bkaio.spark import catalog
    from bkaio.spark.options import parse_read_options
    from bkaio.spark.reading import read_entries
    from bkaio.spark.runtime import get_runtime, shutdown
    from bkaio.stream import open_namespace
    from tests.fixtures.bookies import BookieCluster

    base = Path(tempfile.mkdtemp(prefix="bkaio-spark-bench-"))
    uri = f"sqlite://{base / 'meta.db'}"
    loop = asyncio.new_event_loop()
    bookies = BookieCluster(uri, base, count=3)
    loop.run_until_complete(bookies.__aenter__())
    runtime = get_runtime()
    payload = b"x" * args.payload_bytes
    try:

        async def write() -> None:
            async with runtime.client(uri, {}) as bk:
                ns = await open_namespace(bk, "bench", create=True)
                writer = await ns.open_writer("s", roll_bytes=args.roll_bytes)
                for _ in range(0, args.entries, 5000):
                    await asyncio.gather(*(writer.write(payload) for _ in range(5000)))
                await writer.close()

        started = time.perf_counter()
        runtime.run(write())
        total = (args.entries + 4999) // 5000 * 5000
        report("write_stream_writer", total, args.payload_bytes, time.perf_counter() - started)
        options = parse_read_options({"metadata": uri, "stream": "bench/s"}, streaming=False)

        async def read(concurrent: bool) -> int:
            async with runtime.client(uri, options.client) as bk:
                ranges = [
                    item
                    for partition in await catalog.plan_batch(bk, options)
                    for item in partition
                ]

                batch_bytes = ClientConfig(**options.client).read_batch_bytes

                async def one(item: Any) -> int:
                    batches = read_entries(bk, item, 4096, True, batch_bytes=batch_bytes)
                    return sum([len(b) async for b in batches])

                if concurrent:
                    return sum(await asyncio.gather(*(one(r) for r in ranges)))
                return sum([await one(r) for r in ranges])

        for concurrent in (False, True):
            started = time.perf_counter()
            count = runtime.run(read(concurrent))
            mode = "plain_client_concurrent" if concurrent else "plain_client_sequential"
            report(mode, count, args.payload_bytes, time.perf_counter() - started)

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ["PYTHONPATH"] = str(ROOT)
        from pyspark.sql import SparkSession

        from bkaio.spark import register

        spark = (
            SparkSession.builder.master(f"local[{args.cores}]")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        reader = spark.read.format("bkaio").option("metadata", uri).option("stream", "bench/s")
        df = reader.option("minPartitions", str(args.cores * 2)).load()
        for mode in ("spark_count_cold", "spark_count_warm", "spark_count_warm"):
            started = time.perf_counter()
            count = df.count()
            report(mode, count, args.payload_bytes, time.perf_counter() - started)
        started = time.perf_counter()
        count = len(df.collect())
        report("spark_collect_warm", count, args.payload_bytes, time.perf_counter() - started)
        spark.stop()
    finally:
        shutdown()
        loop.run_until_complete(bookies.close())
        loop.close()


if __name__ == "__main__":
    main()
