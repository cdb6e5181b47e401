"""Re-replication throughput: how fast `recover_bookie` moves a dead bookie's fragments.

    .venv/bin/python -m benchmarks.rereplication_bench [--bookies 4] [--ledgers 20]
        [--entries 1000] [--payload-bytes 1024]

Starts a real etcd and real bookie processes (tests/fixtures/bookies.py), autorecovery off in
the bookies, writes E3/Qw3/Qa2 ledgers, kills one bookie with SIGKILL and
times `bkaio.autorecovery.recover_bookie` (reads from survivors, digest check, RECOVERY_ADD to
the replacement, metadata CAS). Prints entries/s and MB/s of payload copied.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bkaio.autorecovery import RecoveryReport, recover_bookie
from bkaio.logs import configure_logging
from bkaio.testing.procs import EtcdProcess
from tests.fixtures.bookies import BookieCluster
from tests.integration.autorecovery.helpers import write_ledgers


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bkaio-rerepl-") as tmp:
        base = Path(tmp)
        etcd = EtcdProcess(base / "etcd")
        await asyncio.to_thread(etcd.start)
        uri = f"etcd://{etcd.endpoint}/bench"
        try:
            report, victim, write_seconds, seconds = await _measure(args, base, uri)
        finally:
            await asyncio.to_thread(etcd.stop)
    assert report.complete, report.failed
    print(
        f"wrote {args.ledgers} ledgers x {args.entries} entries x {args.payload_bytes} B "
        f"(E3/Qw3/Qa2, {args.bookies} bookies) in {write_seconds:.1f} s"
    )
    print(
        f"recover {victim}: {report.ledgers_replicated} ledgers, {report.fragments} fragments, "
        f"{report.entries} entries, {report.bytes / 1e6:.1f} MB in {seconds:.2f} s -> "
        f"{report.entries / seconds:.0f} entries/s, {report.bytes / 1e6 / seconds:.2f} MB/s"
    )


async def _measure(
    args: argparse.Namespace, base: Path, uri: str
) -> tuple[RecoveryReport, str, float, float]:
    config: dict[str, dict[str, Any]] = {
        "autorecovery": {"enabled": False},
        "log": {"level": "warning"},
    }
    async with BookieCluster(uri, base, count=args.bookies, config=config) as cluster:
        started = time.perf_counter()
        await write_ledgers(uri, args.ledgers, args.entries, args.payload_bytes)
        write_seconds = time.perf_counter() - started
        victim = cluster.bookie_ids[0]
        cluster.kill9(0)
        await cluster.wait_until_deregistered(0)
        started = time.perf_counter()
        report = await recover_bookie(uri, victim, admin_token=cluster.admin_token)
        seconds = time.perf_counter() - started
    return report, victim, write_seconds, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bookies", type=int, default=4)
    parser.add_argument("--ledgers", type=int, default=20)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    args = parser.parse_args()
    configure_logging(json=False, level="warning")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
