"""Single-bookie add throughput and latency with a raw pipelined client.

    .venv/bin/python benchmarks/bookie_bench.py [--shards 1 2] [--adds 20000] [--window 256]

Starts a real bookie (`python -m bkaio.bookie`, sqlite metadata, tmp dirs, fsync on), opens one
connection per shard, keeps `window` adds of `--payload-bytes` in flight on each (closed loop),
and reports adds/s, latency percentiles (send -> OK response) and the bookie's CPU per add: its
whole process tree, and the shard workers' event-loop threads alone (from /proc). Prints one
JSON line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bkaio.bench.procstat import CLOCK_TICKS_PER_SECOND, cpu_delta, tree_cpu_seconds, tree_pids
from bkaio.meta import initialise_cluster_at
from bkaio.protocol.digest import entry_digest, master_key
from bkaio.protocol.encoder import FrameEncoder
from bkaio.protocol.frames import FrameDecoder
from bkaio.protocol.messages import (
    AddEntryRequest,
    Flag,
    HelloRequest,
    decode_response,
)
from bkaio.protocol.status import Status
from bkaio.testing.procs import free_port, wait_for_port

KEY = master_key(b"bench", 0)  # Its bookie runs with ledger_key_check = "first_sight".


class BenchConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.decoder = FrameDecoder(64 << 20)
        self.waiters: dict[int, asyncio.Future[Status]] = {}
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for body in self.decoder.feed(data):
            response = decode_response(body)
            waiter = self.waiters.pop(response.request_id, None)
            if waiter is not None:
                waiter.set_result(response.status)


async def run_shard(
    host: str, port: int, ledger_id: int, adds: int, window: int, payload: bytes
) -> list[float]:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(BenchConnection, host, port)
    assert conn.transport is not None
    hello = loop.create_future()
    conn.waiters[0] = hello
    conn.transport.write(_frame(HelloRequest(0, 1, "bench", None)))
    assert await hello is Status.OK
    latencies: list[float] = []
    next_entry = 0
    in_flight = 0
    done = asyncio.Event()
    encoder = FrameEncoder(64 << 20)
    flush_scheduled = False

    def flush() -> None:
        nonlocal flush_scheduled
        flush_scheduled = False
        assert conn.transport is not None
        conn.transport.write(encoder.take())

    def send_one() -> None:
        nonlocal next_entry, in_flight, flush_scheduled
        entry_id = next_entry
        next_entry += 1
        in_flight += 1
        length = len(payload) * (entry_id + 1)
        digest = entry_digest(ledger_id, entry_id, entry_id - 1, length, payload)
        request = AddEntryRequest(
            entry_id + 1, ledger_id, entry_id, Flag.NONE, KEY, entry_id - 1, length, digest, payload
        )
        future = loop.create_future()
        conn.waiters[entry_id + 1] = future
        started = time.perf_counter()

        def completed(f: asyncio.Future[Status]) -> None:
            nonlocal in_flight
            assert f.result() is Status.OK, f.result()
            latencies.append(time.perf_counter() - started)
            in_flight -= 1
            if next_entry < adds:
                send_one()
            elif in_flight == 0:
                done.set()

        future.add_done_callback(completed)
        encoder.add(request)
        if not flush_scheduled:
            flush_scheduled = True
            loop.call_soon(flush)

    for _ in range(min(window, adds)):
        send_one()
    await done.wait()
    conn.transport.close()
    return latencies


def _frame(message: HelloRequest) -> bytes:
    encoder = FrameEncoder()
    encoder.add(message)
    return encoder.take()


def _percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


def start_bookie(directory: Path, shards: int) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    while any(free_port() == port + i for i in range(1, shards)):
        port = free_port()
    config = directory / "bookie.toml"
    metadata_uri = f"sqlite://{directory}/meta.db"
    asyncio.run(initialise_cluster_at(metadata_uri, exist_ok=True))  # Bookies need a cluster.
    config.write_text(
        f'[bookie]\nhost = "127.0.0.1"\nport = {port}\nshards = {shards}\n'
        f'[metadata]\nuri = "{metadata_uri}"\n'
        f"[admin]\nport = {free_port()}\n"
        '[server]\nledger_key_check = "first_sight"\n'  # Raw adds to ledgers without metadata.
        f'[storage]\njournal_dirs = ["{directory}/journal"]\nledger_dirs = ["{directory}/data"]\n'
        '[log]\nlevel = "warning"\n'
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "bkaio.bookie", "--config", str(config)],
        start_new_session=True,
        stderr=open(directory / "bookie.log", "wb"),  # noqa: SIM115
    )
    for shard in range(shards):
        wait_for_port("127.0.0.1", port + shard, timeout_seconds=60, process=process)
    return process, port


def _loop_thread_cpu_seconds(bookie_pid: int) -> float:
    """CPU of the workers' main threads (each worker's event loop runs on its main thread)."""
    total = 0.0
    for pid in tree_pids(bookie_pid):
        if pid == bookie_pid:
            continue  # The parent: admin HTTP and registration, not the data path.
        try:
            text = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_SECOND
    return total


async def bench(
    port: int, shards: int, adds: int, window: int, payload_bytes: int, bookie_pid: int
) -> dict[str, object]:
    payload = os.urandom(payload_bytes)
    cpu_before = tree_cpu_seconds(bookie_pid)
    loop_cpu_before = _loop_thread_cpu_seconds(bookie_pid)
    started = time.perf_counter()
    results = await asyncio.gather(
        *(
            run_shard("127.0.0.1", port + shard, 1000 + shard, adds, window, payload)
            for shard in range(shards)
        )
    )
    elapsed = time.perf_counter() - started
    cpu = cpu_delta(cpu_before, tree_cpu_seconds(bookie_pid))
    loop_cpu = _loop_thread_cpu_seconds(bookie_pid) - loop_cpu_before
    latencies = sorted(x for shard_latencies in results for x in shard_latencies)
    return {
        "shards": shards,
        "adds": len(latencies),
        "payload_bytes": payload_bytes,
        "window_per_connection": window,
        "adds_per_second": round(len(latencies) / elapsed),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
        "p999_ms": round(_percentile(latencies, 0.999) * 1000, 3),
        "max_ms": round(latencies[-1] * 1000, 3),
        "bookie_us_per_add": round(cpu * 1e6 / len(latencies), 2),
        "loop_thread_us_per_add": round(loop_cpu * 1e6 / len(latencies), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--adds", type=int, default=20_000, help="adds per shard")
    parser.add_argument("--window", type=int, default=256, help="adds in flight per connection")
    parser.add_argument("--payload-bytes", type=int, default=1024)
    args = parser.parse_args()
    for shards in args.shards:
        with tempfile.TemporaryDirectory(prefix="bkaio-bench-") as tmp:
            process, port = start_bookie(Path(tmp), shards)
            try:
                result = uvloop.run(
                    bench(port, shards, args.adds, args.window, args.payload_bytes, process.pid)
                )
                print(json.dumps(result), flush=True)
            finally:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(30)


if __name__ == "__main__":
    main()
