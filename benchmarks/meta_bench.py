"""Ledger-create rate on each metadata driver.

    .venv/bin/python benchmarks/meta_bench.py [--ledgers 3000] [--concurrency 1,16,64]

Starts its own etcd (loopback, tmp data dir) and SQLite files, creates ledgers through
`Metadata.ledgers.create` (id allocation + one create-if-absent CAS each) from N concurrent
tasks of one process, and prints ledgers/s per driver and concurrency, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bkaio.logs import configure_logging
from bkaio.meta import LedgerMetadata, initialise_cluster_at, open_metadata
from bkaio.testing.procs import EtcdProcess

TEMPLATE = LedgerMetadata(
    ensemble_size=3,
    write_quorum=2,
    ack_quorum=2,
    ensembles=((0, ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")),),
    password_hash=b"\x01" * 20,
)


async def create_rate(uri: str, ledgers: int, concurrency: int) -> float:
    await initialise_cluster_at(uri, exist_ok=True)
    async with await open_metadata(uri) as meta:
        await meta.ledgers.create(TEMPLATE)  # Warm up: connection, first id block.
        per_task = ledgers // concurrency

        async def creator() -> None:
            for _ in range(per_task):
                await meta.ledgers.create(TEMPLATE)

        started = time.perf_counter()
        await asyncio.gather(*(creator() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return per_task * concurrency / elapsed


async def run(args: argparse.Namespace, etcd: EtcdProcess, tmp: Path) -> dict[str, float]:
    results: dict[str, float] = {}
    drivers: dict[str, Callable[[int], str]] = {
        "etcd": lambda run_id: f"etcd://{etcd.endpoint}/bench-{run_id}",
        "sqlite(sync=full)": lambda run_id: f"sqlite://{tmp}/full-{run_id}.db",
        "sqlite(sync=normal)": lambda run_id: (
            f"sqlite://{tmp}/normal-{run_id}.db?synchronous=normal"
        ),
    }
    run_id = 0
    for name, make_uri in drivers.items():
        for concurrency in args.concurrency:
            run_id += 1
            rate = await create_rate(make_uri(run_id), args.ledgers, concurrency)
            results[f"{name} c={concurrency}"] = round(rate, 1)
            print(f"{name:22s} concurrency {concurrency:4d}: {rate:9.1f} ledgers/s", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ledgers", type=int, default=3000)
    parser.add_argument(
        "--concurrency", type=lambda text: [int(x) for x in text.split(",")], default=[1, 16, 64]
    )
    args = parser.parse_args()
    configure_logging(level="warning")
    with tempfile.TemporaryDirectory(prefix="meta-bench-") as tmp_name:
        tmp = Path(tmp_name)
        etcd = EtcdProcess(tmp / "etcd")
        etcd.start()
        try:
            results = asyncio.run(run(args, etcd, tmp))
        finally:
            etcd.stop()
    print(json.dumps({"benchmark": "meta_ledger_create", "ledgers_per_second": results}))


if __name__ == "__main__":
    main()
