"""The benchmark run: start the clusters, run every workload on each system in turn, record.

    run_bench(options, console) -> BenchReport

Order: for each workload, for each repeat, every system once (bkaio, then each peer config), so
slow drifts of the box (page cache, disk, other tenants) hit all systems alike instead of one.
Each run: a fresh writer (ledger / purged stream), the warm-up, then the measured phase between
two CPU snapshots of the client (this process) and of every server process tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import structlog
from rich.console import Console

from bkaio.bench import loads, procstat, profiling
from bkaio.bench.bkaio_system import BkaioSystem, MetadataKind
from bkaio.bench.disk_settle import settle_disks
from bkaio.bench.nats_system import NatsSystem
from bkaio.bench.report import JsonlWriter
from bkaio.bench.spec import Suite, Workload
from bkaio.bench.stats import LatencySummary, RunResult, summarize
from bkaio.bench.systems import Appender, System
from bkaio.errors import BKError

log = structlog.get_logger(__name__)

PeerKind = Literal["nats", "none"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    suite: Suite
    peer: PeerKind = "nats"
    metadata: MetadataKind = "embedded"
    results_dir: Path = Path("benchmarks/results")
    work_dir: Path | None = None  # Cluster data; None: a temporary directory, removed after.
    profile: bool = False
    profile_format: profiling.ProfileFormat = "flamegraph"
    profile_native: bool = False
    bookies: int = 3


@dataclass(slots=True)
class BenchReport:
    bench_id: str
    runs: list[RunResult] = field(default_factory=list)
    results_path: Path | None = None
    profiles: list[Path] = field(default_factory=list)
    systems: list[dict[str, object]] = field(default_factory=list)


def _server_snapshot(system: System) -> dict[str, dict[int, float]]:
    return {name: procstat.tree_cpu_seconds(pid) for name, pid in system.server_pids().items()}


async def _phase(
    send: loads.Send, workload: Workload, payload: bytes, duration_seconds: float | None
) -> loads.LoadOutcome:
    """`duration_seconds` None: the measured phase as specified; else a warm-up of that length."""
    if workload.shape == "serial":
        if duration_seconds is None:
            return await loads.run_serial(send, payload, appends=workload.appends)
        return await loads.run_serial(send, payload, duration_seconds=duration_seconds)
    duration = workload.duration_seconds if duration_seconds is None else duration_seconds
    if workload.shape == "closed":
        return await loads.run_closed(
            send, payload, outstanding=workload.outstanding, duration_seconds=duration
        )
    return await loads.run_open(
        send, payload, rate_per_second=workload.rate_per_second, duration_seconds=duration
    )


class _Profiler:
    """Records the client and bookie-0 during the first measured 1 KiB run of bkaio (closed100 in
    the full suite; with `--only open5000`, the open loop)."""

    def __init__(self, options: BenchOptions, stem: Path) -> None:
        self.enabled = options.profile
        self.profile_format = options.profile_format
        self.native = options.profile_native
        self.stem = stem
        self.done = False
        self.outputs: list[Path] = []

    def wanted(self, system: System, workload: Workload) -> bool:
        return (
            self.enabled
            and not self.done
            and system.name == "bkaio"
            and workload.payload_bytes == 1024
        )

    @contextlib.asynccontextmanager
    async def around(self, system: System, workload: Workload) -> AsyncIterator[bool]:
        if not self.wanted(system, workload):
            yield False
            return
        self.done = True
        bookie_pid = next(iter(system.server_pids().values()))
        recordings = [
            await profiling.start_recording(
                "client",
                os.getpid(),
                self.stem,
                duration_seconds=workload.duration_seconds,
                profile_format=self.profile_format,
                native=self.native,
            ),
            await profiling.start_recording(
                "bookie",
                bookie_pid,
                self.stem,
                duration_seconds=workload.duration_seconds,
                profile_format=self.profile_format,
                subprocesses=True,  # The parent only routes; the shard worker does the work.
                native=self.native,
            ),
        ]
        await asyncio.sleep(0.5)  # py-spy attaches before the measured phase starts.
        try:
            yield True
        finally:
            for recording in recordings:
                output = await profiling.finish_recording(recording)
                if output is not None:
                    self.outputs.append(output)


@dataclass(slots=True)
class _Measured:
    outcome: loads.LoadOutcome
    client_cpu_seconds: float = 0.0
    server_cpu_seconds: dict[str, float] = field(default_factory=dict)
    profiled: bool = False
    failure: str = ""  # Why the run could not be done (setup, warm-up or close).


def _failure(stage: str, error: BaseException) -> str:
    return f"{stage}: {type(error).__name__}: {error}"


async def _measure(
    system: System, workload: Workload, profiler: _Profiler, appender: Appender
) -> _Measured:
    payload = os.urandom(workload.payload_bytes)
    if workload.warmup_seconds > 0:
        warm = await _phase(appender.send, workload, payload, workload.warmup_seconds)
        if warm.errors:
            return _Measured(warm, failure=f"warm-up: {warm.first_error}")
    gc.collect()  # Start each measured phase with an empty young generation.
    async with profiler.around(system, workload) as profiled:
        client_before = procstat.process_cpu_seconds(os.getpid())
        servers_before = _server_snapshot(system)
        outcome = await _phase(appender.send, workload, payload, None)
        client_after = procstat.process_cpu_seconds(os.getpid())
        servers_after = _server_snapshot(system)
    return _Measured(
        outcome,
        client_cpu_seconds=round(client_after - client_before, 3),
        server_cpu_seconds={
            name: round(procstat.cpu_delta(servers_before[name], servers_after[name]), 3)
            for name in servers_after
        },
        profiled=profiled,
    )


async def _attempt(system: System, workload: Workload, profiler: _Profiler) -> _Measured:
    """Measure one run; a failure (of the system, not of the harness) is recorded, not raised:
    the other runs still tell something, and the command exits non-zero at the end."""
    try:
        appender = await system.open_appender(workload)
    except BKError as error:
        return _Measured(loads.LoadOutcome(), failure=_failure("open writer", error))
    close_failure = ""
    try:
        measured = await _measure(system, workload, profiler, appender)
    finally:
        try:
            await appender.close()
        except BKError as error:
            close_failure = _failure("close writer", error)
    if close_failure and not measured.failure:
        measured.failure = close_failure
    return measured


async def _one_run(
    system: System,
    workload: Workload,
    repeat: int,
    bench_id: str,
    profiler: _Profiler,
    metadata: str,
    settle_seconds: float = 0.0,
) -> RunResult:
    measured = await _attempt(system, workload, profiler)
    outcome = measured.outcome
    latency = (
        summarize(outcome.latencies)
        if outcome.latencies
        else LatencySummary(count=0, p50_ms=0, p99_ms=0, p999_ms=0, max_ms=0, mean_ms=0, curve=())
    )
    extra: dict[str, object] = {}
    if outcome.first_error or measured.failure:
        extra["first_error"] = outcome.first_error or measured.failure
    if measured.failure:
        extra["failure"] = measured.failure
    if outcome.overloaded:
        extra["overloaded"] = True
    if measured.profiled:
        extra["profiled"] = True
    if settle_seconds:
        extra["disk_settle_seconds"] = round(settle_seconds, 2)
    return RunResult(
        bench_id=bench_id,
        system=system.name,
        workload=workload.label,
        description=workload.describe(),
        shape=workload.shape,
        payload_bytes=workload.payload_bytes,
        quorum=workload.quorum if system.name == "bkaio" else "R3 (majority ack)",
        repeat=repeat,
        elapsed_seconds=round(outcome.elapsed_seconds, 4),
        appends=outcome.appends,
        errors=outcome.errors or (1 if measured.failure else 0),
        appends_per_second=round(outcome.appends / max(outcome.elapsed_seconds, 1e-9), 1),
        offered_per_second=outcome.offered_per_second,
        latency=latency,
        client_cpu_seconds=measured.client_cpu_seconds,
        server_cpu_seconds=measured.server_cpu_seconds,
        metadata=metadata if system.name == "bkaio" else "",
        extra=extra,
    )


def _systems(options: BenchOptions, base: Path) -> list[System]:
    systems: list[System] = [
        BkaioSystem(base / "bkaio", bookies=options.bookies, metadata=options.metadata)
    ]
    if options.peer == "nats":
        systems.append(NatsSystem(base / "nats-always", sync="always"))
        systems.append(NatsSystem(base / "nats-default", sync="default"))
    return systems


async def run_bench(options: BenchOptions, console: Console) -> BenchReport:
    """Run the suite; SIGTERM cancels it cleanly (every cluster is stopped either way)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await _run_bench(options, console)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def _run_bench(options: BenchOptions, console: Console) -> BenchReport:
    bench_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    report = BenchReport(bench_id=bench_id)
    options.results_dir.mkdir(parents=True, exist_ok=True)
    stem = options.results_dir.resolve() / f"bench-{bench_id}"
    writer = JsonlWriter(stem.with_suffix(".jsonl"))
    report.results_path = writer.path
    profiler = _Profiler(options, stem)
    with contextlib.ExitStack() as stack:
        if options.work_dir is None:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bkaio-bench-")))
        else:
            base = options.work_dir
        systems = _systems(options, base)
        try:
            for system in systems:
                console.print(f"[dim]starting {system.name} ...[/]")
                await system.start()
                report.systems.append(system.describe())
            metadata_uri = str(report.systems[0].get("metadata", ""))
            await _run_all(
                options, systems, bench_id, profiler, metadata_uri, writer, report, console
            )
        finally:
            writer.close()
            for system in reversed(systems):
                await system.stop()
    report.profiles = profiler.outputs
    return report


async def _run_all(
    options: BenchOptions,
    systems: list[System],
    bench_id: str,
    profiler: _Profiler,
    metadata_uri: str,
    writer: JsonlWriter,
    report: BenchReport,
    console: Console,
) -> None:
    for workload in options.suite.workloads:
        for repeat in range(1, options.suite.repeats + 1):
            for system in systems:
                if system.name != "bkaio" and not workload.peer:
                    continue
                # What the previous run left to the disk is done before this one starts.
                settled = await settle_disks()
                result = await _one_run(
                    system, workload, repeat, bench_id, profiler, metadata_uri, settled
                )
                writer.write(result.to_json())
                report.runs.append(result)
                failed = f" [red]{result.errors} error(s): {result.extra.get('first_error')}[/]"
                console.print(
                    f"{workload.label:>16} #{repeat} {system.name:<13}"
                    f" {result.appends_per_second:>9,.0f}/s"
                    f"  p50 {result.latency.p50_ms:7.2f}  p99 {result.latency.p99_ms:7.2f}"
                    f"  p99.9 {result.latency.p999_ms:7.2f}  max {result.latency.max_ms:7.2f} ms"
                    f"  cpu client {result.client_us_per_append:6.1f}"
                    f" servers {result.server_us_per_append:6.1f} µs/append"
                    + (failed if result.errors else ""),
                    highlight=False,
                )
