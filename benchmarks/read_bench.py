"""Read benchmarks against local bookies (issue 27's targets; docs/benchmarks.md, "Reads").

    .venv/bin/python benchmarks/read_bench.py [sequential|tail|tail-path|catchup|all] [options]

- sequential: one closed ledger of `--entries` (200 000) 1 KiB entries per shape, E3/Qw3/Qa2
  on 3 bookies and E5/Qw2/Qa2 on 5, read whole with `read_iter` by a fresh client (read
  twice, the second pass reported: the first warms the page cache and the connections).
  Entries/s and the client's CPU per entry (its process time over the pass).
- tail: a writer appends 1 KiB entries open-loop at `--rate` (5 000/s) for `--seconds` while
  a reader in another process tails the ledger (`ReadHandle.wait_for_entries`); latency is
  from the writer's acknowledgement to the reader's delivery (both CLOCK_MONOTONIC). The
  writer sends its LAC on acknowledgement (`explicit_lac_on_ack`). As every workload of
  `bkaio bench`, the measured run follows `--warmup-seconds` (1) of the same load that is
  not counted (its entries are tailed too); `ack_to_delivered_p99_with_warmup_ms` counts
  them, for comparison with figures from before the warm-up.
- tail-path: the tail's path alone, without load: the writer appends one entry every
  `--gap-ms` (5) and waits for it, `--path-entries` (1 000) times, a reader in another process
  tailing; acknowledged -> delivered as in `tail`. What one WRITE_LAC -> long-poll answer ->
  reader hop costs when no core is busy (the floor under `tail`'s figures).
- catchup: `--catchup-entries` (1 000 000) entries written, then the writer goes on open-loop
  at `--rate` for `--catchup-seconds` (10) while a reader in another process reads the million
  from the start; append latency (from the intended send time) with and without that reader.
  Then the same with a reader paced at `--catchup-pace` (50 000) entries a second
  (`read_ahead_entries_per_second`), reading what that pace covers in `--catchup-seconds`.
Bookies are real processes (sqlite metadata, tmp dirs, fsync on), started with the test
fixture's `BookieCluster`. Prints one JSON line per measurement, then a table. Timings belong
here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bkaio.bench.loads import LoadOutcome, run_open
from bkaio.bench.stats import percentile
from bkaio.ledger_client import BookKeeper, LedgerHandle, ReadHandle
from bkaio.logs import configure_logging
from tests.fixtures.bookies import BookieCluster

SHAPES = ((3, 3, 2), (5, 2, 2))
PAYLOAD = bytes(1024)
RESULTS: list[dict[str, Any]] = []


def report(**result: Any) -> None:
    RESULTS.append(result)
    print(json.dumps(result), flush=True)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


async def write_closed(bk: BookKeeper, shape: tuple[int, int, int], entries: int) -> int:
    lh = await bk.create_ledger(*shape, password=b"pw")
    window = 1000
    for start in range(0, entries, window):
        await asyncio.gather(*(lh.append(PAYLOAD) for _ in range(min(window, entries - start))))
    await lh.close()
    return lh.ledger_id


async def sequential(base: Path, entries: int) -> None:
    for shape in SHAPES:
        directory = base / f"sequential-e{shape[0]}"
        directory.mkdir()
        cluster = BookieCluster(f"sqlite://{directory / 'meta.db'}", directory, count=shape[0])
        async with cluster:
            async with BookKeeper.connect(cluster.metadata_uri, client_id="writer") as bk:
                ledger_id = await write_closed(bk, shape, entries)
            async with BookKeeper.connect(cluster.metadata_uri, client_id="reader") as bk:
                rh = await bk.open_ledger(ledger_id, password=b"pw", recovery=False)
                await read_whole(rh, entries)  # Warms the page cache and the connections.
                wall, cpu = time.perf_counter(), time.process_time()
                count = await read_whole(rh, entries)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                report(
                    bench="sequential",
                    shape=f"E{shape[0]}/Qw{shape[1]}/Qa{shape[2]}",
                    entries=count,
                    entries_per_second=round(count / wall),
                    mib_per_second=round(count * len(PAYLOAD) / wall / 2**20, 1),
                    client_cpu_us_per_entry=round(cpu / count * 1e6, 2),
                )


async def read_whole(rh: ReadHandle, entries: int) -> int:
    count = 0
    async for _entry in rh.read_iter(0, entries - 1):
        count += 1
    assert count == entries, count
    return count


async def child(role: str, *arguments: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, __file__, role, *arguments, stdout=asyncio.subprocess.PIPE
    )


@contextlib.asynccontextmanager
async def writer_and_tail_reader(
    base: Path, name: str, entries: int
) -> AsyncIterator[tuple[LedgerHandle, asyncio.subprocess.Process]]:
    """3 bookies, a ledger (E3/Qw3/Qa2) open by a writer that pushes its LAC on
    acknowledgement, and a reader of its first `entries` entries tailing it in another
    process (`tail_reader`), ready."""
    directory = base / name
    directory.mkdir()
    cluster = BookieCluster(f"sqlite://{directory / 'meta.db'}", directory, count=3)
    async with (
        cluster,
        BookKeeper.connect(
            cluster.metadata_uri, client_id="writer", explicit_lac_on_ack=True
        ) as bk,
    ):
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        reader = await child("tail-reader", cluster.metadata_uri, str(lh.ledger_id), str(entries))
        assert reader.stdout is not None
        assert (await reader.stdout.readline()).strip() == b"ready"
        yield lh, reader


async def tail(base: Path, rate: float, seconds: float, warmup_seconds: float) -> None:
    # run_open sends round(rate * duration) appends (at least one).
    warmup = max(1, round(rate * warmup_seconds)) if warmup_seconds > 0 else 0
    total = warmup + round(rate * seconds)
    async with writer_and_tail_reader(base, "tail", total) as (lh, reader):
        assert reader.stdout is not None
        acked: list[float] = [0.0] * total
        clock = time.monotonic

        def record(future: asyncio.Future[int]) -> None:
            if not future.cancelled() and future.exception() is None:
                acked[future.result()] = clock()

        def send(payload: bytes) -> asyncio.Future[int]:
            future = lh.append(payload)
            future.add_done_callback(record)
            return future

        # The warm-up's first appends leave in a burst while the processes' code paths warm
        # (hundreds acknowledged within a millisecond, delivered in one answer): on a 10 s
        # run that start alone can decide the p99.
        warming = LoadOutcome()
        if warmup:
            warming = await run_open(
                send, PAYLOAD, rate_per_second=rate, duration_seconds=warmup_seconds
            )
        outcome = await run_open(send, PAYLOAD, rate_per_second=rate, duration_seconds=seconds)
        delivered = json.loads(await reader.stdout.read())
        await reader.wait()
        await lh.close()
    errors = warming.errors + outcome.errors
    assert errors == 0 and len(delivered) == total, (
        warming.first_error or outcome.first_error,
        len(delivered),
    )
    every = [at - acked[entry_id] for entry_id, at in enumerate(delivered)]
    latencies = sorted(every[warmup:])
    report(
        bench="tail",
        rate_per_second=rate,
        entries=total - warmup,
        warmup_entries=warmup,
        ack_to_delivered_p50_ms=ms(percentile(latencies, 50)),
        ack_to_delivered_p99_ms=ms(percentile(latencies, 99)),
        ack_to_delivered_p999_ms=ms(percentile(latencies, 99.9)),
        ack_to_delivered_max_ms=ms(latencies[-1]),
        ack_to_delivered_p99_with_warmup_ms=ms(percentile(sorted(every), 99)),
        append_p99_ms=ms(percentile(sorted(outcome.latencies), 99)),
    )


async def tail_path(base: Path, entries: int, gap_seconds: float) -> None:
    async with writer_and_tail_reader(base, "tail-path", entries) as (lh, reader):
        assert reader.stdout is not None
        acked: list[float] = []
        for _ in range(entries):
            await lh.append(PAYLOAD)
            acked.append(time.monotonic())
            await asyncio.sleep(gap_seconds)
        delivered = json.loads(await reader.stdout.read())
        await reader.wait()
        await lh.close()
    latencies = sorted(at - acked[entry_id] for entry_id, at in enumerate(delivered))
    report(
        bench="tail-path",
        entries=entries,
        gap_ms=gap_seconds * 1000,
        ack_to_delivered_p50_ms=ms(percentile(latencies, 50)),
        ack_to_delivered_p99_ms=ms(percentile(latencies, 99)),
        ack_to_delivered_max_ms=ms(latencies[-1]),
    )


async def tail_reader(metadata: str, ledger_id: int, total: int) -> None:
    """Child process: tail the ledger; print the delivery time of every entry (JSON)."""
    delivered: list[float] = []
    clock = time.monotonic
    async with BookKeeper.connect(metadata, client_id="tail-reader") as bk:
        rh = await bk.open_ledger(ledger_id, password=b"pw", recovery=False)
        print("ready", flush=True)
        while len(delivered) < total:
            entries = await rh.wait_for_entries(len(delivered), timeout=30.0)
            now = clock()
            delivered += [now] * len(entries)
    sys.stdout.write(json.dumps(delivered))


async def catchup(base: Path, entries: int, rate: float, seconds: float, pace: float) -> None:
    directory = base / "catchup"
    directory.mkdir()
    cluster = BookieCluster(f"sqlite://{directory / 'meta.db'}", directory, count=3)
    async with cluster, BookKeeper.connect(cluster.metadata_uri, client_id="writer") as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        window = 1000
        for _ in range(entries // window):
            await asyncio.gather(*(lh.append(PAYLOAD) for _ in range(window)))
        await asyncio.sleep(2.0)  # Flushed: the reader reads entry logs, not the cache.
        alone = await run_open(lh.append, PAYLOAD, rate_per_second=rate, duration_seconds=5.0)

        async def appends_beside_reader(*arguments: str) -> tuple[dict[str, Any], LoadOutcome]:
            """`seconds` of appends while a catch-up reader (`catchup_reader`) runs."""
            reader = await child(
                "catchup-reader", cluster.metadata_uri, str(lh.ledger_id), *arguments
            )
            assert reader.stdout is not None
            assert (await reader.stdout.readline()).strip() == b"ready"
            outcome = await run_open(
                lh.append, PAYLOAD, rate_per_second=rate, duration_seconds=seconds
            )
            result = json.loads(await reader.stdout.read())
            await reader.wait()
            return result, outcome

        result, during = await appends_beside_reader(str(entries))
        paced_entries = min(entries, round(pace * seconds))
        paced_result, paced = await appends_beside_reader(str(paced_entries), str(pace))
        await lh.close()
    assert alone.errors == during.errors == paced.errors == 0, (
        alone.first_error,
        during.first_error,
        paced.first_error,
    )
    report(
        bench="catchup",
        entries=result["entries"],
        read_seconds=round(result["seconds"], 2),
        read_entries_per_second=round(result["entries"] / result["seconds"]),
        append_rate_per_second=rate,
        append_seconds=seconds,
        append_p99_alone_ms=ms(percentile(sorted(alone.latencies), 99)),
        append_p99_during_catchup_ms=ms(percentile(sorted(during.latencies), 99)),
        append_p999_during_catchup_ms=ms(percentile(sorted(during.latencies), 99.9)),
    )
    report(
        bench="catchup-paced",
        entries=paced_result["entries"],
        read_entries_per_second=round(paced_result["entries"] / paced_result["seconds"]),
        pace_entries_per_second=pace,
        append_p99_during_paced_catchup_ms=ms(percentile(sorted(paced.latencies), 99)),
        append_p999_during_paced_catchup_ms=ms(percentile(sorted(paced.latencies), 99.9)),
    )


async def catchup_reader(metadata: str, ledger_id: int, entries: int, pace: float | None) -> None:
    """Child process: read entries 0..entries-1 of the (open) ledger from the start (at most
    `pace` entries a second)."""
    async with BookKeeper.connect(
        metadata, client_id="catchup-reader", read_ahead_entries_per_second=pace
    ) as bk:
        rh = await bk.open_ledger(ledger_id, password=b"pw", recovery=False)
        print("ready", flush=True)
        started = time.perf_counter()
        count = 0
        async for batch in rh.read_batches(0, entries - 1):
            count += len(batch)
        seconds = time.perf_counter() - started
    sys.stdout.write(json.dumps({"entries": count, "seconds": seconds}))


def table() -> None:
    for result in RESULTS:
        fields = " ".join(f"{k}={v}" for k, v in result.items() if k != "bench")
        print(f"{result['bench']:>10}  {fields}")


async def main(arguments: argparse.Namespace) -> None:
    configure_logging(json=False, level="warning")
    with tempfile.TemporaryDirectory(prefix="bkaio-read-bench-") as directory:
        base = Path(directory)
        if arguments.bench in ("sequential", "all"):
            await sequential(base, arguments.entries)
        if arguments.bench in ("tail", "all"):
            await tail(base, arguments.rate, arguments.seconds, arguments.warmup_seconds)
        if arguments.bench in ("tail-path", "all"):
            await tail_path(base, arguments.path_entries, arguments.gap_ms / 1000)
        if arguments.bench in ("catchup", "all"):
            await catchup(
                base,
                arguments.catchup_entries,
                arguments.rate,
                arguments.catchup_seconds,
                arguments.catchup_pace,
            )
    table()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("tail-reader", "catchup-reader"):
        configure_logging(json=False, level="warning")
        role, *rest = sys.argv[1:]
        if role == "tail-reader":
            uvloop.run(tail_reader(rest[0], int(rest[1]), int(rest[2])))
        else:
            pace = float(rest[3]) if len(rest) > 3 else None
            uvloop.run(catchup_reader(rest[0], int(rest[1]), int(rest[2]), pace))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "bench",
        nargs="?",
        default="all",
        choices=("sequential", "tail", "tail-path", "catchup", "all"),
    )
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--catchup-entries", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=5000.0)
    parser.add_argument("--seconds", type=float, default=20.0, help="tail: writing time")
    parser.add_argument(
        "--warmup-seconds", type=float, default=1.0, help="tail: writing before it (not counted)"
    )
    parser.add_argument("--path-entries", type=int, default=1000, help="tail-path: appends")
    parser.add_argument("--gap-ms", type=float, default=5.0, help="tail-path: between appends")
    parser.add_argument(
        "--catchup-seconds", type=float, default=10.0, help="catchup: writing time (the read's)"
    )
    parser.add_argument(
        "--catchup-pace", type=float, default=50_000.0, help="catchup: the paced reader's entries/s"
    )
    uvloop.run(main(parser.parse_args()))
    os._exit(0)
