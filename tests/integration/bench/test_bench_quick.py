"""Smoke test of the benchmark harness: `bkaio bench --suite quick` completes, numbers are sane.

Runs the real thing (3 bookies with fsync, and NATS JetStream when `nats-server` is installed)
on two of the quick suite's workloads. Asserts only completion and internal consistency, never
a speed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkaio.bench.nats_system import nats_server_binary

REPO = Path(__file__).resolve().parents[3]
RUN_TIMEOUT_SECONDS = 240


def _kill_leftovers(marker: str) -> None:
    """SIGKILL any process whose command line names this test's directory (a crashed harness
    would leave its servers behind; they run in their own sessions)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in command:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


@pytest.fixture
def bench_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    _kill_leftovers(str(tmp_path))


def test_quick_bench_completes_with_sane_numbers(bench_dir: Path) -> None:
    has_nats = nats_server_binary() is not None and importlib.util.find_spec("nats") is not None
    peer = "nats" if has_nats else "none"
    plot = importlib.util.find_spec("matplotlib") is not None  # The `bench` extra may be absent.
    results = bench_dir / "results"
    command = [
        sys.executable,
        "-m",
        "bkaio.cli",
        "bench",
        "--suite",
        "quick",
        "--only",
        "serial",
        "--only",
        "open1000",
        "--peer",
        peer,
        "--results-dir",
        str(results),
        "--work-dir",
        str(bench_dir / "work"),
        "--json",
        *([] if plot else ["--no-plot"]),
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    runs = [json.loads(line) for line in Path(summary["results"]).read_text().splitlines()]
    expected_systems = {"bkaio", "nats-always", "nats-default"} if peer == "nats" else {"bkaio"}
    assert {(run["workload"], run["system"]) for run in runs} == {
        (workload, system) for workload in ("serial", "open1000") for system in expected_systems
    }
    for run in runs:
        latency = run["latency"]
        assert run["errors"] == 0 and run["appends"] > 0, run
        assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["p999_ms"] <= latency["max_ms"]
        assert run["appends_per_second"] > 0
        assert run["client_cpu_seconds"] >= 0
        assert len(run["server_cpu_seconds"]) == 3
        assert all(seconds >= 0 for seconds in run["server_cpu_seconds"].values())
    assert {row["system"] for row in summary["aggregates"]} == expected_systems
    if plot:
        assert summary["png"] and Path(summary["png"]).read_bytes()[:4] == b"\x89PNG"
    assert any(t["target"].startswith("serial p50") for t in summary["targets"])


def test_a_bad_suite_name_is_a_one_line_error(bench_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bkaio.cli", "bench", "--suite", "nightly", "--peer", "none"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "BenchSpecError" in done.stderr and "no suite 'nightly'" in done.stderr
    assert "Traceback" not in done.stderr
