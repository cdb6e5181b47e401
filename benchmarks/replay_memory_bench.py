"""Journal replay memory: how much RSS a shard's storage needs to replay a large journal.

A bookie that stopped without a final flush replays its journal at the next start. Replay
streams (bkaio/journal/replay.py `batches`, bkaio/entrylog/shard_storage.py `_replay`): one
bounded batch of records at a time, the write cache flushed whenever it is half full, and the
pages of the mapped journal files handed back as they are read. This measures it:

1. a shard's storage is opened and closed in a fresh directory (cookies, empty checkpoint);
2. `--journal-mib` of entry records (`--entry-bytes` each, several ledgers) are appended to its
   journal directly, with no flush: what a bookie leaves after kill -9;
3. a child process opens the storage of an empty twin directory and reports its RSS: the idle
   figure;
4. a child process opens the storage with the big journal (replay, then a checkpoint) and
   reports its peak RSS (VmHWM) and how long the open took.

The figure is the peak minus the idle RSS; the target is 256 MiB for a 2 GiB journal.

    .venv/bin/python benchmarks/replay_memory_bench.py [--journal-mib 2048] [--dir /tmp] [--json]

Needs about twice `--journal-mib` of free disk (journal plus entry logs); removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import crc32c
import uvloop

from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.journal import EntryRecord, Journal, JournalConfig, MasterKeyRecord, open_journal
from bkaio.logs import configure_logging

TARGET_MIB = 256.0
BOOKIE_ID = "127.0.0.1:3181"
KEY = b"k" * 32
LEDGERS = 8


@dataclass(frozen=True, slots=True)
class Result:
    journal_mib: float
    entry_bytes: int
    records: int
    idle_rss_mib: float
    replay_peak_rss_mib: float
    above_idle_mib: float
    target_mib: float
    open_seconds: float


def storage_config(root: Path) -> StorageConfig:
    return StorageConfig(
        journal=JournalConfig(directories=(root / "journal",), sync=False),
        ledger_dirs=(root / "ledgers",),
        index_dirs=(root / "index",),
        flush_interval_seconds=3600.0,  # Only the flushes replay itself asks for.
    )


async def open_storage(root: Path) -> ShardStorage:
    return await ShardStorage.open(
        storage_config(root),
        bookie_id=BOOKIE_ID,
        shard_index=0,
        shard_count=1,
        journal_factory=open_journal,
    )


async def prepare(root: Path, journal_bytes: int, entry_bytes: int) -> int:
    """Cookies and an empty checkpoint, then `journal_bytes` of records nobody flushed."""
    storage = await open_storage(root)
    await storage.close()
    journal = await Journal.open(storage_config(root).journal)
    written = 0
    records = 0
    try:
        for ledger_id in range(LEDGERS):
            await journal.append(MasterKeyRecord(ledger_id, KEY))
            records += 1
        payload = bytes(range(256)) * (entry_bytes // 256) + b"x" * (entry_bytes % 256)
        digest = crc32c.crc32c(payload)
        entry_id = 0
        last = None
        while written < journal_bytes:
            for ledger_id in range(LEDGERS):
                await journal.wait_for_room()
                last = journal.append(
                    EntryRecord(
                        ledger_id,
                        entry_id,
                        entry_id - 1,
                        (entry_id + 1) * entry_bytes,
                        digest,
                        payload,
                    )
                )
                written += entry_bytes
                records += 1
            entry_id += 1
        if last is not None:
            await last
    finally:
        await journal.close()
    return records


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(root: Path) -> None:
    """Open (replaying whatever is there) and close; print RSS figures as JSON."""

    async def main() -> dict[str, float]:
        started = time.perf_counter()
        storage = await open_storage(root)
        opened = time.perf_counter() - started
        figures = {
            "rss_kib": status_kib("VmRSS"),
            "peak_kib": status_kib("VmHWM"),
            "open_seconds": opened,
            "replayed": storage.stats.replayed_records,
        }
        await storage.close()
        return figures

    configure_logging(json=True, level="warning")
    print(json.dumps(uvloop.run(main())))


def measure(root: Path) -> dict[str, float]:
    output = subprocess.run(
        [sys.executable, __file__, "--child", str(root)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--journal-mib", type=int, default=2048)
    parser.add_argument("--entry-bytes", type=int, default=4096)
    parser.add_argument("--dir", type=Path, default=None, help="parent of the scratch directory")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child)
        return 0
    configure_logging(json=True, level="warning")
    scratch = Path(tempfile.mkdtemp(prefix="bkaio-replay-bench-", dir=args.dir))
    try:
        idle_root, big_root = scratch / "idle", scratch / "big"
        uvloop.run(open_storage_and_close(idle_root))
        records = uvloop.run(prepare(big_root, args.journal_mib * 1024 * 1024, args.entry_bytes))
        idle = measure(idle_root)
        replay = measure(big_root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if replay["replayed"] != records:
        print(f"replayed {replay['replayed']} records of {records}", file=sys.stderr)
        return 1
    above = (replay["peak_kib"] - idle["rss_kib"]) / 1024
    result = Result(
        journal_mib=args.journal_mib,
        entry_bytes=args.entry_bytes,
        records=records,
        idle_rss_mib=round(idle["rss_kib"] / 1024, 1),
        replay_peak_rss_mib=round(replay["peak_kib"] / 1024, 1),
        above_idle_mib=round(above, 1),
        target_mib=TARGET_MIB,
        open_seconds=round(replay["open_seconds"], 1),
    )
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(
            f"replayed {args.journal_mib} MiB of journal ({records} records of "
            f"{args.entry_bytes} B) in {result.open_seconds} s: peak RSS "
            f"{result.replay_peak_rss_mib} MiB, idle {result.idle_rss_mib} MiB, "
            f"{result.above_idle_mib} MiB above idle (target <= {result.target_mib:g} MiB)"
        )
    return 0 if above <= result.target_mib else 1


async def open_storage_and_close(root: Path) -> None:
    storage = await open_storage(root)
    await storage.close()


if __name__ == "__main__":
    sys.exit(main())
