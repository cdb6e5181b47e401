"""The simulated disk's crash model and the simulated threads (bkaio.testing.sim)."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bkaio.testing.sim.disk import DiskModel, SimDisk
from bkaio.testing.sim.guards import sealed
from bkaio.testing.sim.loop import SimLoop
from bkaio.testing.sim.threads import ProcessCrashed, SimPool, SimSerialWorker

T = TypeVar("T")


def _disk(tmp_path: Path, **model: Any) -> SimDisk:
    return SimDisk(tmp_path, random.Random(3), DiskModel(**model))


def _open(path: Path) -> int:
    return os.open(path, os.O_CREAT | os.O_RDWR, 0o644)


def test_writes_reach_the_file_only_when_synced(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    fd = _open(tmp_path / "journal")
    disk.write(fd, b"hello", 0)
    assert (tmp_path / "journal").read_bytes() == b""  # Still in the "page cache".
    assert disk.unsynced_bytes == 5
    disk.fdatasync(fd)
    assert (tmp_path / "journal").read_bytes() == b"hello"
    disk.close(fd)


def test_power_loss_drops_unsynced_writes_a_process_crash_keeps_them(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    fd = _open(tmp_path / "a")
    disk.write(fd, b"synced", 0)
    disk.fdatasync(fd)
    disk.write(fd, b"+lost", 6)
    assert disk.crash(power_loss=True) == 5
    assert (tmp_path / "a").read_bytes() == b"synced"
    os.close(fd)

    fd = _open(tmp_path / "b")
    disk.write(fd, b"kept by the kernel", 0)
    disk.close(fd)  # A clean close does not make them durable ...
    disk.crash(power_loss=False)  # ... but only the process died: the page cache survives.
    assert (tmp_path / "b").read_bytes() == b"kept by the kernel"


def test_closed_files_lose_their_unsynced_writes_on_power_loss(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    fd = _open(tmp_path / "c")
    disk.write(fd, b"never synced", 0)
    disk.close(fd)
    disk.crash(power_loss=True)
    assert (tmp_path / "c").read_bytes() == b""


def test_a_torn_write_leaves_a_strict_prefix_of_the_oldest_unsynced_write(tmp_path: Path) -> None:
    torn = 0
    for seed in range(10):
        disk = SimDisk(tmp_path, random.Random(seed), DiskModel(tear=True))
        path = tmp_path / f"t{seed}"
        fd = _open(path)
        disk.write(fd, b"0123456789", 0)
        disk.write(fd, b"abcdef", 10)
        disk.crash(power_loss=True)
        os.close(fd)
        content = path.read_bytes()
        assert b"0123456789".startswith(content) and len(content) < 10
        torn += bool(content)
    assert torn  # Some seeds tear, some lose the write entirely.


def test_fsync_fails_after_n_syncs_of_matching_files_until_repaired(tmp_path: Path) -> None:
    disk = _disk(tmp_path, fail_syncs_after=1, fail_suffix=".jnl")
    journal, log = _open(tmp_path / "1.jnl"), _open(tmp_path / "1.log")
    disk.write(journal, b"first", 0)
    disk.fdatasync(journal)
    disk.write(journal, b"second", 5)
    with pytest.raises(OSError) as failed:
        disk.fdatasync(journal)
    assert failed.value.errno == errno.EIO
    assert (tmp_path / "1.jnl").read_bytes() == b"first"  # The failed sync's pages are dropped.
    disk.write(log, b"entry log", 0)
    disk.fdatasync(log)  # Other files are not aimed at.
    with pytest.raises(OSError):
        disk.fdatasync(journal)  # It keeps failing ...
    disk.repair()
    disk.write(journal, b"third", 5)
    disk.fdatasync(journal)  # ... until the device is back.
    assert (tmp_path / "1.jnl").read_bytes() == b"firstthird"
    assert disk.stats.failed_syncs == 2
    disk.close(journal)
    disk.close(log)


def test_a_deleted_files_inode_reused_starts_clean(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    fd = _open(tmp_path / "old")
    disk.write(fd, b"pending", 0)
    disk.close(fd)
    (tmp_path / "old").unlink()
    fd = _open(tmp_path / "new")
    disk.write(fd, b"mine", 0)
    disk.fdatasync(fd)
    assert (tmp_path / "new").read_bytes() == b"mine"
    disk.close(fd)


def simulate(main: Callable[[SimLoop], Coroutine[Any, Any, T]]) -> T:
    loop = SimLoop(random.Random(5))
    try:
        with sealed():
            return loop.run_until_complete(main(loop))
    finally:
        loop.close()


def test_a_serial_worker_runs_jobs_in_order_each_after_its_delay() -> None:
    async def main(loop: SimLoop) -> tuple[list[int], int, float, str, list[Any]]:
        worker = SimSerialWorker(loop, "writer", lambda: 0.01)
        done: list[int] = []
        for index in range(5):
            worker.post(done.append, index)
        started = loop.time()
        result = await asyncio.wrap_future(worker.submit(lambda: 7))
        elapsed = loop.time() - started
        failing = worker.submit(lambda: 1 // 0)
        try:
            await asyncio.wrap_future(failing)
        except ZeroDivisionError as error:
            raised = type(error).__name__
        worker.post(lambda: 1 // 0)  # Posted work reports its own errors: this one did not.
        worker.post(_crash)  # The process died inside the job: nothing to report.
        await asyncio.sleep(1)
        worker.shutdown()
        return done, result, elapsed, raised, [error["exception"] for error in loop.errors]

    done, result, elapsed, raised, errors = simulate(main)
    assert done == [0, 1, 2, 3, 4] and result == 7
    assert elapsed == pytest.approx(0.06, abs=0.001)  # Six jobs, one after the other.
    assert raised == "ZeroDivisionError"
    assert [type(error).__name__ for error in errors] == ["ZeroDivisionError"]


def _crash() -> None:
    raise ProcessCrashed("crash point")


def test_a_pool_runs_jobs_side_by_side_and_skips_cancelled_ones() -> None:
    async def main(loop: SimLoop) -> tuple[float, list[str]]:
        pool = SimPool(loop, "readers", 2, lambda: 0.1)
        ran: list[str] = []
        started = loop.time()
        first = loop.run_in_executor(pool, ran.append, "a")
        second = loop.run_in_executor(pool, ran.append, "b")
        third = loop.run_in_executor(pool, ran.append, "c")
        third.cancel()
        await asyncio.gather(first, second)
        elapsed = loop.time() - started
        await asyncio.sleep(1)
        pool.shutdown()
        return elapsed, ran

    elapsed, ran = simulate(main)
    assert elapsed == pytest.approx(0.1, abs=0.001)  # Two at a time: together.
    assert ran == ["a", "b"]
