"""`bkaio standalone` keeps serving: it restarts a bookie killed with kill -9, refuses a second
standalone on its data directory, and gives up on a bookie that cannot start (bounded)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bkaio.cli.standalone import (
    MAX_QUICK_DEATHS,
    StandaloneCluster,
    StandaloneMetrics,
    SupervisedBookie,
)
from bkaio.localproc import LOOPBACK, free_port
from tests.fixtures.standalone import base_port_args

BKAIO = str(Path(sys.executable).parent / "bkaio")
READY_TIMEOUT_SECONDS = 90.0


def bkaio(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BKAIO, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


class RunningStandalone:
    """`bkaio standalone` as a child; its stderr (the supervisor's log) in a file."""

    def __init__(self, data_dir: Path, bookies: int = 3, *extra: str) -> None:
        self.data_dir = data_dir
        self.ready = data_dir / "ready.json"
        self.stderr_path = data_dir.parent / f"{data_dir.name}.stderr"
        argv = [BKAIO, "standalone", "--bookies", str(bookies), "--data-dir", str(data_dir)]
        extra = (*base_port_args(bookies, *extra), *extra)
        self.base_port = int(extra[extra.index("--base-port") + 1])
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                [*argv, *extra],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
            )
        # Ours: a ready.json left by a standalone killed earlier names another pid.
        self.description = self.wait_for(lambda d: d["pid"] == self.process.pid, "ready")

    def read_ready(self) -> dict[str, object] | None:
        try:
            description = json.loads(self.ready.read_text())
        except (OSError, ValueError):
            return None
        assert isinstance(description, dict)
        return description

    def wait_for(self, condition: object, what: str) -> dict[str, object]:
        assert callable(condition)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"standalone exited {self.process.returncode}: {self.stderr()}")
            description = self.read_ready()
            if description is not None and condition(description):
                return description
            if time.monotonic() > deadline:
                pytest.fail(f"standalone: {what} not seen: {self.stderr()}")
            time.sleep(0.1)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(45)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


METRICS_PORT = free_port()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningStandalone]:
    cluster = RunningStandalone(tmp_path / "standalone", 3, "--metrics-port", str(METRICS_PORT))
    try:
        yield cluster
    finally:
        cluster.stop()


def _bookies(description: dict[str, object]) -> list[dict[str, object]]:
    bookies = description["bookies"]
    assert isinstance(bookies, list)
    return bookies


def test_kill9_of_a_bookie_is_survived_and_the_bookie_restarted(
    running: RunningStandalone,
) -> None:
    uri = str(running.description["metadata"])
    victim, *others = _bookies(running.description)
    # On the ports the test gave it, from this worker's own window (tests/conftest.py).
    base = running.base_port
    assert [(b["bookie_id"], b["admin_url"]) for b in [victim, *others]] == [
        (f"{LOOPBACK}:{base + i}", f"http://{LOOPBACK}:{base + 100 + i}") for i in range(3)
    ]
    victim_pid = victim["pid"]
    assert isinstance(victim_pid, int)
    os.killpg(victim_pid, signal.SIGKILL)  # The bookie and its shard worker.

    # The others keep serving meanwhile: still running, still registered.
    for bookie in others:
        pid = bookie["pid"]
        assert isinstance(pid, int)
        os.kill(pid, 0)
    listed = json.loads(bkaio("shell", "listbookies", "--json", "--metadata", uri).stdout)
    assert {b["bookie_id"] for b in others} <= {b["bookie_id"] for b in listed}

    def restarted(description: dict[str, object]) -> bool:
        first = _bookies(description)[0]
        return first["restarts"] == 1 and first["pid"] != victim_pid

    after = running.wait_for(restarted, "the killed bookie restarted")
    assert [b["pid"] for b in _bookies(after)[1:]] == [b["pid"] for b in others]
    assert running.process.poll() is None
    assert "standalone_bookie_died" in running.stderr()

    # Counted on the standalone's own metrics, beside its process_* figures.
    with urllib.request.urlopen(f"http://{LOOPBACK}:{METRICS_PORT}/metrics", timeout=10) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    [restarts] = families["bkaio_standalone_bookie_restarts"].samples
    assert restarts.labels == {"bookie": "0"} and restarts.value == 1
    [cpu] = families["process_cpu_seconds"].samples
    assert cpu.labels == {"process": "standalone"}

    # Back to three writable bookies (the restarted one registers once the lease of the one
    # killed has lapsed): an E3 ledger (simpletest's) can be written and read.
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while True:
        listed = json.loads(bkaio("shell", "listbookies", "--json", "--metadata", uri).stdout)
        if sum(b["state"] == "writable" for b in listed) == 3:
            break
        assert time.monotonic() < deadline, f"not 3 writable bookies: {listed}"
        time.sleep(0.5)
    done = bkaio("shell", "simpletest", "--entries", "20", "--json", "--metadata", uri)
    assert done.returncode == 0, done.stderr


def test_a_second_standalone_on_the_same_directory_is_refused(
    running: RunningStandalone,
) -> None:
    before = running.ready.read_text()
    done = bkaio("standalone", "--data-dir", str(running.data_dir), timeout=60)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"pid {running.process.pid}" in done.stderr and "in use" in done.stderr
    assert running.ready.read_text() == before  # The first one's ready.json is untouched.
    assert running.process.poll() is None


def test_the_lock_goes_with_its_holder(tmp_path: Path) -> None:
    """A standalone killed with kill -9 leaves no stale lock: the next one starts."""
    first = RunningStandalone(tmp_path / "standalone", bookies=1)
    pids = [b["pid"] for b in _bookies(first.description)]
    first.process.kill()
    first.process.wait()
    for pid in pids:  # Its orphaned bookie still holds the ports: end it as a reboot would.
        assert isinstance(pid, int)
        os.killpg(pid, signal.SIGKILL)
    assert first.ready.exists()  # Left behind by the kill.
    second = RunningStandalone(tmp_path / "standalone", 1, "--base-port", str(first.base_port))
    try:
        assert second.description["metadata"] == first.description["metadata"]
        assert second.description["pid"] == second.process.pid
    finally:
        second.stop()


def test_a_bookie_that_keeps_dying_young_is_given_up_on(tmp_path: Path) -> None:
    """Restarts are bounded: after MAX_QUICK_DEATHS quick deaths in a row, no more."""
    config = tmp_path / "bookie-0" / "bookie.toml"
    config.parent.mkdir()
    config.write_text("[bookie]\nport = 'not a number'\n")  # Every start fails at once.
    bookie = SupervisedBookie(0, config)
    cluster = StandaloneCluster.__new__(StandaloneCluster)
    cluster.bookies = [bookie]
    cluster.metrics = StandaloneMetrics()
    clock = time.monotonic()  # A clock of our own: each bookie "lives" one second.
    bookie.spawn(clock)
    spawns = 1
    while True:
        assert bookie.process is not None
        bookie.process.wait(60)
        clock += 1.0
        cluster.supervise(clock)  # Notices the death and schedules a restart (or gives up).
        if bookie.given_up:
            break
        assert bookie.restart_at is not None and bookie.restart_at <= clock + 10.0
        clock += 10.0  # The backoff's cap: past any delay.
        assert cluster.supervise(clock)
        spawns += 1
        assert spawns <= MAX_QUICK_DEATHS + 1
    assert spawns == MAX_QUICK_DEATHS + 1
    assert not cluster.supervise(clock + 3600.0)  # Given up: never started again.
    assert cluster.metrics.registry.get_sample_value("bkaio_standalone_bookies_given_up") == 1


def test_the_readme_quickstart_runs_against_a_standalone(
    running: RunningStandalone, tmp_path: Path
) -> None:
    """The README's own code block (tests/unit/test_docs.py checks it is examples/quickstart.py),
    run as a user would after `bkaio standalone`."""
    from tests.unit.test_docs import readme_quickstart

    script = tmp_path / "quickstart.py"
    script.write_text(readme_quickstart())
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "BKAIO_METADATA": str(running.description["metadata"])},
    )
    assert done.returncode == 0, done.stderr
    assert "wrote entries 0..99" in done.stdout
    assert "first entries: ['event 0', 'event 1', 'event 2']" in done.stdout
