"""What `bkaio bench` measures: a system under test is a cluster the harness starts and stops.

    System            start() / stop(); server_pids(); open_appender(workload) -> Appender
    Appender          send(payload) -> awaitable ack; close()
    ChildProcess      one server process started by the harness, its log in a file

The harness is the client process; servers are separate processes on loopback. Implementations:
`bkaio.bench.bkaio_system.BkaioSystem` and `bkaio.bench.nats_system.NatsSystem`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

from bkaio.bench.spec import Workload
from bkaio.errors import BKError

STOP_TIMEOUT_SECONDS = 8.0  # A benchmark cluster holds nothing worth a longer drain.

log = structlog.get_logger(__name__)


class BenchSetupError(BKError):
    """A cluster under test could not be started or prepared."""


class Appender(Protocol):
    """One writer of one system for one run (a bkaio ledger, a NATS stream)."""

    send: Callable[[bytes], Awaitable[Any]]

    async def close(self) -> None: ...


class System(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def server_pids(self) -> dict[str, int]:
        """Server name -> root pid; a server's CPU is that of its whole process tree."""
        ...

    async def open_appender(self, workload: Workload) -> Appender: ...

    def describe(self) -> dict[str, Any]: ...


class ChildProcess:
    """A server process in its own session (signals reach its workers), output to `log_path`."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        assert self.process is None, f"{self.name} already started"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} not started"
        return self.process.pid

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise BenchSetupError(
                f"{self.name} exited with {self.process.returncode}: {self.log_tail()} "
                f"(log: {self.log_path})"
            )

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])[-600:]

    async def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after `STOP_TIMEOUT_SECONDS`; always reaped.

        The SIGKILL also runs when the wait is cancelled (Ctrl-C, SIGTERM to the harness): a
        benchmark never leaves servers behind.
        """
        process = self.process
        if process is None:
            return
        try:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(process.wait, STOP_TIMEOUT_SECONDS)
                if process.poll() is None:
                    log.warning("bench_server_kill", server=self.name, log=str(self.log_path))
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # The leader or any worker left behind.
            process.wait()  # Immediate after SIGKILL to the group.
            self.process = None


async def stop_all(children: list[ChildProcess]) -> None:
    """Stop every child at once (each has its own grace period)."""
    results = await asyncio.gather(*(child.stop() for child in children), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    *,
    what: str,
    timeout_seconds: float,
    alive: Callable[[], None] = lambda: None,
    interval_seconds: float = 0.05,
) -> None:
    """Poll `check` until it is true; `alive` raises when a process we wait for has died."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        alive()
        if await check():
            return
        if time.monotonic() > deadline:
            raise BenchSetupError(f"{what} not ready after {timeout_seconds} s")
        await asyncio.sleep(interval_seconds)


async def port_open(host: str, port: int) -> bool:
    try:
        _reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
