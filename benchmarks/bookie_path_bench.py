"""The bookie's add path in one process: CPU and context switches per add and per group.

    .venv/bin/python benchmarks/bookie_path_bench.py [--batch 100] [--adds 20000] [--profile]
        [--add-entries] [--interval-ms 1] [--journal "adaptive_wait_us = 500"]

Opens a real `ShardStorage` (journal with fdatasync on, entry logs, index) in a temporary
directory, serves it with a `ShardServer` through one `BookieServerProtocol` whose transport is a
stand-in that only counts bytes, and feeds it ADD_ENTRY frames `--batch` at a time, as one
`data_received` each, waiting for every answer before the next batch. Reports the CPU time of the
event-loop thread per add (`time.thread_time`): the Python cost of decode, checks, journal
hand-off, apply and answer, which the socket benches mix with kernel time and other processes.
`--add-entries` sends each batch as ADD_ENTRIES frames, as a client does with a bookie that
offers them. `--profile` prints the cProfile of the measured phase (cProfile itself slows it
about 3x).

The open loop's side of a bookie: `--interval-ms 1 --batch 5 --add-entries` sends a batch every
millisecond whatever the answers, as `bkaio bench`'s 5k/s workload does with its 1 ms pacer.
Besides the loop's CPU it reports, per batch, the CPU and the context switches of every thread
of the process (journal writer, zero-filler, storage thread; /proc/self/task): the fixed costs
of a journal group, which the load of a shared box moves less than wall time. Run it under
`strace -c -f` for the system calls per group.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bkaio.bench.pacer import open_metronome
from bkaio.bookie.connection import BookieServerProtocol
from bkaio.bookie.metrics import ShardMetrics
from bkaio.bookie.server import ShardServer
from bkaio.config import load_bookie_config
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.journal import Journal, JournalConfig, open_journal
from bkaio.protocol.digest import entry_digest, master_key
from bkaio.protocol.encoder import FrameEncoder
from bkaio.protocol.messages import AddEntryRequest, Flag, HelloRequest
from bkaio.runtime_tuning import tune_gc_for_throughput
from tests.fixtures.transports import FakeServerTransport

KEY = master_key(b"bench", 0)
LEDGER_ID = 7


class ThreadCost(NamedTuple):
    """CPU seconds and context switches of one thread of this process."""

    cpu_seconds: float
    voluntary: int
    involuntary: int


def thread_costs() -> dict[str, ThreadCost]:
    """Every live thread of this process by name (its native id when Python does not know it),
    from /proc/self/task."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    costs: dict[str, ThreadCost] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:
            continue  # A thread that ended meanwhile.
        fields = stat[stat.rindex(")") + 2 :].split()
        switches = dict(line.split(":") for line in status.splitlines() if "ctxt_switches" in line)
        name = names.get(int(task.name), task.name)
        costs[name] = ThreadCost(
            (int(fields[11]) + int(fields[12])) / ticks,
            int(switches["voluntary_ctxt_switches"]),
            int(switches["nonvoluntary_ctxt_switches"]),
        )
    return costs


def print_thread_costs(
    before: dict[str, ThreadCost], after: dict[str, ThreadCost], groups: int
) -> None:
    """Per group: each busy thread's CPU and context switches, and their sum."""
    total = [0.0, 0, 0]
    for name, cost in sorted(after.items()):
        start = before.get(name, ThreadCost(0.0, 0, 0))
        cpu = cost.cpu_seconds - start.cpu_seconds
        voluntary = cost.voluntary - start.voluntary
        involuntary = cost.involuntary - start.involuntary
        total[0] += cpu
        total[1] += voluntary
        total[2] += involuntary
        if cpu or voluntary:
            print(
                f"  {name:<24} {cpu * 1e6 / groups:7.1f} µs CPU per group, context switches "
                f"{voluntary / groups:5.2f} voluntary {involuntary / groups:5.2f} involuntary"
            )
    print(
        f"  {'all threads':<24} {total[0] * 1e6 / groups:7.1f} µs CPU per group, context switches "
        f"{total[1] / groups:5.2f} voluntary {total[2] / groups:5.2f} involuntary"
    )


class AddFrames:
    """Consecutive ADD_ENTRY frames of one ledger, as a client would send them."""

    def __init__(self, payload: bytes, *, add_entries: bool) -> None:
        self._payload = payload
        self._add_entries = add_entries
        self._encoder = FrameEncoder(64 << 20)
        self._request_id = 10
        self._entry_id = 0
        self._length = 0

    def batch(self, count: int) -> bytes:
        payload = self._payload
        encoder = self._encoder
        for _ in range(count):
            entry_id = self._entry_id
            self._length += len(payload)
            digest = entry_digest(LEDGER_ID, entry_id, entry_id - 1, self._length, payload)
            if self._add_entries:
                fields = [entry_id, entry_id - 1, self._length, digest, payload]
                encoder.add_to_entries(
                    self._request_id, LEDGER_ID, 0, KEY, encoder.pack_fields(fields)
                )
                self._request_id += 1
                self._entry_id += 1
                continue
            encoder.add(
                AddEntryRequest(
                    self._request_id,
                    LEDGER_ID,
                    entry_id,
                    Flag.NONE,
                    KEY,
                    entry_id - 1,
                    self._length,
                    digest,
                    payload,
                )
            )
            self._request_id += 1
            self._entry_id += 1
        return self._encoder.take()


async def bench(
    batch: int,
    adds: int,
    payload_bytes: int,
    profile: bool,
    add_entries: bool,
    interval_ms: float,
    journal_options: str,
) -> None:
    with tempfile.TemporaryDirectory(prefix="bkaio-path-bench-") as tmp:
        config_path = Path(tmp) / "bookie.toml"
        config_path.write_text(
            f'[bookie]\nhost = "127.0.0.1"\nport = 3181\nshards = 1\n'
            f'[metadata]\nuri = "sqlite://{tmp}/meta.db"\n'
            '[server]\nledger_key_check = "first_sight"\n'
            f'[storage]\njournal_dirs = ["{tmp}/journal"]\nledger_dirs = ["{tmp}/data"]\n'
            f"[journal]\n{journal_options}\n"
            '[log]\nlevel = "warning"\n'
        )
        config = load_bookie_config(config_path, env={})
        journals: list[Journal] = []

        async def keep_journal(journal_config: JournalConfig, directory: Path) -> Journal:
            journal = await open_journal(journal_config, directory)
            journals.append(journal)
            return journal

        storage = await ShardStorage.open(
            config.storage[0],
            bookie_id="bench",
            shard_index=0,
            shard_count=1,
            journal_factory=keep_journal,
        )
        try:
            server = ShardServer(config, 0, storage, ShardMetrics())
            connection = BookieServerProtocol(server)
            transport = FakeServerTransport()
            connection.connection_made(transport)  # type: ignore[arg-type]
            hello = FrameEncoder()
            hello.add(HelloRequest(1, 1, "bench", None))
            connection.data_received(hello.take())
            frames = AddFrames(os.urandom(payload_bytes), add_entries=add_entries)

            async def answered() -> None:
                while server.inflight_requests:  # Woken by answer writes, never by polling.
                    transport.wrote.clear()
                    await transport.wrote.wait()
                await asyncio.sleep(0)  # The flush of the last answers.

            connection.data_received(frames.batch(batch))  # First add of the ledger: slow path.
            await answered()
            batches = [frames.batch(batch) for _ in range(max(1, adds // batch))]
            tune_gc_for_throughput()
            profiler = cProfile.Profile() if profile else None
            writes_before = transport.writes
            threads_before = thread_costs()
            cpu_before, wall_before = time.thread_time(), time.perf_counter()
            if profiler is not None:
                profiler.enable()
            if interval_ms > 0:  # Open loop: a batch every interval, answered or not.
                metronome = open_metronome()
                fed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                unfed = iter(batches)
                fed_at: list[float] = []  # When each batch was fed.
                latencies: list[float] = []  # Fed to answered (written), per batch.
                write = transport.write

                def feed() -> None:  # One batch per tick (ticks missed under load: later).
                    data = next(unfed, None)
                    if data is None:
                        metronome.stop()
                        fed.set_result(None)
                        return
                    fed_at.append(time.perf_counter())
                    connection.data_received(data)

                def timed_write(data: bytes) -> None:
                    now = time.perf_counter()
                    answered_batches = (len(fed_at) * batch - server.inflight_requests) // batch
                    latencies.extend(now - at for at in fed_at[len(latencies) : answered_batches])
                    write(data)

                transport.write = timed_write  # type: ignore[method-assign]
                metronome.start(metronome.now(), interval_ms / 1000, feed)
                await fed
                await answered()
                latencies.sort()
                print(
                    f"  fed to answered, per batch: p50 {latencies[len(latencies) // 2] * 1e3:.3f}"
                    f" p99 {latencies[int(len(latencies) * 0.99)] * 1e3:.3f} ms (loaded box?)"
                )
            else:
                for data in batches:
                    connection.data_received(data)
                    await answered()
            if profiler is not None:
                profiler.disable()
            cpu, wall = time.thread_time() - cpu_before, time.perf_counter() - wall_before
            threads_after = thread_costs()
            count = len(batches) * batch
            groups = len(batches)
            journal = journals[0].metrics
            print(
                f"batch {batch}{' (ADD_ENTRIES)' if add_entries else ''}"
                f"{f' every {interval_ms:g} ms' if interval_ms > 0 else ''}: {count} adds, "
                f"event-loop CPU {cpu * 1e6 / count:.2f} µs/add, "
                f"wall {wall * 1e6 / count:.1f} µs/add, "
                f"{transport.writes - writes_before} answer writes"
            )
            print(
                f"  journal groups (whole run): {journal.groups}, records {journal.records}, "
                f"sync mean {journal.sync_seconds_total / max(journal.syncs, 1) * 1e3:.3f} ms, "
                f"holds {journal.holds} ({journal.holds_fruitless} fruitless)"
            )
            print_thread_costs(threads_before, threads_after, groups)
            if profiler is not None:
                pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
        finally:
            await storage.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100, help="adds per data_received")
    parser.add_argument("--adds", type=int, default=20_000)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--add-entries", action="store_true", help="send ADD_ENTRIES frames")
    parser.add_argument(
        "--interval-ms",
        type=float,
        default=0.0,
        help="open loop: a batch every this many ms whatever the answers (0: wait for them)",
    )
    parser.add_argument(
        "--journal", default="", help='[journal] settings, e.g. "adaptive_wait_us = 1000"'
    )
    args = parser.parse_args()
    uvloop.run(
        bench(
            args.batch,
            args.adds,
            args.payload_bytes,
            args.profile,
            args.add_entries,
            args.interval_ms,
            args.journal,
        )
    )


if __name__ == "__main__":
    main()
