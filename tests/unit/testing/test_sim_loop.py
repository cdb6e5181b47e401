"""The simulation's event loop, its walls and its processes (bkaio.testing.sim)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bkaio.testing.sim import guards
from bkaio.testing.sim.guards import sealed
from bkaio.testing.sim.loop import SimDeadlockError, SimLivelockError, SimLoop, SimViolation
from bkaio.testing.sim.process import SimProcess
from bkaio.testing.sim.runner import run_isolated

T = TypeVar("T")


def simulate(main: Callable[[SimLoop], Coroutine[Any, Any, T]], seed: int = 0, **options: Any) -> T:
    loop = SimLoop(random.Random(seed), **options)
    try:
        with sealed():
            return loop.run_until_complete(main(loop))
    finally:
        loop.close()


def test_time_is_virtual_and_jumps_to_the_next_timer() -> None:
    async def main(loop: SimLoop) -> float:
        await asyncio.sleep(3600)
        return loop.time()

    started = time.monotonic()
    assert simulate(main) == pytest.approx(3600, abs=0.01)
    assert time.monotonic() - started < 5  # An hour of virtual time in far less real time.


def test_nothing_ready_and_no_timer_is_a_deadlock() -> None:
    async def main(loop: SimLoop) -> None:
        await loop.create_future()

    with pytest.raises(SimDeadlockError):
        simulate(main)


def test_a_spinning_task_hits_the_callback_budget() -> None:
    async def main(loop: SimLoop) -> None:
        while True:  # noqa: ASYNC110  (spinning is the point)
            await asyncio.sleep(0)

    with pytest.raises(SimLivelockError):
        simulate(main, max_callbacks=1000)


def _order_of_simultaneous_timers(seed: int, window: float = 0.0) -> list[int]:
    async def main(loop: SimLoop) -> list[int]:
        order: list[int] = []
        for index in range(8):
            loop.call_later(0.5 + index * 0.001, order.append, index)
        await asyncio.sleep(1)
        return order

    return simulate(main, seed, reorder_window=window)


def test_timers_due_together_run_in_an_order_the_seed_picks() -> None:
    assert _order_of_simultaneous_timers(3) == list(range(8))  # 1 ms apart, no window: in order.
    orders = {tuple(_order_of_simultaneous_timers(seed, window=0.01)) for seed in range(6)}
    assert len(orders) > 1  # Within the window the seed decides ...
    assert _order_of_simultaneous_timers(4, 0.01) == _order_of_simultaneous_timers(4, 0.01)


def test_call_soon_keeps_fifo_order_whatever_the_seed() -> None:
    async def main(loop: SimLoop) -> list[int]:
        order: list[int] = []
        for index in range(20):
            loop.call_soon(order.append, index)
        await asyncio.sleep(0.1)
        return order

    for seed in range(5):
        assert simulate(main, seed) == list(range(20))


def test_run_in_executor_runs_the_function_on_the_loop_after_a_delay() -> None:
    async def main(loop: SimLoop) -> tuple[int, float, int]:
        started = loop.time()
        value = await loop.run_in_executor(None, lambda: 6 * 7)
        return value, loop.time() - started, threading.get_ident()

    value, elapsed, thread = simulate(main)
    assert value == 42 and elapsed > 0 and thread == threading.get_ident()


def test_real_threads_sockets_sleeps_and_subprocesses_are_refused() -> None:
    async def main(loop: SimLoop) -> list[str]:
        refused = []
        real_pool = concurrent.futures.ThreadPoolExecutor()
        attempts: list[tuple[str, Callable[[], object]]] = [
            ("thread", lambda: threading.Thread(target=print).start()),
            ("sleep", lambda: time.sleep(0.01)),
            ("socket", lambda: socket.socket()),
            ("subprocess", lambda: subprocess.Popen(["true"])),
            (
                "executor",
                lambda: loop.run_in_executor(real_pool, print),
            ),
        ]
        for name, attempt in attempts:
            try:
                attempt()
            except SimViolation:
                refused.append(name)
        with pytest.raises(SimViolation):
            await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        return refused

    assert simulate(main) == ["thread", "sleep", "socket", "subprocess", "executor"]
    # Recorded even though caught: the runner fails a seed whose code tried (and swallowed it).
    assert guards.violations == ["a real thread", "time.sleep", "a real socket", "a subprocess"]
    time.sleep(0)  # Everything is back outside the simulation.
    socket.socket().close()


def test_a_killed_process_never_runs_again_and_its_files_are_closed(tmp_path: Path) -> None:
    def scenario() -> tuple[list[str], bool]:
        async def main(loop: SimLoop) -> tuple[list[str], bool]:
            node = SimProcess("node", loop)
            node.begin()
            ran: list[str] = []
            opened: list[int] = []

            async def work() -> None:
                opened.append(os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY))
                ran.append("before")
                await asyncio.sleep(1)
                ran.append("after")  # Never: the process dies first.

            node.spawn(work(), "work")
            node.call_later(2, ran.append, "timer")
            await asyncio.sleep(0.5)
            node.kill()
            await asyncio.sleep(5)
            try:
                os.fstat(opened[0])
            except OSError:
                return ran, True
            return ran, False

        return simulate(main)

    ran, closed = run_isolated(scenario)
    assert ran == ["before"]
    assert closed
