"""Ledger read throughput against 3 local bookies: READ_RANGE batches against one read per entry.

    .venv/bin/python benchmarks/read_bench.py [--entries 20000] [--payload-bytes 1024]

Starts 3 real bookie processes (sqlite metadata, tmp dirs, fsync on) with the test fixture's
`BookieCluster`, writes one closed E3/Qw3/Qa2 ledger, then reads it whole with `read_iter`
for each `read_batch_entries` setting (1 is the per-entry path: one READ_ENTRY per entry, 64
in flight). The first pass after a flush reads the entry logs (page cache, not the disk: the
bench box has RAM to spare); every setting reads the same ledger twice and reports the second.
Prints one JSON line per run, then a table with entries/s and the client's CPU per entry.
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
from tests.fixtures.bookies import BookieCluster

BATCH_SETTINGS = (1, 32, 128, 512)


async def write_ledger(bk: BookKeeper, entries: int, payload: bytes) -> int:
    lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw")
    window = 500
    for start in range(0, entries, window):
        batch = [lh.append(payload) for _ in range(min(window, entries - start))]
        await asyncio.gather(*batch)
    await lh.close()
    return lh.ledger_id


async def read_all(bk: BookKeeper, ledger_id: int, last: int) -> tuple[float, float, int]:
    rh = await bk.open_ledger(ledger_id, password=b"pw", recovery=False)
    wall, cpu = time.perf_counter(), time.process_time()
    count = 0
    async for _entry in rh.read_iter(0, last):
        count += 1
    return time.perf_counter() - wall, time.process_time() - cpu, count


async def main(arguments: argparse.Namespace) -> None:
    configure_logging(json=False, level="warning")
    payload = bytes(arguments.payload_bytes)
    last = arguments.entries - 1
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bkaio-read-bench-") as directory:
        base = Path(directory)
        cluster = BookieCluster(f"sqlite://{base / 'meta.db'}", base, count=3)
        async with cluster:
            async with BookKeeper.connect(cluster.metadata_uri, client_id="bench") as bk:
                ledger_id = await write_ledger(bk, arguments.entries, payload)
            for batch in BATCH_SETTINGS:
                async with BookKeeper.connect(
                    cluster.metadata_uri, client_id="bench", read_batch_entries=batch
                ) as reader:
                    await read_all(reader, ledger_id, last)  # Warm: connections, page cache.
                    wall, cpu, count = await read_all(reader, ledger_id, last)
                assert count == arguments.entries, count
                result = {
                    "read_batch_entries": batch,
                    "entries": count,
                    "payload_bytes": arguments.payload_bytes,
                    "entries_per_second": round(count / wall),
                    "mib_per_second": round(count * len(payload) / wall / 2**20, 1),
                    "client_cpu_us_per_entry": round(cpu / count * 1e6, 1),
                }
                print(json.dumps(result), flush=True)
                results.append(result)
    print(f"{'batch':>6} {'entries/s':>10} {'MiB/s':>7} {'client µs/entry':>16}")
    for r in results:
        print(
            f"{r['read_batch_entries']:>6} {r['entries_per_second']:>10} "
            f"{r['mib_per_second']:>7} {r['client_cpu_us_per_entry']:>16}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    uvloop.run(main(parser.parse_args()))
