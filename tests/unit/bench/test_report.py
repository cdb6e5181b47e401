"""The targets verdict, the table and the percentile PNG."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from rich.console import Console

from bkaio.bench.report import (
    JsonlWriter,
    evaluate_targets,
    plot_percentiles,
    table,
    throughput_curves,
)
from bkaio.bench.stats import RunResult, aggregate_all, summarize


def _run(system: str, workload: str, p50_ms: float, p99_ms: float, rate: float) -> RunResult:
    samples = [p50_ms / 1000.0] * 98 + [p99_ms / 1000.0] * 2
    return RunResult(
        bench_id="t",
        system=system,
        workload=workload,
        description=f"{workload} 1024B",
        shape="open",
        payload_bytes=1024,
        quorum="E3/Qw3/Qa2",
        repeat=1,
        elapsed_seconds=1.0,
        appends=int(rate),
        errors=0,
        appends_per_second=rate,
        offered_per_second=None,
        latency=summarize(samples),
        client_cpu_seconds=rate * 8e-6,
        server_cpu_seconds={"b0": rate * 12e-6, "b1": rate * 12e-6, "b2": rate * 12e-6},
    )


RUNS = [
    _run("bkaio", "serial", 0.5, 1.0, 2000.0),
    _run("bkaio", "closed100", 2.0, 8.0, 30000.0),
    _run("nats-always", "closed100", 4.0, 16.0, 15000.0),
    _run("bkaio", "open1000", 1.0, 2.5, 1000.0),
    _run("bkaio", "open5000", 1.5, 6.0, 5000.0),
]


def test_targets_are_judged_on_bkaio_medians() -> None:
    verdicts = {v.target: v for v in evaluate_targets(aggregate_all(RUNS))}
    assert verdicts["open-loop 5k/s p99 < 5 ms"].met is False
    assert verdicts["open-loop 1k/s p99 < 3 ms"].met is True
    assert verdicts["serial p50 < 0.8 ms"].met is True
    ratio = verdicts["closed100 throughput >= 1.5x NATS sync=always"]
    assert (ratio.measured, ratio.met) == ("2.00x", True)
    assert verdicts["client CPU/append <= 10 µs (closed100)"].met is True
    assert verdicts["bookie CPU/entry <= 15 µs (closed100, per bookie)"].met is True


def test_targets_without_a_peer_are_not_measured() -> None:
    verdicts = evaluate_targets(aggregate_all([RUNS[0]]))
    assert {v.met for v in verdicts if v.target != "serial p50 < 0.8 ms"} <= {None, True}
    assert any(v.measured == "not measured" for v in verdicts)


def test_the_table_shows_every_system_of_every_workload() -> None:
    console = Console(width=200, record=True)
    console.print(table(aggregate_all(RUNS), title="t"))
    text = console.export_text()
    assert text.count("bkaio") == 4 and "nats-always" in text
    assert "30,000" in text


def test_jsonl_writer_appends_one_object_per_line(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "r" / "x.jsonl")
    writer.write(RUNS[0].to_json())
    writer.write(RUNS[1].to_json())
    writer.close()
    lines = (tmp_path / "r" / "x.jsonl").read_text().splitlines()
    assert [json.loads(line)["workload"] for line in lines] == ["serial", "closed100"]


def test_percentile_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = plot_percentiles(RUNS, tmp_path / "p.png")
    assert path is not None
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_percentiles([], tmp_path / "none.png") is None


def _open(system: str, rate: float, achieved: float, p50_ms: float, p99_ms: float) -> RunResult:
    run = _run(system, f"open{rate:g}", p50_ms, p99_ms, achieved)
    return dataclasses.replace(run, offered_per_second=rate)


CURVE = [
    _open("bkaio", 5000.0, 5000.0, 1.5, 4.0),
    _open("bkaio", 1000.0, 1000.0, 1.0, 2.0),
    _open("bkaio", 40000.0, 31000.0, 900.0, 2000.0),  # Past saturation.
    _open("nats-always", 5000.0, 5000.0, 4.0, 20.0),  # One point: no curve.
]


def test_the_open_loop_workloads_of_a_system_make_its_throughput_curve() -> None:
    curves = throughput_curves([*RUNS, *CURVE])
    assert list(curves) == ["bkaio 1024B E3/Qw3/Qa2"]
    points = curves["bkaio 1024B E3/Qw3/Qa2"]
    assert [p.offered_per_second for p in points] == [1000.0, 5000.0, 40000.0]
    assert [p.appends_per_second for p in points] == [1000.0, 5000.0, 31000.0]
    assert points[-1].p99_ms == pytest.approx(2000.0)


def test_the_png_gets_a_throughput_panel_when_there_is_a_curve(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = plot_percentiles([*RUNS, *CURVE], tmp_path / "c.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
