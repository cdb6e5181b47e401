"""`WorkerHandle`: the bookie parent's end of one shard worker process and its control channel.

The parent (parent.py) starts one worker process per shard (parent_workers.py) and keeps a
handle on each. `read_events` reads what the worker writes on its stdout (JSON lines, control.py):
`ready` / `failed` at start, `read_only` when a shard's mode changes, `fatal` when one of its
tasks failed for good, and the replies to `call`s. `call` sends a request on the worker's stdin
and waits for its reply at most `CONTROL_REPLY_TIMEOUT_SECONDS` (or `reply_seconds`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from bkaio.errors import BKError

from .control import decode_message, encode_message

log = structlog.get_logger(__name__)

CONTROL_REPLY_TIMEOUT_SECONDS = 5.0


class WorkerHandle:
    """The parent's view of one shard worker process and its control channel."""

    def __init__(self, shard_index: int, process: asyncio.subprocess.Process) -> None:
        self.shard_index = shard_index
        self.process = process
        self.ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.read_only = False
        self.stopping = False
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self.on_read_only: Any = None
        self.on_fatal: Any = None  # Called with (task, error) when the worker reports one.
        self.reader: asyncio.Task[None] | None = None  # `read_events`, under the supervisor.

    async def read_events(self) -> None:
        """Until the worker's control channel closes (run as a supervised task)."""
        stdout = self.process.stdout
        assert stdout is not None
        while True:
            line = await stdout.readline()
            if not line:
                break
            try:
                message = decode_message(line)
            except BKError as error:
                log.warning("worker_control_garbage", shard=self.shard_index, error=str(error))
                continue
            self._on_message(message)
        if not self.ready.done():
            self.ready.set_exception(
                BKError(f"shard {self.shard_index} worker exited before it was ready")
            )
        for waiter in self._replies.values():
            if not waiter.done():
                waiter.set_exception(BKError(f"shard {self.shard_index} worker is gone"))

    def _on_message(self, message: dict[str, Any]) -> None:
        event = message.get("event")
        if "reply" in message:
            waiter = self._replies.pop(int(message["reply"]), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(message.get("result") or {})
        elif event == "ready":
            self.read_only = bool(message.get("read_only"))
            if not self.ready.done():
                self.ready.set_result(message)
        elif event == "failed":
            if not self.ready.done():
                self.ready.set_exception(
                    BKError(f"shard {self.shard_index}: {message.get('error', 'failed')}")
                )
        elif event == "read_only":
            self.read_only = bool(message.get("read_only"))
            if self.on_read_only is not None:
                self.on_read_only()
        elif event == "fatal" and self.on_fatal is not None:
            self.on_fatal(str(message.get("task", "?")), str(message.get("error", "")))

    def send(self, message: dict[str, Any]) -> None:
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.write(encode_message(message))

    async def call(
        self, method: str, *, reply_seconds: float = CONTROL_REPLY_TIMEOUT_SECONDS, **fields: Any
    ) -> dict[str, Any]:
        self._next_id += 1
        request_id = self._next_id
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[request_id] = waiter
        try:
            self.send({"id": request_id, "method": method, **fields})
            async with asyncio.timeout(reply_seconds):
                return await waiter
        finally:
            self._replies.pop(request_id, None)
