"""Before/after in one run: `bkaio bench` of two checkouts, alternated, on the same box.

    python benchmarks/ab_compare.py --before ../bkaio-before --after . \
        --only closed100 --only open5000 --rounds 3

Each checkout must have its own `.venv` (`make venv` there): the bookies and the client of a
run are that checkout's code. Rounds alternate which side goes first, so a drift of the box
(another tenant, a disk stall) hits both alike. Every run is one `bkaio bench --peer none
--repeats 1` per workload; the table shows each side's median over the rounds and the ratio.
A shared, noisy box decides a lot: read the spread (min-max) before believing a difference.

`make bench-ab BEFORE=DIR` runs it against the checkout in DIR.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

FIELDS = (
    ("appends_per_second", "appends/s", "{:,.0f}"),
    ("p50_ms", "p50 ms", "{:.2f}"),
    ("p99_ms", "p99 ms", "{:.2f}"),
    ("p999_ms", "p99.9 ms", "{:.2f}"),
    ("client_us_per_append", "client µs", "{:.1f}"),
    ("server_us_per_append", "servers µs", "{:.1f}"),
)


@dataclass
class Side:
    name: str
    checkout: Path
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    @property
    def bkaio(self) -> Path:
        return self.checkout / ".venv" / "bin" / "bkaio"


def run_once(side: Side, workload: str, results: Path) -> None:
    command = [
        str(side.bkaio), "bench", "--peer", "none", "--only", workload, "--repeats", "1",
        "--no-plot", "--json", "--results-dir", str(results),
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=side.checkout, capture_output=True, text=True, check=False, timeout=900
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        print(
            f"{side.name} {workload}: exit {done.returncode}: {' | '.join(tail)}", file=sys.stderr
        )
        return
    document = json.loads(done.stdout)
    for aggregate in document["aggregates"]:
        if aggregate["system"] != "bkaio":
            continue
        per_field = side.samples.setdefault(workload, {})
        for key, _label, _format in FIELDS:
            per_field.setdefault(key, []).append(float(aggregate[key]))
        print(
            f"{side.name:>6} {workload:<12} {aggregate['appends_per_second']:>9,.0f}/s "
            f"p50 {aggregate['p50_ms']:.2f} p99 {aggregate['p99_ms']:.2f} ms "
            f"client {aggregate['client_us_per_append']:.1f} µs "
            f"servers {aggregate['server_us_per_append']:.1f} µs",
            file=sys.stderr,
        )


def table(before: Side, after: Side, workloads: list[str]) -> str:
    lines = [
        "| workload | figure | before (median; min-max) | after (median; min-max) | after/before |",
        "| --- | --- | --- | --- | --- |",
    ]
    for workload in workloads:
        for key, label, fmt in FIELDS:
            a = before.samples.get(workload, {}).get(key, [])
            b = after.samples.get(workload, {}).get(key, [])
            if not a or not b:
                continue
            ma, mb = statistics.median(a), statistics.median(b)
            ratio = f"{mb / ma:.2f}" if ma else "-"
            lines.append(
                f"| {workload} | {label} | {fmt.format(ma)} ({fmt.format(min(a))}-"
                f"{fmt.format(max(a))}) | {fmt.format(mb)} ({fmt.format(min(b))}-"
                f"{fmt.format(max(b))}) | {ratio} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout with its own .venv")
    parser.add_argument("--after", type=Path, default=Path("."), help="checkout with its own .venv")
    parser.add_argument("--only", action="append", default=[], help="workload (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    workloads = args.only or ["closed100", "open5000", "serial"]
    sides = [Side("before", args.before.resolve()), Side("after", args.after.resolve())]
    for side in sides:
        if not side.bkaio.exists():
            parser.error(f"{side.bkaio} is missing: run `make venv` in {side.checkout}")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    with tempfile.TemporaryDirectory(prefix="bkaio-ab-") as results:
        for round_index in range(args.rounds):
            order = sides if round_index % 2 == 0 else list(reversed(sides))
            for workload in workloads:
                for side in order:
                    run_once(side, workload, Path(results))
    print(table(sides[0], sides[1], workloads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
