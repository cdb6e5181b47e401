"""Re-replication throughput: entries copied per second after a bookie is lost.

    .venv/bin/python -m benchmarks.rereplication_bench [--bookies 4] [--payloads 1024,65536]
        [--shapes 3/3/2,3/2/2] [--mode recover|autorecovery|both] [--megabytes 30]
        [--min-entries 2000] [--figure PATH] [--json]

For each payload size and ensemble shape (E/Qw/Qa): a real etcd and real bookie processes
(tests/fixtures/bookies.py), ledgers written with that shape, one bookie killed with SIGKILL,
then its fragments moved to the others:
- `recover`: `bkaio.autorecovery.recover_bookie` in this process (autorecovery off in the
  bookies), timed from the call to its return;
- `autorecovery`: the service inside the surviving bookies (lost-bookie delay 0), timed from
  the kill until no ledger names the dead bookie (detection, audit, claims and copies).
Shapes with E == Qw copy by READ_RANGE (every bookie holds every entry of a segment); others
copy entry by entry. About `--megabytes` of payload is written per run, and at least
`--min-entries` entries (so 64 KiB runs write more). Prints entries/s and MB/s per run;
`--figure` draws them (PNG, matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bkaio.autorecovery import recover_bookie
from bkaio.ledger_client import BookKeeper
from bkaio.logs import configure_logging
from bkaio.testing.procs import EtcdProcess
from tests.fixtures.bookies import BookieCluster

PASSWORD = b"rereplication-bench"


@dataclass(frozen=True, slots=True)
class Run:
    mode: str
    shape: str  # E/Qw/Qa
    payload_bytes: int
    ledgers: int
    entries_copied: int
    bytes_copied: int
    seconds: float

    @property
    def entries_per_second(self) -> float:
        return self.entries_copied / self.seconds

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes_copied / 1e6 / self.seconds


def _shape(text: str) -> tuple[int, int, int]:
    ensemble, write, ack = (int(part) for part in text.split("/"))
    return ensemble, write, ack


async def _write(
    uri: str, shape: tuple[int, int, int], ledgers: int, entries: int, payload_bytes: int
) -> None:
    limit = asyncio.Semaphore(4)
    async with BookKeeper.connect(uri, add_timeout=60.0) as bk:

        async def one(index: int) -> None:
            async with limit:
                handle = await bk.create_ledger(*shape, password=PASSWORD)
                payload = bytes([index % 251]) * payload_bytes
                for first in range(0, entries, 100):  # Bounded: 100 adds in flight at most.
                    count = min(100, entries - first)
                    await asyncio.gather(*(handle.append(payload) for _ in range(count)))
                await handle.close()

        await asyncio.gather(*(one(i) for i in range(ledgers)))


async def _held_entries(cluster: BookieCluster, bookie_id: str) -> int:
    """Entries of (closed) ledgers the bookie's fragments hold."""
    from bkaio.autorecovery.fragments import fragment_entries, fragments_on

    meta = await cluster.metadata()
    entries = 0
    async for ledger_id in meta.ledgers.list_ids():
        md = await meta.ledgers.get(ledger_id)
        for fragment in fragments_on(md, {bookie_id}):
            entries += len(list(fragment_entries(fragment, md.ensemble_size, md.write_quorum)))
    return entries


async def _one_run(
    args: argparse.Namespace, base: Path, uri: str, mode: str, shape_text: str, payload: int
) -> Run:
    shape = _shape(shape_text)
    entries_total = max(args.min_entries, int(args.megabytes * 1e6 / payload))
    ledgers = args.ledgers
    entries = max(10, entries_total // ledgers)
    autorecovery: dict[str, Any] = {"enabled": mode == "autorecovery"}
    if mode == "autorecovery":
        autorecovery.update(
            lost_bookie_delay_seconds=0.0,
            auditor_lease_ttl_seconds=2.0,
            worker_lease_ttl_seconds=2.0,
            poll_interval_seconds=0.5,
            worker_concurrency=4,
        )
    config: dict[str, dict[str, Any]] = {
        "autorecovery": autorecovery,
        "gc": {"interval_seconds": 3600.0},
        "log": {"level": "warning"},
    }
    async with BookieCluster(uri, base, count=args.bookies, config=config) as cluster:
        await _write(uri, shape, ledgers, entries, payload)
        await asyncio.sleep(1.0)  # Let the last journal groups and flushes settle.
        victim = cluster.bookie_ids[0]
        held = await _held_entries(cluster, victim)
        started = time.perf_counter()
        cluster.kill9(0)
        if mode == "recover":
            await cluster.wait_until_deregistered(0)
            started = time.perf_counter()
            report = await recover_bookie(uri, victim, admin_token=cluster.admin_token)
            assert report.complete, report.failed
            copied, copied_bytes = report.entries, report.bytes
        else:
            meta = await cluster.metadata()
            while True:
                named = False
                async for ledger_id in meta.ledgers.list_ids():
                    md = await meta.ledgers.get(ledger_id)
                    if any(victim in ensemble for _, ensemble in md.ensembles):
                        named = True
                        break
                if not named:
                    break
                if time.perf_counter() - started > args.timeout:
                    raise TimeoutError(f"autorecovery did not finish in {args.timeout} s")
                await asyncio.sleep(0.05)
            copied, copied_bytes = held, held * payload
        seconds = time.perf_counter() - started
    return Run(mode, shape_text, payload, ledgers, copied, copied_bytes, seconds)


async def run(args: argparse.Namespace) -> list[Run]:
    runs: list[Run] = []
    modes = ["recover", "autorecovery"] if args.mode == "both" else [args.mode]
    with tempfile.TemporaryDirectory(prefix="bkaio-rerepl-") as tmp:
        base = Path(tmp)
        etcd = EtcdProcess(base / "etcd")
        await asyncio.to_thread(etcd.start)
        try:
            number = 0
            for payload in args.payloads:
                for shape in args.shapes:
                    for mode in modes:
                        number += 1
                        uri = f"etcd://{etcd.endpoint}/bench-{number}"
                        run_dir = base / f"run-{number}"
                        run_dir.mkdir()
                        result = await _one_run(args, run_dir, uri, mode, shape, payload)
                        runs.append(result)
                        if not args.json:
                            print(_line(result), flush=True)
        finally:
            await asyncio.to_thread(etcd.stop)
    return runs


def _line(run: Run) -> str:
    reads = "range reads" if _shape(run.shape)[0] == _shape(run.shape)[1] else "entry reads"
    return (
        f"{run.mode:12} E/Qw/Qa {run.shape} ({reads}), {run.payload_bytes // 1024:>3} KiB: "
        f"{run.entries_copied} entries, {run.bytes_copied / 1e6:.1f} MB in {run.seconds:.2f} s "
        f"-> {run.entries_per_second:,.0f} entries/s, {run.megabytes_per_second:.1f} MB/s"
    )


def draw(runs: list[Run], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [
        f"{r.mode}\n{r.shape} ({'range' if _shape(r.shape)[0] == _shape(r.shape)[1] else 'entry'})"
        f"\n{r.payload_bytes // 1024} KiB"
        for r in runs
    ]
    figure, (left, right) = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(runs)), 7.5))
    left.bar(labels, [r.entries_per_second for r in runs], color="#3b6ea5")
    left.set_ylabel("entries re-replicated per second")
    right.bar(labels, [r.megabytes_per_second for r in runs], color="#a55b3b")
    right.set_ylabel("MB of payload per second")
    for axis in (left, right):
        axis.tick_params(axis="x", labelsize=7)
        axis.grid(axis="y", alpha=0.3)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bookies", type=int, default=4)
    parser.add_argument("--ledgers", type=int, default=10)
    parser.add_argument("--megabytes", type=float, default=30.0, help="payload written per run")
    parser.add_argument(
        "--min-entries", type=int, default=2000, help="...but at least this many entries"
    )
    parser.add_argument(
        "--payloads",
        type=lambda text: [int(p) for p in text.split(",")],
        default=[1024, 65536],
        help="payload sizes in bytes, comma-separated",
    )
    parser.add_argument(
        "--shapes",
        type=lambda text: text.split(","),
        default=["3/3/2", "3/2/2"],
        help="ensemble shapes E/Qw/Qa, comma-separated",
    )
    parser.add_argument("--mode", choices=["recover", "autorecovery", "both"], default="both")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--figure", type=Path, default=None, help="write a PNG of the runs")
    parser.add_argument("--json", action="store_true", help="print the runs as JSON")
    args = parser.parse_args()
    configure_logging(json=False, level="warning")
    runs = asyncio.run(run(args))
    if args.json:
        print(json.dumps([{**asdict(r), "entries_per_second": r.entries_per_second} for r in runs]))
    if args.figure is not None:
        title = (
            f"re-replication after kill -9 of 1 of {args.bookies} bookies "
            f"({args.megabytes:g} MB, at least {args.min_entries} entries written per run)"
        )
        draw(runs, args.figure, title)


if __name__ == "__main__":
    main()
