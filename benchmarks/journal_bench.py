"""Journal benchmark: group-committed appends of 1 KiB entries with real fdatasync.

Two runs on one uvloop loop (the stock loop with --loop asyncio):
- closed loop: `--producers` coroutines each append, await durability, append again
  (saturation): entries/s, fdatasyncs/s, add-to-durable latency percentiles;
- open loop: entries offered at `--rate` per second on a fixed schedule; latency counts from
  each entry's *intended* send time, so a late sender shows up in the numbers.

    .venv/bin/python benchmarks/journal_bench.py [--dir /tmp] [--seconds 5] [--runs 3] [--json]

Journal files go to a fresh directory under --dir (default: the system temp dir), removed after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import uvloop

from bkaio.journal import EntryRecord, Journal, JournalConfig, JournalMark
from bkaio.logs import configure_logging


@dataclass(frozen=True, slots=True)
class RunResult:
    mode: str
    entries: int
    seconds: float
    entries_per_second: float
    syncs_per_second: float
    entries_per_sync: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    cpu_us_per_entry: float
    sync_ms_mean: float  # Time inside fdatasync per sync, as the writer thread measured it.
    send_lateness_p99_ms: float  # Open loop only: how late the pacer sent (0 when closed).


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Measurement:
    """Latencies, syncs and CPU between `start()` and `stop()`; warm-up falls outside."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self.latencies: list[float] = []
        self.lateness: list[float] = []
        self.recording = False
        self._started = self._cpu = 0.0
        self._syncs = self._records = 0
        self._sync_seconds = 0.0

    def start(self) -> None:
        self.recording = True
        self._started, self._cpu = time.perf_counter(), cpu_seconds()
        self._syncs, self._records = self._journal.metrics.syncs, self._journal.metrics.records
        self._sync_seconds = self._journal.metrics.sync_seconds_total

    def stop(self, mode: str) -> RunResult:
        self.recording = False
        seconds = time.perf_counter() - self._started
        cpu = cpu_seconds() - self._cpu
        syncs = self._journal.metrics.syncs - self._syncs
        entries = len(self.latencies)
        latencies = sorted(self.latencies)
        lateness = sorted(self.lateness)
        return RunResult(
            mode=mode,
            entries=entries,
            seconds=round(seconds, 3),
            entries_per_second=round(entries / seconds),
            syncs_per_second=round(syncs / seconds),
            entries_per_sync=round(entries / max(syncs, 1), 1),
            p50_ms=round(percentile(latencies, 0.50) * 1000, 3),
            p99_ms=round(percentile(latencies, 0.99) * 1000, 3),
            p999_ms=round(percentile(latencies, 0.999) * 1000, 3),
            max_ms=round((latencies[-1] if latencies else float("nan")) * 1000, 3),
            cpu_us_per_entry=round(cpu / max(entries, 1) * 1e6, 2),
            sync_ms_mean=round(
                (self._journal.metrics.sync_seconds_total - self._sync_seconds)
                / max(syncs, 1)
                * 1000,
                3,
            ),
            send_lateness_p99_ms=round(percentile(lateness, 0.99) * 1000, 3) if lateness else 0.0,
        )


async def closed_loop(journal: Journal, args: argparse.Namespace) -> RunResult:
    payload = os.urandom(args.payload_bytes)
    measurement = Measurement(journal)
    stop_at = time.perf_counter() + args.warmup + args.seconds
    clock = time.perf_counter

    async def producer(ledger_id: int) -> None:
        entry_id = 0
        while clock() < stop_at:
            await journal.wait_for_room()
            sent = clock()
            await journal.append(
                EntryRecord(ledger_id, entry_id, entry_id - 1, entry_id, 0, payload)
            )
            if measurement.recording:
                measurement.latencies.append(clock() - sent)
            entry_id += 1

    producers = [asyncio.create_task(producer(ledger_id)) for ledger_id in range(args.producers)]
    await asyncio.sleep(args.warmup)
    measurement.start()
    await asyncio.gather(*producers)
    return measurement.stop(f"closed{args.producers}")


async def open_loop(journal: Journal, args: argparse.Namespace) -> RunResult:
    """Offer `rate` entries/s; each entry's latency counts from its intended send time."""
    payload = os.urandom(args.payload_bytes)
    measurement = Measurement(journal)
    clock = time.perf_counter
    interval = 1.0 / args.rate
    total = int(args.rate * (args.warmup + args.seconds))
    warmup_entries = int(args.rate * args.warmup)
    latencies, lateness = measurement.latencies, measurement.lateness

    def on_durable(intended: float) -> Callable[[asyncio.Future[JournalMark]], None]:
        def done(future: asyncio.Future[JournalMark]) -> None:
            if measurement.recording and not future.cancelled() and future.exception() is None:
                latencies.append(clock() - intended)

        return done

    start = clock()
    sent = 0
    while sent < total:
        if sent == warmup_entries:
            measurement.start()
        now = clock()
        due = min(total, int((now - start) / interval) + 1)
        while sent < due:
            intended = start + sent * interval
            if measurement.recording:
                lateness.append(clock() - intended)
            await journal.wait_for_room()
            future = journal.append(EntryRecord(1, sent, sent - 1, sent, 0, payload))
            future.add_done_callback(on_durable(intended))
            sent += 1
            if sent == warmup_entries:
                measurement.start()
        if args.pacer == "spin":
            await asyncio.sleep(0)  # Exact send times, but the loop never idles (holds the GIL).
        else:
            # Sleep to the next send, at least one tick: sends come in bursts, as packets do,
            # and the loop idles in epoll between them like a server's loop.
            wait = start + sent * interval - clock()
            await asyncio.sleep(max(wait, args.tick_ms / 1000))
    await journal.force()  # Everything sent is durable, and its callback has been queued.
    await asyncio.sleep(0)
    return measurement.stop(f"open{args.rate}")


async def one_run(args: argparse.Namespace, mode: str) -> RunResult:
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    directory = Path(tempfile.mkdtemp(prefix="bkaio-journal-bench-", dir=base))
    try:
        config = JournalConfig(
            directories=(directory,),
            adaptive_wait_us=args.adaptive_wait_us,
            preallocate_next_file=args.preallocate,
        )
        journal = await Journal.open(config)
        try:
            if mode == "closed":
                return await closed_loop(journal, args)
            return await open_loop(journal, args)
        finally:
            await journal.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="parent of the journal directory (default: temp dir)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--runs", type=int, default=1, help="runs of each mode (report median)")
    parser.add_argument("--mode", choices=["closed", "open", "both"], default="both")
    parser.add_argument("--producers", type=int, default=1000, help="closed-loop producers")
    parser.add_argument("--rate", type=int, default=10_000, help="open-loop entries/s")
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--adaptive-wait-us", type=int, default=0)
    parser.add_argument("--preallocate", action="store_true", help="preallocate the next file")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="sys.setswitchinterval in ms (CPython default 5 ms): how long the writer thread "
        "may wait for the GIL while the loop is busy",
    )
    parser.add_argument(
        "--pacer",
        choices=["tick", "spin"],
        default="tick",
        help="open loop: sleep between bursts of due sends (tick) or spin on the loop (spin)",
    )
    parser.add_argument("--tick-ms", type=float, default=1.0, help="open loop: shortest sleep")
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    return parser.parse_args()


def report(results: list[RunResult], as_json: bool) -> None:
    for result in results:
        if as_json:
            print(json.dumps(asdict(result)))
        else:
            print(
                f"{result.mode:>10}: {result.entries_per_second:>8} entries/s "
                f"{result.syncs_per_second:>6} syncs/s ({result.entries_per_sync} per sync)  "
                f"p50 {result.p50_ms} p99 {result.p99_ms} p99.9 {result.p999_ms} "
                f"max {result.max_ms} ms  cpu {result.cpu_us_per_entry} µs/entry  "
                f"sync {result.sync_ms_mean} ms"
                + (
                    f"  send-late p99 {result.send_lateness_p99_ms} ms"
                    if result.mode.startswith("open")
                    else ""
                )
            )
    if len(results) > 1 and not as_json:
        print(
            f"{'median':>10}: {statistics.median(r.entries_per_second for r in results):>8} "
            f"entries/s  p99 {statistics.median(r.p99_ms for r in results)} ms  "
            f"p99.9 {statistics.median(r.p999_ms for r in results)} ms  "
            f"max of max {max(r.max_ms for r in results)} ms"
        )


def main() -> None:
    args = parse_arguments()
    configure_logging(json=False, level="warning")  # Slow fsyncs still show.
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    modes = ["closed", "open"] if args.mode == "both" else [args.mode]
    runner = uvloop.run if args.loop == "uvloop" else asyncio.run
    for mode in modes:
        results = [runner(one_run(args, mode)) for _ in range(args.runs)]
        report(results, args.json)


if __name__ == "__main__":
    main()
