"""Stream write throughput and end-to-end latency (write -> tailing reader) on 3 local bookies.

    .venv/bin/python benchmarks/stream_bench.py [--records 20000] [--payload-bytes 100]

Starts 3 real bookie processes (sqlite metadata, tmp dirs, fsync on) with the test fixture's
`BookieCluster`. Then, on E3/Qw2/Qa2 streams:
1. throughput: `--records` writes pipelined with `--outstanding` in flight, rolling every
   `--roll-bytes`; records/s and MB/s;
2. end to end: a tailing reader (its own client) follows the stream while a writer (explicit
   LAC every 2 ms) writes one record at a time, `--rate` per second; latency is write call ->
   the reader yields it, and ack -> the reader yields it. p50/p99/max.
Prints one JSON line per run, then a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bkaio.ledger_client import BookKeeper
from bkaio.logs import configure_logging
from bkaio.stream import StreamPosition, open_namespace
from tests.fixtures.bookies import BookieCluster


def percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


def summary(name: str, seconds: list[float]) -> dict[str, object]:
    values = sorted(seconds)
    return {
        f"{name}_p50_ms": round(percentile(values, 0.5) * 1000, 2),
        f"{name}_p99_ms": round(percentile(values, 0.99) * 1000, 2),
        f"{name}_max_ms": round(values[-1] * 1000, 2),
    }


async def throughput(bk: BookKeeper, arguments: argparse.Namespace) -> dict[str, object]:
    ns = await open_namespace(bk, "bench", create=True)
    writer = await ns.open_writer("throughput", roll_bytes=arguments.roll_bytes)
    payload = bytes(arguments.payload_bytes)
    in_flight: set[asyncio.Future[StreamPosition]] = set()
    started = time.perf_counter()
    for _ in range(arguments.records):
        if len(in_flight) >= arguments.outstanding:
            _, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        in_flight.add(writer.write(payload))
    await asyncio.gather(*in_flight)
    elapsed = time.perf_counter() - started
    await writer.close()
    segments = len((await ns.stream_metadata("throughput")).segments)
    return {
        "run": "throughput",
        "records": arguments.records,
        "payload_bytes": arguments.payload_bytes,
        "outstanding": arguments.outstanding,
        "segments": segments,
        "records_per_second": round(arguments.records / elapsed),
        "mb_per_second": round(arguments.records * arguments.payload_bytes / elapsed / 1e6, 2),
    }


async def end_to_end(uri: str, arguments: argparse.Namespace) -> dict[str, object]:
    async with (
        BookKeeper.connect(uri, client_id="writer", explicit_lac_interval=0.002) as writer_bk,
        BookKeeper.connect(uri, client_id="reader") as reader_bk,
    ):
        writer_ns = await open_namespace(writer_bk, "bench", create=True)
        reader_ns = await open_namespace(reader_bk, "bench")
        await writer_ns.create_stream("latency")
        reader = await reader_ns.open_reader("latency", start="earliest")
        count = arguments.latency_records
        written_at: dict[int, float] = {}
        acked_at: dict[int, float] = {}
        seen_at: dict[int, float] = {}

        async def tail() -> None:
            async for record in reader:
                seen_at[record.position.seq] = time.perf_counter()
                if len(seen_at) == count:
                    return

        tailing = asyncio.ensure_future(tail())
        writer = await writer_ns.open_writer("latency", roll_bytes=arguments.roll_bytes)
        for seq in range(count):
            written_at[seq] = time.perf_counter()
            position = await writer.write(bytes(arguments.payload_bytes))
            acked_at[position.seq] = time.perf_counter()
            await asyncio.sleep(1 / arguments.rate)
        await asyncio.wait_for(tailing, 60)
        await writer.close()
        await reader.close()
    return {
        "run": "end_to_end",
        "records": count,
        **summary("write_to_read", [seen_at[s] - written_at[s] for s in written_at]),
        **summary("ack_to_read", [max(0.0, seen_at[s] - acked_at[s]) for s in acked_at]),
        **summary("write_ack", [acked_at[s] - written_at[s] for s in written_at]),
    }


async def main(arguments: argparse.Namespace) -> None:
    configure_logging(json=False, level="warning")
    with tempfile.TemporaryDirectory(prefix="bkaio-stream-bench-") as directory:
        base = Path(directory)
        cluster = BookieCluster(f"sqlite://{base / 'meta.db'}", base, count=3)
        async with cluster, BookKeeper.connect(cluster.metadata_uri, client_id="bench") as bk:
            results = [await throughput(bk, arguments)]
            print(json.dumps(results[-1]), flush=True)
            results.append(await end_to_end(cluster.metadata_uri, arguments))
            print(json.dumps(results[-1]), flush=True)
    for result in results:
        print("  ".join(f"{key}={value}" for key, value in result.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--outstanding", type=int, default=1000)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--roll-bytes", type=int, default=1 << 20)
    parser.add_argument("--latency-records", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0, help="records/s in the e2e run")
    uvloop.run(main(parser.parse_args()))
