"""A bookie (and an autorecovery process) stops soon after SIGTERM whatever its dependencies are
doing, and shows the health of its supervised tasks.

The bound on stopping is generous (a liveness check, not a speed target): before, a bookie
whose etcd was gone waited for metadata retries (30 s each) and ignored SIGTERM meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.fixtures.bookies import BookieCluster, BookieClusterFactory, BookieProcess
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.standalone import base_port_args

STOP_BOUND_SECONDS = 10.0  # Liveness: far above the few seconds it takes.


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _bookie_info(config_path: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "bkaio.cli", "bookie", "info", "--config", str(config_path)]
    output = subprocess.run([*command, "--json"], check=True, capture_output=True, text=True)
    info: dict[str, Any] = json.loads(output.stdout)
    return info


def _start_logged(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)


def _start_autorecovery(metadata_uri: str, log_path: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "bkaio.autorecovery", "--metadata", metadata_uri]
    return _start_logged(command, log_path)


async def _sigterm_and_wait(process: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM; the exit code if it exits within STOP_BOUND_SECONDS, else None."""
    process.send_signal(signal.SIGTERM)
    try:
        return await asyncio.to_thread(process.wait, STOP_BOUND_SECONDS)
    except subprocess.TimeoutExpired:
        return None


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()]


def _stop_bound_failure(bookie: BookieProcess) -> str:
    return f"still running {STOP_BOUND_SECONDS} s after SIGTERM:\n{bookie.log_tail()}"


async def test_health_status_and_task_counters_are_visible(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(shards=2)
    bookie = cluster[0]
    status, health = await asyncio.to_thread(_get, bookie.admin_url + "/health")
    assert status == 200 and health == {"healthy": True, "reason": None}
    status, body = await asyncio.to_thread(_get, bookie.admin_url + "/status")
    assert status == 200 and body["healthy"] is True
    parent_tasks = {task["name"] for task in body["tasks"]}
    assert {"registration_mode", "worker_control[0]", "worker_control[1]"} <= parent_tasks
    status, info = await asyncio.to_thread(_get, bookie.admin_url + "/api/v1/bookie/info")
    assert status == 200 and info["healthy"] is True
    for shard in info["shards"]:
        assert shard["healthy"] is True
        tasks = {task["name"]: task for task in shard["tasks"]}
        assert {"sweep", "disk_check", "loop_lag_watch", "gc"} <= set(tasks)
        assert all(task["failures"] == 0 for task in tasks.values())
    info = await asyncio.to_thread(_bookie_info, bookie.config_path)
    assert info["status"]["healthy"] is True and info["status"]["tasks"]  # `bkaio bookie info`.
    metrics = await asyncio.to_thread(_text, bookie.admin_url + "/metrics")
    assert 'bkaio_task_failures_total{task="sweep"} 0.0' in metrics
    assert 'bkaio_task_failures_total{task="registration_mode"} 0.0' in metrics


async def test_sigterm_stops_a_bookie_whose_etcd_is_gone(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(metadata_uri=etcd_server.uri, shards=2)
    bookie = cluster[0]
    await asyncio.to_thread(etcd_server.kill)
    await asyncio.sleep(1.0)  # Keep-alives and watches are retrying by now.
    assert bookie.process is not None
    code = await _sigterm_and_wait(bookie.process)
    assert code is not None, _stop_bound_failure(bookie)


async def test_sigterm_stops_a_bookie_still_waiting_for_etcd(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    await asyncio.to_thread(etcd_server.kill)
    cluster = BookieCluster(etcd_server.uri, tmp_path, count=1)
    bookie = cluster.spawn(0)
    try:
        deadline = time.monotonic() + 60
        while b"etcd_retrying" not in bookie.log_path.read_bytes():  # Opening metadata.
            assert bookie.process is not None and bookie.process.poll() is None, bookie.log_tail()
            assert time.monotonic() < deadline, bookie.log_tail()
            await asyncio.sleep(0.1)
        assert bookie.process is not None
        code = await _sigterm_and_wait(bookie.process)
        assert code == 0, _stop_bound_failure(bookie)
    finally:
        await cluster.close()


async def test_sigterm_stops_a_bookie_with_a_dead_shard_worker(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(shards=2)
    bookie = cluster[0]
    workers = _children(bookie.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    assert bookie.process is not None
    code = await _sigterm_and_wait(bookie.process)
    assert code is not None, _stop_bound_failure(bookie)
    assert code != 0  # A worker died: not a clean stop.


async def test_sigterm_stops_autorecovery_whose_etcd_is_gone(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    log_path = tmp_path / "autorecovery.log"
    process = await asyncio.to_thread(_start_autorecovery, etcd_server.uri, log_path)
    try:
        deadline = time.monotonic() + 30
        while b"autorecovery_started" not in log_path.read_bytes():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            await asyncio.sleep(0.1)
        await asyncio.to_thread(etcd_server.kill)
        await asyncio.sleep(1.0)
        code = await _sigterm_and_wait(process)
        assert code == 0, log_path.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_sigterm_stops_a_standalone_cluster_whose_etcd_is_gone(tmp_path: Path) -> None:
    """`bkaio standalone --etcd`, its etcd killed: SIGTERM stops the standalone process and its
    bookies (which no longer reach their metadata) all the same."""
    data = tmp_path / "data"
    log_path = tmp_path / "standalone.log"
    command = [sys.executable, "-m", "bkaio.cli", "standalone", "--bookies", "1", "--etcd"]
    command += base_port_args(1, *command)  # etcd's ports too, from this worker's window.
    process = await asyncio.to_thread(_start_logged, [*command, "--data-dir", str(data)], log_path)
    try:
        deadline = time.monotonic() + 120
        while not (data / "ready.json").exists():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            await asyncio.sleep(0.1)
        (etcd,) = [pid for pid in _descendants(process.pid) if _is_etcd(pid)]
        os.kill(etcd, signal.SIGKILL)
        await asyncio.sleep(1.0)  # The bookies' keep-alives and watches are retrying by now.
        code = await _sigterm_and_wait(process)
        assert code is not None, log_path.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _descendants(pid: int) -> list[int]:
    found, pending = [], [pid]
    while pending:
        for child in _children(pending.pop()):
            found.append(child)
            pending.append(child)
    return found


def _is_etcd(pid: int) -> bool:
    try:
        first = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except FileNotFoundError:
        return False
    return first.endswith(b"etcd")
