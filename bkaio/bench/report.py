"""Output of `bkaio bench`: the rich table, the targets verdict, JSON lines and the PNG.

table(aggregates) -> rich Table           medians of the repeats, the worst value beside them
evaluate_targets(aggregates) -> [Verdict] the targets of reference/perf.md section 4
JsonlWriter                               one JSON line per run in benchmarks/results/
plot_percentiles(runs, path)              latency-by-percentile curves (log x, HdrHistogram
                                          style), one panel per workload, one line per system;
                                          and a last panel: latency against throughput
throughput_curves(runs)                   that panel's points: the open-loop workloads of one
                                          system, payload and quorum, by offered rate
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rich.table import Table

from bkaio.bench.stats import Aggregate, RunResult, aggregate_all


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _with_worst(median: float, worst: float, runs: int) -> str:
    return _ms(median) if runs == 1 else f"{_ms(median)} ({_ms(worst)})"


def table(aggregates: Sequence[Aggregate], *, title: str) -> Table:
    result = Table(title=title, title_justify="left", header_style="bold")
    result.add_column("workload", no_wrap=True)
    result.add_column("system", no_wrap=True)
    for heading in ("runs", "appends/s"):
        result.add_column(heading, justify="right")
    for heading in (
        "p50 ms",
        "p99 ms (max)",
        "p99.9 ms (max)",
        "max ms",
        "client µs/op",
        "servers µs/op",
    ):
        result.add_column(heading, justify="right")
    result.add_column("failed", justify="right", no_wrap=True)
    previous = ""
    for row in aggregates:
        if previous and row.workload != previous:
            result.add_section()
        previous = row.workload
        result.add_row(
            row.workload,
            row.system,
            str(row.runs),
            f"{row.appends_per_second:,.0f}",
            _ms(row.p50_ms),
            _with_worst(row.p99_ms, row.p99_ms_max, row.runs),
            _with_worst(row.p999_ms, row.p999_ms_max, row.runs),
            _ms(row.max_ms),
            f"{row.client_us_per_append:.1f}",
            f"{row.server_us_per_append:.1f}",
            f"{row.failed_runs} of {row.runs + row.failed_runs}" if row.failed_runs else "",
        )
    return result


@dataclass(frozen=True, slots=True)
class Verdict:
    target: str
    measured: str
    met: bool | None  # None: the suite did not measure it.


def _find(aggregates: Sequence[Aggregate], workload: str, system: str) -> Aggregate | None:
    return next((a for a in aggregates if a.workload == workload and a.system == system), None)


def evaluate_targets(aggregates: Sequence[Aggregate]) -> list[Verdict]:
    """The issue's targets, on the 1 KiB E3/Qw3/Qa2 workloads, medians of the repeats."""
    verdicts: list[Verdict] = []

    def check(workload: str, target: str, value: Any, limit: float, below: bool = True) -> None:
        row = _find(aggregates, workload, "bkaio")
        if row is None:
            verdicts.append(Verdict(target, "not measured", None))
            return
        measured = float(value(row))
        met = measured < limit if below else measured >= limit
        verdicts.append(Verdict(target, f"{measured:.2f}", met))

    check("open5000", "open-loop 5k/s p99 < 5 ms", lambda r: r.p99_ms, 5.0)
    check("open1000", "open-loop 1k/s p99 < 3 ms", lambda r: r.p99_ms, 3.0)
    check("serial", "serial p50 < 0.8 ms", lambda r: r.p50_ms, 0.8)
    check("serial", "serial p99 < 3 ms", lambda r: r.p99_ms, 3.0)
    check(
        "closed100",
        "client CPU/append <= 10 µs (closed100)",
        lambda r: r.client_us_per_append,
        10.0 + 1e-9,
    )
    check(
        "closed100",
        "bookie CPU/entry <= 15 µs (closed100, per bookie)",
        lambda r: r.server_us_per_entry_each,
        15.0 + 1e-9,
    )
    ours = _find(aggregates, "closed100", "bkaio")
    peer = _find(aggregates, "closed100", "nats-always")
    target = "closed100 throughput >= 1.5x NATS sync=always"
    if ours is None or peer is None or peer.appends_per_second <= 0:
        verdicts.append(Verdict(target, "not measured", None))
    else:
        ratio = ours.appends_per_second / peer.appends_per_second
        verdicts.append(Verdict(target, f"{ratio:.2f}x", ratio >= 1.5))
    return verdicts


def targets_table(verdicts: Sequence[Verdict]) -> Table:
    result = Table(title="targets (bkaio, medians)", title_justify="left", header_style="bold")
    result.add_column("target")
    result.add_column("measured", justify="right")
    result.add_column("met")
    for verdict in verdicts:
        mark = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}[verdict.met]
        result.add_row(verdict.target, verdict.measured, mark)
    return result


class JsonlWriter:
    """Appends one JSON object per line and flushes, so an interrupted run keeps what it did."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] = path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _x_position(percent: float, samples: int) -> float:
    """HdrHistogram's x axis: 1 / (1 - percentile); the max sits at 1 / (1 / samples)."""
    remaining = max(1.0 - percent / 100.0, 1.0 / max(samples, 1))
    return 1.0 / remaining


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One open-loop workload of a latency-vs-throughput curve: medians of its repeats."""

    workload: str
    offered_per_second: float
    appends_per_second: float
    p50_ms: float
    p99_ms: float


def throughput_curves(runs: Sequence[RunResult]) -> dict[str, list[CurvePoint]]:
    """The open-loop workloads of each (system, payload, quorum) with two rates or more, as
    points sorted by offered rate; keyed by a label naming the three."""
    open_loop = [run for run in runs if run.offered_per_second is not None]
    offered = {run.workload: run.offered_per_second or 0.0 for run in open_loop}
    kinds = {run.workload: (run.payload_bytes, run.quorum) for run in open_loop}
    curves: dict[str, list[CurvePoint]] = {}
    for row in aggregate_all(open_loop):
        rate = offered[row.workload]
        payload, quorum = kinds[row.workload]
        label = f"{row.system} {payload}B {quorum}"
        curves.setdefault(label, []).append(
            CurvePoint(row.workload, rate, row.appends_per_second, row.p50_ms, row.p99_ms)
        )
    return {
        label: sorted(points, key=lambda point: point.offered_per_second)
        for label, points in curves.items()
        if len({point.offered_per_second for point in points}) >= 2
    }


def plot_percentiles(runs: Sequence[RunResult], path: Path) -> Path | None:
    """One panel per workload; per system the curve of its median-p99 repeat; then the
    latency-vs-throughput panel when the runs make a curve. None: no runs."""
    if not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")  # Files only; never a display.
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(run.workload for run in runs))
    curves = throughput_curves(runs)
    panels = len(workloads) + (1 if curves else 0)
    columns = min(2, panels)
    rows = math.ceil(panels / columns)
    figure, axes_grid = plt.subplots(
        rows, columns, figsize=(7 * columns, 4.2 * rows), squeeze=False
    )
    ticks = [1.0, 2.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0]
    tick_labels = ["0%", "50%", "90%", "99%", "99.9%", "99.99%", "99.999%"]
    for index, workload in enumerate(workloads):
        axes = axes_grid[index // columns][index % columns]
        of_workload = [run for run in runs if run.workload == workload]
        for system in dict.fromkeys(run.system for run in of_workload):
            of_system = [run for run in of_workload if run.system == system]
            clean = [run for run in of_system if not run.errors and run.latency.count]
            repeats = sorted(clean or of_system, key=lambda r: r.latency.p99_ms)
            chosen = repeats[len(repeats) // 2]
            points = [
                (_x_position(percent, chosen.latency.count), max(value, 1e-3))
                for percent, value in chosen.latency.curve
            ]
            axes.plot(
                [x for x, _ in points],
                [y for _, y in points],
                marker=".",
                label=f"{system} ({chosen.appends_per_second:,.0f}/s)",
            )
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xticks(ticks, tick_labels)
        axes.set_xlim(1.0, 200000.0)
        axes.set_title(f"{workload}: {of_workload[0].description}", fontsize=9)
        axes.set_xlabel("percentile")
        axes.set_ylabel("latency (ms)")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
    if curves:
        index = len(workloads)
        _plot_curves(axes_grid[index // columns][index % columns], curves)
    for index in range(panels, rows * columns):
        axes_grid[index // columns][index % columns].set_visible(False)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _plot_curves(axes: Any, curves: dict[str, list[CurvePoint]]) -> None:
    """Latency against achieved throughput: p99 solid, p50 dashed, one colour per curve."""
    for number, (label, points) in enumerate(curves.items()):
        colour = f"C{number}"
        rates = [point.appends_per_second for point in points]
        axes.plot(rates, [max(p.p99_ms, 1e-3) for p in points], "o-", color=colour,
                  label=f"{label} p99")  # fmt: skip
        axes.plot(rates, [max(p.p50_ms, 1e-3) for p in points], ".--", color=colour,
                  label=f"{label} p50")  # fmt: skip
        for point in points:
            axes.annotate(
                f"{point.offered_per_second / 1000:g}k",
                (point.appends_per_second, max(point.p99_ms, 1e-3)),
                textcoords="offset points",
                xytext=(3, 4),
                fontsize=7,
            )
    axes.set_yscale("log")
    axes.set_title("latency vs throughput (open loop; labels: offered rate)", fontsize=9)
    axes.set_xlabel("achieved appends/s")
    axes.set_ylabel("latency (ms)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7)
