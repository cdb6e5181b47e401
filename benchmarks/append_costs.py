"""CPU and context switches per append, per process and thread, of a bkaio cluster under load.

    .venv/bin/python benchmarks/append_costs.py [--loads 5000,10000,closed100] [--seconds 8]
                                                [--strace]

Starts the harness's cluster (`BkaioSystem`: 3 bookies with fdatasync, embedded metadata, the
client in this process), and for each load (an open-loop rate, or `closedN` for N outstanding)
runs a warm-up and a measured phase, reading every thread's CPU and voluntary / involuntary
context switches from /proc before and after. Prints them per append, per thread and summed
(the client is this process; a bookie is its parent and its shard worker). `--strace` counts the
system calls of bookie-0's shard worker during each measured phase (`strace -c -f`, which slows
that bookie down). Latency is printed too, but on a shared box it says more about the box.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bkaio.bench import loads
from bkaio.bench.bkaio_system import BkaioSystem
from bkaio.bench.procstat import tree_pids
from bkaio.bench.spec import Workload

TICKS = os.sysconf("SC_CLK_TCK")


class ThreadSample(NamedTuple):
    cpu_seconds: float
    voluntary: int
    involuntary: int


def threads_of(pid: int) -> dict[int, ThreadSample]:
    """Every thread of `pid` (by thread id) with its CPU seconds and context switches."""
    samples: dict[int, ThreadSample] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return samples
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:
            continue  # Ended meanwhile.
        fields = stat[stat.rindex(")") + 2 :].split()
        switches = dict(line.split(":") for line in status.splitlines() if "ctxt_switches" in line)
        samples[int(task.name)] = ThreadSample(
            (int(fields[11]) + int(fields[12])) / TICKS,
            int(switches["voluntary_ctxt_switches"]),
            int(switches["nonvoluntary_ctxt_switches"]),
        )
    return samples


def snapshot(processes: dict[str, int]) -> dict[tuple[str, int, int], ThreadSample]:
    """(process name, pid, tid) -> sample; a bookie is its whole process tree."""
    result: dict[tuple[str, int, int], ThreadSample] = {}
    for name, pid in processes.items():
        for member in [pid] if name == "client" else tree_pids(pid):
            for tid, sample in threads_of(member).items():
                result[(name, member, tid)] = sample
    return result


def report(
    before: dict[tuple[str, int, int], ThreadSample],
    after: dict[tuple[str, int, int], ThreadSample],
    appends: int,
) -> None:
    totals: dict[str, list[float]] = {}
    for key, sample in sorted(after.items()):
        start = before.get(key, ThreadSample(0.0, 0, 0))
        cpu = sample.cpu_seconds - start.cpu_seconds
        voluntary = sample.voluntary - start.voluntary
        involuntary = sample.involuntary - start.involuntary
        name, pid, tid = key
        total = totals.setdefault(name.split("-")[0], [0.0, 0, 0])
        total[0] += cpu
        total[1] += voluntary
        total[2] += involuntary
        if cpu * 1e6 / appends >= 0.5 or voluntary / appends >= 0.005:
            thread = f"{pid}/{tid}{' (main)' if pid == tid else ''}"
            print(
                f"  {name:<9} {thread:<20} {cpu * 1e6 / appends:7.1f} µs/append  switches "
                f"{voluntary / appends:6.3f} voluntary {involuntary / appends:6.3f} involuntary"
            )
    for name, (total_cpu, total_voluntary, total_involuntary) in totals.items():
        print(
            f"  {name + ' (all)':<30} {total_cpu * 1e6 / appends:7.1f} µs/append  switches "
            f"{total_voluntary / appends:6.3f} voluntary "
            f"{total_involuntary / appends:6.3f} involuntary"
        )


async def phase(send: loads.Send, payload: bytes, load: str, seconds: float) -> loads.LoadOutcome:
    if load.startswith("closed"):
        return await loads.run_closed(
            send, payload, outstanding=int(load.removeprefix("closed")), duration_seconds=seconds
        )
    return await loads.run_open(
        send, payload, rate_per_second=float(load), duration_seconds=seconds
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="5000,closed100", help="rates and closedN, commas")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--strace", action="store_true", help="syscalls of bookie-0's worker")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bkaio-append-costs-") as tmp:
        system = BkaioSystem(Path(tmp))
        await system.start()
        try:
            shape = Workload(label="costs", shape="closed", outstanding=1, duration_seconds=1)
            payload = os.urandom(1024)
            for load in args.loads.split(","):
                appender = await system.open_appender(shape)
                await phase(appender.send, payload, load, args.warmup)
                gc.collect()
                processes = {"client": os.getpid(), **system.server_pids()}
                tracer = None
                if args.strace:
                    worker = tree_pids(system.server_pids()["bookie-0"])[-1]
                    output = Path(tmp) / f"strace-{load}.txt"
                    tracer = await asyncio.create_subprocess_exec(
                        "strace", "-c", "-f", "-p", str(worker), "-o", str(output)
                    )
                    await asyncio.sleep(0.5)
                before = snapshot(processes)
                began = time.perf_counter()
                outcome = await phase(appender.send, payload, load, args.seconds)
                elapsed = time.perf_counter() - began
                after = snapshot(processes)
                latencies = sorted(outcome.latencies)
                count = len(latencies)
                print(
                    f"{load}: {count / elapsed:,.0f} appends/s, p50 "
                    f"{latencies[count // 2] * 1e3:.2f} ms, p99 "
                    f"{latencies[int(count * 0.99)] * 1e3:.2f} ms"
                )
                report(before, after, count)
                if tracer is not None:
                    tracer.send_signal(signal.SIGINT)
                    await tracer.wait()
                    print(output.read_text())
                await appender.close()
        finally:
            await system.stop()


if __name__ == "__main__":
    uvloop.run(main())
