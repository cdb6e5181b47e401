"""Ledger client append latency and throughput against 3 local bookies.

    .venv/bin/python benchmarks/client_bench.py [--adds 20000] [--payload-bytes 1024]

Starts 3 real bookie processes (sqlite metadata, tmp dirs, fsync on) with the test fixture's
`BookieCluster`, then for E3/Qw3/Qa2 and E3/Qw2/Qa2 runs a closed loop with 1 and with 100
appends outstanding: each completion issues the next append. Latency is append call -> future
resolved (Qa acks and every earlier entry). Prints one JSON line per run, then a table.
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


def percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


async def closed_loop(
    bk: BookKeeper, quorums: tuple[int, int, int], outstanding: int, adds: int, payload: bytes
) -> dict[str, object]:
    lh = await bk.create_ledger(*quorums, password=b"bench")
    for _ in range(50):  # Warm the connections and the bookies' ledger state.
        await lh.append(payload)
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    latencies: list[float] = []
    issued = 0

    def issue() -> None:
        nonlocal issued
        issued += 1
        started = time.perf_counter()
        lh.append(payload).add_done_callback(lambda future: completed(future, started))

    def completed(future: asyncio.Future[int], started: float) -> None:
        future.result()
        latencies.append(time.perf_counter() - started)
        if issued < adds:
            issue()
        elif len(latencies) == adds and not finished.done():
            finished.set_result(None)

    began = time.perf_counter()
    for _ in range(min(outstanding, adds)):
        issue()
    await finished
    elapsed = time.perf_counter() - began
    await lh.close()
    latencies.sort()
    return {
        "bench": "client_append",
        "ensemble": quorums[0],
        "write_quorum": quorums[1],
        "ack_quorum": quorums[2],
        "outstanding": outstanding,
        "adds": adds,
        "payload_bytes": len(payload),
        "adds_per_second": round(adds / elapsed),
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
        "p999_ms": round(percentile(latencies, 0.999) * 1000, 3),
        "max_ms": round(latencies[-1] * 1000, 3),
    }


async def main(arguments: argparse.Namespace) -> None:
    configure_logging(json=False, level="warning")
    payload = bytes(arguments.payload_bytes)
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bkaio-client-bench-") as directory:
        base = Path(directory)
        cluster = BookieCluster(f"sqlite://{base / 'meta.db'}", base, count=3)
        async with cluster, BookKeeper.connect(cluster.metadata_uri, client_id="bench") as bk:
            for quorums in ((3, 3, 2), (3, 2, 2)):
                for outstanding in (1, 100):
                    adds = arguments.serial_adds if outstanding == 1 else arguments.adds
                    result = await closed_loop(bk, quorums, outstanding, adds, payload)
                    print(json.dumps(result), flush=True)
                    results.append(result)
    print(f"{'E/Qw/Qa':8} {'out':>4} {'adds/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'p999 ms':>8}")
    for r in results:
        quorum = f"{r['ensemble']}/{r['write_quorum']}/{r['ack_quorum']}"
        print(
            f"{quorum:8} {r['outstanding']:>4} {r['adds_per_second']:>8} {r['p50_ms']:>8} "
            f"{r['p99_ms']:>8} {r['p999_ms']:>8}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adds", type=int, default=20_000, help="appends per pipelined run")
    parser.add_argument("--serial-adds", type=int, default=2_000, help="appends with 1 in flight")
    parser.add_argument("--payload-bytes", type=int, default=1024)
    uvloop.run(main(parser.parse_args()))
