"""`bkaio bench`: measure bkaio against NATS JetStream on this host (issue 8).

Starts the clusters itself (3 bookies with fsync on; 3 nats-server processes per peer config),
runs the workloads of benchmarks/workloads.toml, prints a table of medians and the targets
verdict, and leaves one JSON line per run, a PNG of the latency percentile curves and, with
`--profile`, py-spy profiles in the results directory.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from bkaio.cli.params import Int
from bkaio.errors import BKError

TABLE_WIDTH = 150


class BenchFailedError(BKError):
    """A benchmark run failed appends or measured nothing."""


@click.command()
@click.option(
    "--suite",
    default="full",
    show_default=True,
    help="Suite of the spec file: full (make bench, ~14 min) or quick (make bench-quick, ~1 min).",
)
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Workload spec (default: benchmarks/workloads.toml).",
)
@click.option(
    "--peer",
    type=click.Choice(["nats", "none"]),
    default="nats",
    show_default=True,
    help="Also measure NATS JetStream (sync_interval always and default), or nothing.",
)
@click.option(
    "--metadata",
    "metadata_kind",
    type=click.Choice(["embedded", "etcd"]),
    default="embedded",
    show_default=True,
    help="bkaio's metadata store: the embedded SQLite store or a local etcd process.",
)
@click.option(
    "--only",
    multiple=True,
    metavar="WORKLOAD",
    help="Run only these workloads of the suite (repeatable).",
)
@click.option("--repeats", type=Int(1, 100), default=None, help="Override the suite's.")
@click.option(
    "--results-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("benchmarks/results"),
    show_default=True,
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the clusters keep their data and logs (default: a temporary directory).",
)
@click.option(
    "--profile",
    is_flag=True,
    help="py-spy the client and bookie-0 during the first 1 KiB bkaio workload.",
)
@click.option(
    "--profile-format",
    type=click.Choice(["flamegraph", "raw", "speedscope"]),
    default="flamegraph",
    show_default=True,
)
@click.option("--profile-native", is_flag=True, help="Sample C frames too (py-spy --native).")
@click.option("--no-plot", is_flag=True, help="Skip the PNG (matplotlib not needed then).")
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Run nothing: print the tables (and PNG) of a results .jsonl file again.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
def bench(
    suite: str,
    spec_path: Path | None,
    peer: str,
    metadata_kind: str,
    only: tuple[str, ...],
    repeats: int | None,
    results_dir: Path,
    work_dir: Path | None,
    profile: bool,
    profile_format: str,
    profile_native: bool,
    no_plot: bool,
    report_path: Path | None,
    as_json: bool,
) -> int:
    """Benchmark bkaio (and NATS JetStream) on loopback; print the median table."""
    from rich.console import Console

    from bkaio.bench.spec import BenchSpecError, default_spec_path, read_suite
    from bkaio.cli.common import run
    from bkaio.logs import configure_logging

    configure_logging(json=False, level="warning")
    console = Console(stderr=as_json, highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, TABLE_WIDTH)  # Logs and CI: never squeeze the table.
    if report_path is not None:
        return _finish(_load_report(report_path), suite, console, no_plot=no_plot, as_json=as_json)
    chosen = read_suite(spec_path or default_spec_path(), suite)
    if only:
        unknown = sorted(set(only) - {w.label for w in chosen.workloads})
        if unknown:
            raise BenchSpecError(
                f"--only {unknown}: not in suite {suite!r} "
                f"({', '.join(w.label for w in chosen.workloads)})"
            )
        chosen = dataclasses.replace(
            chosen, workloads=tuple(w for w in chosen.workloads if w.label in only)
        )
    if repeats is not None:
        chosen = dataclasses.replace(chosen, repeats=repeats)
    from bkaio.bench.runner import BenchOptions, run_bench

    options = BenchOptions(
        suite=chosen,
        peer="nats" if peer == "nats" else "none",
        metadata="etcd" if metadata_kind == "etcd" else "embedded",
        results_dir=results_dir,
        work_dir=work_dir,
        profile=profile,
        profile_format="raw"
        if profile_format == "raw"
        else ("speedscope" if profile_format == "speedscope" else "flamegraph"),
        profile_native=profile_native,
    )
    report = run(run_bench(options, console))
    return _finish(report, options.suite.name, console, no_plot=no_plot, as_json=as_json)


def _load_report(path: Path) -> Any:
    from bkaio.bench.runner import BenchReport
    from bkaio.bench.stats import RunResult

    runs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            runs.append(RunResult.from_json(json.loads(line)))
        except (ValueError, TypeError, KeyError) as error:
            raise BenchFailedError(f"{path}:{number}: not a bench result line: {error}") from None
    if not runs:
        raise BenchFailedError(f"{path} holds no runs")
    return BenchReport(bench_id=runs[0].bench_id, runs=runs, results_path=path)


def _finish(report: Any, suite: str, console: Any, *, no_plot: bool, as_json: bool) -> int:
    from bkaio.bench.profiling import top_self_frames
    from bkaio.bench.report import evaluate_targets, plot_percentiles, table, targets_table
    from bkaio.bench.stats import aggregate_all

    aggregates = aggregate_all(report.runs)
    verdicts = evaluate_targets(aggregates)
    png = None
    if not no_plot and report.results_path is not None:
        png = plot_percentiles(report.runs, report.results_path.with_suffix(".png"))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "bench_id": report.bench_id,
                    "suite": suite,
                    "results": str(report.results_path),
                    "png": str(png) if png else None,
                    "profiles": [str(p) for p in report.profiles],
                    "systems": report.systems,
                    "aggregates": [dataclasses.asdict(a) for a in aggregates],
                    "targets": [dataclasses.asdict(v) for v in verdicts],
                }
            )
        )
    else:
        repeats = max((run.repeat for run in report.runs), default=0)
        title = (
            f"bkaio bench {report.bench_id}: suite {suite}, "
            f"median of up to {repeats} repeats (worst in brackets)"
        )
        console.print(table(aggregates, title=title))
        console.print(targets_table(verdicts))
        console.print(f"runs   {report.results_path}")
        if png:
            console.print(f"plot   {png}")
        for path in report.profiles:
            console.print(f"profile {path}")
            if path.suffix == ".txt":
                for frame, share in top_self_frames(path.read_text(), limit=10):
                    console.print(f"  {share:5.1f}%  {frame}")
    failed = [run for run in report.runs if run.errors or run.appends == 0]
    if failed:
        first = failed[0]
        raise BenchFailedError(
            f"{len(failed)} run(s) failed, first: {first.system} {first.workload} "
            f"#{first.repeat}: {first.extra.get('first_error', 'no append completed')}"
        )
    return 0
