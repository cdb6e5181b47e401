"""Idle CPU: what a cluster that serves nothing costs, per process, read from /proc.

Starts `bkaio standalone` (SQLite metadata, or a local etcd with `--etcd`; 3 bookies, each a
parent with an autorecovery service and one shard worker per shard), waits until it is up and
`--settle` seconds more, then reads the CPU time (utime + stime, /proc/<pid>/stat) of every
process of the cluster over `--seconds`. Prints each kind of process's share of one core; the
target is under 1 % for every bkaio process (no retry or poll loop without backoff). etcd is
listed but not judged: its own raft ticks and our leases' keep-alives are what it costs.

    .venv/bin/python benchmarks/idle_cpu_bench.py [--etcd] [--seconds 20] [--json]

CPU time is what each process used, whatever else the box runs; on a loaded box the figures
still hold, though a starved process may run its timers late.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

TARGET_PERCENT = 1.0
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ProcessFigure:
    pid: int
    kind: str
    cpu_percent: float  # Of one core, over the measured window.


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat).


def command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except FileNotFoundError:
            continue
        for child in map(int, children):
            found.append(child)
            pending.append(child)
    return found


def kind_of(pid: int, root: int) -> str:
    if pid == root:
        return "standalone"
    args = command_line(pid)
    if any(arg.endswith("etcd") for arg in args[:1]):
        return "etcd"
    if "bkaio.bookie.worker" in args:
        return "shard worker"
    if "bkaio.bookie" in args:
        return "bookie parent (with autorecovery)"
    return " ".join(args[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--etcd", action="store_true", help="metadata in a local etcd")
    parser.add_argument("--bookies", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    data_dir = Path(tempfile.mkdtemp(prefix="bkaio-idle-bench-"))
    command = [sys.executable, "-m", "bkaio.cli", "standalone", "--data-dir", str(data_dir)]
    command += ["--bookies", str(args.bookies), "--json"] + (["--etcd"] if args.etcd else [])
    standalone = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (data_dir / "ready.json").exists():
            if standalone.poll() is not None or time.monotonic() > deadline:
                print("standalone did not start", file=sys.stderr)
                return 1
            time.sleep(0.2)
        time.sleep(args.settle)
        pids = [standalone.pid, *descendants(standalone.pid)]
        before = {pid: cpu_ticks(pid) for pid in pids}
        started = time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - started
        figures = [
            ProcessFigure(
                pid,
                kind_of(pid, standalone.pid),
                round(100.0 * (cpu_ticks(pid) - before[pid]) / TICKS / elapsed, 2),
            )
            for pid in pids
        ]
    finally:
        standalone.send_signal(signal.SIGTERM)
        try:
            standalone.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(standalone.pid, signal.SIGKILL)
            standalone.wait()
    worst = max(figure.cpu_percent for figure in figures if figure.kind != "etcd")
    if args.json:
        print(json.dumps({"seconds": args.seconds, "processes": [asdict(f) for f in figures]}))
    else:
        metadata = "etcd" if args.etcd else "SQLite"
        print(f"idle {args.bookies}-bookie standalone ({metadata} metadata), {args.seconds:g} s:")
        for figure in sorted(figures, key=lambda f: (f.kind, f.pid)):
            print(f"  {figure.kind:36} pid {figure.pid:>7}  {figure.cpu_percent:5.2f} % of a core")
        print(f"worst bkaio process {worst:.2f} % (target < {TARGET_PERCENT:g} %)")
    return 0 if worst < TARGET_PERCENT else 1


if __name__ == "__main__":
    sys.exit(main())
