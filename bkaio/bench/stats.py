"""Latency statistics of `bkaio bench`: exact sorted samples, percentiles, runs and their medians.

Pure. Latencies are kept as exact samples (one float per append, seconds) rather than in an
HdrHistogram: recording costs one `list.append` on the client's hot path, and a run holds at
most a few million samples. Percentiles use the nearest-rank definition.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Points of the percentile curve kept per run for the PNG (HdrHistogram-style x axis).
CURVE_PERCENTILES: tuple[float, ...] = (
    0.0,
    10.0,
    25.0,
    50.0,
    75.0,
    90.0,
    95.0,
    99.0,
    99.5,
    99.9,
    99.95,
    99.99,
    99.999,
    100.0,
)


def percentile(sorted_values: Sequence[float], percent: float) -> float:
    """Nearest-rank percentile of ascending `sorted_values`; 100 is the max."""
    assert sorted_values, "percentile of no samples"
    assert 0.0 <= percent <= 100.0, percent
    rank = math.ceil(percent / 100.0 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencySummary:
    count: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    mean_ms: float
    curve: tuple[tuple[float, float], ...]  # (percentile, latency ms)


def summarize(latencies_seconds: list[float]) -> LatencySummary:
    """Sorts `latencies_seconds` in place and summarizes it."""
    assert latencies_seconds, "no latency samples"
    latencies_seconds.sort()
    values = latencies_seconds

    def ms(percent: float) -> float:
        return round(percentile(values, percent) * 1000.0, 4)

    return LatencySummary(
        count=len(values),
        p50_ms=ms(50.0),
        p99_ms=ms(99.0),
        p999_ms=ms(99.9),
        max_ms=round(values[-1] * 1000.0, 4),
        mean_ms=round(statistics.fmean(values) * 1000.0, 4),
        curve=tuple((percent, ms(percent)) for percent in CURVE_PERCENTILES),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """One measured run: one system, one workload, one repeat. Serialized as one JSON line."""

    bench_id: str
    system: str  # "bkaio", "nats-always", "nats-default"
    workload: str
    description: str
    shape: str
    payload_bytes: int
    quorum: str
    repeat: int
    elapsed_seconds: float
    appends: int
    errors: int
    appends_per_second: float
    offered_per_second: float | None
    latency: LatencySummary
    client_cpu_seconds: float
    server_cpu_seconds: dict[str, float]  # server name -> CPU seconds over the measured phase
    metadata: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def server_cpu_total_seconds(self) -> float:
        return sum(self.server_cpu_seconds.values())

    @property
    def client_us_per_append(self) -> float:
        return self.client_cpu_seconds / max(self.appends, 1) * 1e6

    @property
    def server_us_per_append(self) -> float:
        """Server CPU per append, summed over every server."""
        return self.server_cpu_total_seconds / max(self.appends, 1) * 1e6

    @property
    def server_us_per_entry_each(self) -> float:
        """Average CPU of one server per append it stored."""
        servers = max(len(self.server_cpu_seconds), 1)
        return self.server_us_per_append / servers

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> RunResult:
        """Inverse of `to_json` (derived fields are dropped and recomputed)."""
        names = {f.name for f in fields(cls)}
        values = {key: value for key, value in record.items() if key in names}
        latency = dict(values.pop("latency"))
        latency["curve"] = tuple(tuple(point) for point in latency.get("curve", ()))
        return cls(latency=LatencySummary(**latency), **values)

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["client_us_per_append"] = round(self.client_us_per_append, 2)
        record["server_us_per_append"] = round(self.server_us_per_append, 2)
        record["client_cpu_percent"] = round(
            100.0 * self.client_cpu_seconds / self.elapsed_seconds, 1
        )
        record["server_cpu_percent"] = round(
            100.0 * self.server_cpu_total_seconds / self.elapsed_seconds, 1
        )
        return record


@dataclass(frozen=True, slots=True, kw_only=True)
class Aggregate:
    """The repeats of one (system, workload): medians, with the worst value kept beside them."""

    system: str
    workload: str
    description: str
    runs: int  # Runs without errors: the medians are theirs (all runs' when none is clean).
    failed_runs: int
    errors: int
    appends_per_second: float
    appends_per_second_min: float
    p50_ms: float
    p99_ms: float
    p99_ms_max: float
    p999_ms: float
    p999_ms_max: float
    max_ms: float  # The max over every run.
    client_us_per_append: float
    server_us_per_append: float
    server_us_per_entry_each: float


def aggregate(all_runs: Sequence[RunResult]) -> Aggregate:
    """Medians over the runs without errors (all runs when every one failed)."""
    assert all_runs, "aggregate of no runs"
    first = all_runs[0]
    assert all((r.system, r.workload) == (first.system, first.workload) for r in all_runs)
    good = [r for r in all_runs if not r.errors]
    runs = good or list(all_runs)

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 4)

    return Aggregate(
        system=first.system,
        workload=first.workload,
        description=first.description,
        runs=len(good),
        failed_runs=sum(1 for r in all_runs if r.errors),
        errors=sum(r.errors for r in all_runs),
        appends_per_second=median([r.appends_per_second for r in runs]),
        appends_per_second_min=min(r.appends_per_second for r in runs),
        p50_ms=median([r.latency.p50_ms for r in runs]),
        p99_ms=median([r.latency.p99_ms for r in runs]),
        p99_ms_max=max(r.latency.p99_ms for r in runs),
        p999_ms=median([r.latency.p999_ms for r in runs]),
        p999_ms_max=max(r.latency.p999_ms for r in runs),
        max_ms=max(r.latency.max_ms for r in runs),
        client_us_per_append=median([r.client_us_per_append for r in runs]),
        server_us_per_append=median([r.server_us_per_append for r in runs]),
        server_us_per_entry_each=median([r.server_us_per_entry_each for r in runs]),
    )


def aggregate_all(runs: Sequence[RunResult]) -> list[Aggregate]:
    """One `Aggregate` per (workload, system), in the order the runs first appeared."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for run in runs:
        groups.setdefault((run.workload, run.system), []).append(run)
    return [aggregate(group) for group in groups.values()]
