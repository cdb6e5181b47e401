"""Smoke test of the benchmark harness: `bkaio bench --suite quick` completes, numbers are sane.

Runs the real thing (3 bookies with fsync) on two of the quick suite's workloads, with
`--peer none`: each NATS config costs a 3-server JetStream cluster start (some 10 s here), which
`make bench` pays, not `make test`. The peer's plumbing is checked apart, against a real
3-server JetStream cluster when `nats-server` is installed: it starts, acknowledges publishes
to its R3 stream, purges between runs and stops every server. Asserts only completion and
internal consistency, never a speed.
"""

from __future__ import annotations

import asyncio
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

from bkaio.bench.nats_system import NatsSystem, _server_conf, nats_server_binary
from bkaio.bench.spec import default_spec_path, read_suite

REPO = Path(__file__).resolve().parents[3]
RUN_TIMEOUT_SECONDS = 240
HAS_NATS = nats_server_binary() is not None and importlib.util.find_spec("nats") is not None


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
        "none",  # The peer: test_the_nats_peer_acknowledges_publishes_and_stops.
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
    assert {(run["workload"], run["system"]) for run in runs} == {
        ("serial", "bkaio"),
        ("open1000", "bkaio"),
    }
    for run in runs:
        latency = run["latency"]
        assert run["errors"] == 0 and run["appends"] > 0, run
        assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["p999_ms"] <= latency["max_ms"]
        assert run["appends_per_second"] > 0
        assert run["client_cpu_seconds"] >= 0
        assert len(run["server_cpu_seconds"]) == 3
        assert all(seconds >= 0 for seconds in run["server_cpu_seconds"].values())
    assert {row["system"] for row in summary["aggregates"]} == {"bkaio"}
    if plot:
        assert summary["png"] and Path(summary["png"]).read_bytes()[:4] == b"\x89PNG"
    assert any(t["target"].startswith("serial p50") for t in summary["targets"])


def test_the_nats_configs_differ_only_in_the_sync_interval(tmp_path: Path) -> None:
    always = _server_conf("n0", 4222, 6222, [6222, 6223, 6224], tmp_path, "always")
    default = _server_conf("n0", 4222, 6222, [6222, 6223, 6224], tmp_path, "default")
    assert "  sync_interval: always\n" in always and "sync_interval" not in default
    assert always.replace("  sync_interval: always\n", "") == default
    assert default.count("nats-route://") == 3 and f'store_dir: "{tmp_path}"' in default


@pytest.mark.skipif(not HAS_NATS, reason="nats-server or nats-py not installed")
async def test_the_nats_peer_acknowledges_publishes_and_stops(bench_dir: Path) -> None:
    """What a bench run asks of the peer, on a real 3-server JetStream cluster (sync=always)."""
    (serial,) = [
        w for w in read_suite(default_spec_path(), "quick").workloads if w.label == "serial"
    ]
    system = NatsSystem(bench_dir / "nats-always", sync="always")
    try:
        await system.start()
        pids = system.server_pids()
        assert len(pids) == 3 and system.leader in pids
        described = system.describe()
        assert (described["system"], described["replicas"]) == ("nats-always", 3)
        assert described["sync_interval"] == "always" and described["leader"] == system.leader
        for _ in range(2):  # Each run opens its appender on a purged stream.
            appender = await system.open_appender(serial)
            acks = await asyncio.gather(*(appender.send(b"p" * 1024) for _ in range(200)))
            assert all(ack.stream == "BKAIOBENCH" and not ack.duplicate for ack in acks)
            assert len({ack.seq for ack in acks}) == 200
            await appender.close()
        system.check_alive()
    finally:
        await system.stop()
    assert system.server_pids() == {}  # Every server stopped and reaped.


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
