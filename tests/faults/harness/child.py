"""Drive `writer_child` from a test: its lines become history ops, in arrival order."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

from bkaio.errors import BKError, LedgerClosedError, LedgerFencedError, UnauthorizedError
from bkaio.testing.history import History, Invocation

REPO = Path(__file__).resolve().parents[3]
_FAILS = {e.__name__ for e in (LedgerFencedError, LedgerClosedError, UnauthorizedError)}


class WriterChild:
    def __init__(self, history: History, process: asyncio.subprocess.Process) -> None:
        self.history = history
        self.process = process
        self.ledger_id = -1
        self.acked = 0
        self._open: dict[int, Invocation] = {}
        self._ledger_known = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(
        cls,
        history: History,
        uri: str,
        e: int,
        qw: int,
        qa: int,
        seed: int,
        *,
        prefix: tuple[str, ...] = (),
    ) -> WriterChild:
        """`prefix`: a command to run the child under (e.g. unshare --time ...)."""
        process = await asyncio.create_subprocess_exec(
            *prefix,
            sys.executable,
            "-m",
            "tests.faults.harness.writer_child",
            uri,
            str(e),
            str(qw),
            str(qa),
            str(seed),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        child = cls(history, process)
        await asyncio.wait_for(child._ledger_known.wait(), 60)
        return child

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while True:
            line = await self.process.stdout.readline()
            if not line:
                return
            self.handle(line.decode())

    def handle(self, line: str) -> None:
        words = line.split()
        if len(words) < 2:
            return
        if words[0] == "LEDGER":
            self.ledger_id = int(words[1])
            self._ledger_known.set()
        elif words[0] == "INVOKE":
            self._open[int(words[1])] = self.history.invoke(
                "writer", "add", self.ledger_id, value=words[2]
            )
        elif words[0] == "OK":
            inv = self._open.pop(int(words[1]), None)
            if inv is not None:
                self.acked += 1
                self.history.ok(inv, entry=int(words[2]))
        elif words[0] == "FAIL":
            inv = self._open.pop(int(words[1]), None)
            if inv is not None:
                name = words[2] if len(words) > 2 else "unknown"
                if name in _FAILS:
                    self.history.fail(inv, name)
                else:
                    self.history.info(inv, name)

    async def wait_acked(self, count: int, seconds: float = 60.0) -> None:
        async with asyncio.timeout(seconds):
            while self.acked < count:
                if self.process.returncode is not None:
                    raise BKError(f"writer child exited with {self.process.returncode}")
                await asyncio.sleep(0.02)

    async def quiesce(self) -> None:
        """Read every line already in the pipe (call while the child is stopped or dead)."""
        assert self.process.stdout is not None
        while True:
            before = len(self.history)
            await asyncio.sleep(0.3)
            if len(self.history) == before:
                return

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    async def kill(self) -> None:
        self.signal(signal.SIGKILL)
        await self.process.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._reader, 10)
        for inv in list(self._open.values()):
            self.history.info(inv, "writer_killed")
        self._open.clear()
