"""Percentiles, run summaries and the medians of repeats."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bkaio.bench.stats import RunResult, aggregate, aggregate_all, percentile, summarize


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 99.9) == 100.0
    assert percentile(values, 100) == 100.0
    assert percentile(values, 0) == 1.0
    assert percentile([7.0], 99.9) == 7.0


def test_summary_is_in_milliseconds_and_sorts_in_place() -> None:
    samples = [0.004, 0.001, 0.002, 0.003]
    summary = summarize(samples)
    assert samples == [0.001, 0.002, 0.003, 0.004]
    assert (summary.count, summary.p50_ms, summary.max_ms) == (4, 2.0, 4.0)
    assert summary.mean_ms == pytest.approx(2.5)
    curve = dict(summary.curve)
    assert curve[0.0] == 1.0 and curve[100.0] == 4.0
    assert list(curve.values()) == sorted(curve.values())


def _run(system: str, workload: str, repeat: int, p99_ms: float, rate: float) -> RunResult:
    latency = summarize([p99_ms / 1000.0] * 10)
    return RunResult(
        bench_id="t",
        system=system,
        workload=workload,
        description="d",
        shape="closed",
        payload_bytes=1024,
        quorum="E3/Qw3/Qa2",
        repeat=repeat,
        elapsed_seconds=2.0,
        appends=int(rate * 2),
        errors=0,
        appends_per_second=rate,
        offered_per_second=None,
        latency=latency,
        client_cpu_seconds=0.2,
        server_cpu_seconds={"a": 0.3, "b": 0.3},
    )


def test_aggregate_takes_medians_and_keeps_the_worst() -> None:
    runs = [
        _run("bkaio", "w", i, p99, rate)
        for i, (p99, rate) in enumerate([(3.0, 1000.0), (9.0, 3000.0), (4.0, 2000.0)], start=1)
    ]
    row = aggregate(runs)
    assert (row.runs, row.p99_ms, row.p99_ms_max) == (3, 4.0, 9.0)
    assert (row.appends_per_second, row.appends_per_second_min) == (2000.0, 1000.0)
    assert row.server_us_per_append == pytest.approx(0.6 / 4000 * 1e6)
    assert row.server_us_per_entry_each == pytest.approx(row.server_us_per_append / 2)


def test_aggregate_all_groups_by_workload_then_system_in_first_seen_order() -> None:
    runs = [
        _run("bkaio", "w1", 1, 1.0, 10.0),
        _run("nats-always", "w1", 1, 1.0, 10.0),
        _run("bkaio", "w1", 2, 1.0, 10.0),
        _run("bkaio", "w2", 1, 1.0, 10.0),
    ]
    rows = aggregate_all(runs)
    assert [(r.workload, r.system, r.runs) for r in rows] == [
        ("w1", "bkaio", 2),
        ("w1", "nats-always", 1),
        ("w2", "bkaio", 1),
    ]


def test_a_run_serializes_with_derived_cpu_figures() -> None:
    record = _run("bkaio", "w", 1, 2.0, 1000.0).to_json()
    assert record["client_us_per_append"] == 100.0
    assert record["server_us_per_append"] == 300.0
    assert record["client_cpu_percent"] == 10.0
    assert record["latency"]["p99_ms"] == 2.0


def test_failed_runs_are_counted_but_kept_out_of_the_medians() -> None:
    good = _run("bkaio", "w", 1, 2.0, 1000.0)
    bad = dataclasses.replace(_run("bkaio", "w", 2, 500.0, 10.0), errors=1)
    row = aggregate([good, bad])
    assert (row.runs, row.failed_runs, row.errors, row.p99_ms) == (1, 1, 1, 2.0)
    only_bad = aggregate([bad])
    assert (only_bad.runs, only_bad.failed_runs, only_bad.p99_ms) == (0, 1, 500.0)


def test_a_run_round_trips_through_json() -> None:
    run = _run("bkaio", "w", 1, 2.0, 1000.0)
    assert RunResult.from_json(json.loads(json.dumps(run.to_json()))) == run
