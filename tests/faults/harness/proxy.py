"""An asyncio TCP proxy per link: delay/jitter, bandwidth, blackhole, cut, and per-frame rules.

    proxy = await LinkProxy.start("127.0.0.1", bookie_port, rng=random.Random(seed))
    proxy.port                       # connect here instead of the bookie
    proxy.delay = (0.0, 0.3)         # seconds of random delay per chunk (order kept per direction)
    proxy.bandwidth = 64 * 1024      # bytes per second, per direction
    proxy.blackhole(Direction.UP)    # requests vanish; the sockets stay open
    proxy.cut()                      # RST every connection and refuse new ones; heal() undoes
    proxy.rules.append(FrameRule(Direction.UP, op=Op.ADD_ENTRY, action="hold"))
    proxy.release()                  # deliver held frames, in order

Frames (u32 length + msgpack array, docs/protocol.md) are parsed only when a rule is set, so a
rule can hold, drop or delay one operation (the scripted schedules of F8). UP is client ->
server, DOWN is server -> client. netem is not available here (reference/faults.md B0).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack

_HEADER = struct.Struct(">I")


class Direction(enum.Enum):
    UP = "up"  # client -> server
    DOWN = "down"  # server -> client


Action = Literal["pass", "drop", "hold", "delay"]


@dataclass
class FrameRule:
    """Applies to frames of `op` in `direction` whose flags contain `flags` (request flags sit
    at a known array index: ADD_ENTRY and READ_ENTRY 4, READ_RANGE 6, READ_LAC 3)."""

    direction: Direction
    op: int | None = None
    flags: int = 0
    action: Action = "hold"
    delay: float = 0.0
    count: int | None = None  # Apply to this many frames, then stop matching.
    matched: int = 0
    predicate: Callable[[list[Any]], bool] | None = None

    def matches(self, direction: Direction, body: list[Any]) -> bool:
        if direction is not self.direction:
            return False
        if self.count is not None and self.matched >= self.count:
            return False
        if self.op is not None and (not body or body[0] != self.op):
            return False
        if self.flags:
            flags = _request_flags(body)
            if flags is None or flags & self.flags != self.flags:
                return False
        return self.predicate is None or self.predicate(body)


def _request_flags(body: list[Any]) -> int | None:
    position = {2: 4, 3: 4, 4: 6, 5: 3, 11: 3}.get(body[0] if body else -1)  # index in the array
    if position is None or len(body) <= position or not isinstance(body[position], int):
        return None
    return int(body[position])


_ADD_ENTRY = 2
_ADD_ENTRIES = 11


def _split_add_entries(body: list[Any]) -> list[list[Any]] | None:
    """The ADD_ENTRY bodies an ADD_ENTRIES body stands for (docs/protocol.md, "Batched adds"),
    or None for a body of another shape: the proxy leaves those alone."""
    count, extra = divmod(len(body) - 5, 5)
    if body[0] != _ADD_ENTRIES or count < 1 or extra or not isinstance(body[1], int):
        return None
    _, request_id, ledger_id, flags, master_key = body[:5]
    adds = []
    for index in range(count):
        entry_id, lac, length, digest, payload = body[5 + 5 * index : 10 + 5 * index]
        adds.append(
            [_ADD_ENTRY, request_id + index, ledger_id, entry_id, flags, master_key, lac,
             length, digest, payload]
        )  # fmt: skip
    return adds


@dataclass
class _Pipe:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    direction: Direction
    held: list[bytes] = field(default_factory=list)


class LinkProxy:
    def __init__(self, target_host: str, target_port: int, rng: random.Random) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.rng = rng
        self.delay: tuple[float, float] = (0.0, 0.0)
        self.bandwidth: float | None = None
        self.rules: list[FrameRule] = []
        self._blackholed: set[Direction] = set()
        self._cut = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        # The connection handlers running (one per accepted connection): `close` cancels them,
        # since the server's close does not, and one still connecting upstream would otherwise
        # open its connection after the close and leave it to be finalised, unclosed, in a
        # later test (an unraisable ResourceWarning there).
        self._handlers: set[asyncio.Task[Any]] = set()
        self._held: list[tuple[asyncio.StreamWriter, bytes]] = []
        self.port = 0
        self.frames = 0

    @classmethod
    async def start(
        cls, target_host: str, target_port: int, *, rng: random.Random | None = None
    ) -> LinkProxy:
        proxy = cls(target_host, target_port, rng or random.Random(0))
        proxy._server = await asyncio.start_server(proxy._accept, "127.0.0.1", 0)
        proxy.port = int(proxy._server.sockets[0].getsockname()[1])
        return proxy

    # ----------------------------------------------------------------- faults

    def blackhole(self, *directions: Direction) -> None:
        self._blackholed.update(directions or (Direction.UP, Direction.DOWN))

    def cut(self) -> None:
        """Reset every connection now and refuse new ones until `heal`."""
        self._cut = True
        for writer in list(self._writers):
            transport = writer.transport
            with contextlib.suppress(Exception):
                transport.abort()

    def heal(self) -> None:
        self._cut = False
        self._blackholed.clear()
        self.delay = (0.0, 0.0)
        self.bandwidth = None
        self.rules.clear()
        self.release()

    def release(self) -> None:
        """Deliver every held frame now, in the order it arrived."""
        held, self._held = self._held, []
        for writer, frame in held:
            if not writer.is_closing():
                writer.write(frame)

    @property
    def held_count(self) -> int:
        return len(self._held)

    # ----------------------------------------------------------------- plumbing

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        up_writer: asyncio.StreamWriter | None = None
        pumps: list[asyncio.Task[None]] = []
        reset = True  # Refused (cut, or the target refuses): the client sees a reset.
        try:
            if self._cut:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                return
            reset = False
            if self._cut:  # Cut (or closed) while connecting upstream: cut() did not see it.
                return
            self._writers.update((writer, up_writer))
            pumps = [
                asyncio.ensure_future(self._pump(reader, up_writer, Direction.UP)),
                asyncio.ensure_future(self._pump(up_reader, writer, Direction.DOWN)),
            ]
            for task in pumps:
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # By close: the handler ends as a plain return, since the streams server's done
            # callback asks a handler task for its exception, which raises on a cancelled one.
            return
        finally:
            # Also when cancelled (by close): both sockets end here, whatever stopped the pumps.
            self._handlers.discard(handler)
            for task in pumps:
                task.cancel()
            for w in (writer, up_writer):
                if w is None:
                    continue
                self._writers.discard(w)
                with contextlib.suppress(Exception):
                    if reset or self._cut:
                        w.transport.abort()
                    else:
                        w.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: Direction
    ) -> None:
        buffer = bytearray()
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                if self._cut:
                    return
                if not self.rules:
                    await self._forward(writer, direction, bytes(chunk))
                    continue
                buffer += chunk
                while len(buffer) >= 4:
                    (length,) = _HEADER.unpack_from(buffer)
                    if len(buffer) < 4 + length:
                        break
                    frame = bytes(buffer[: 4 + length])
                    del buffer[: 4 + length]
                    await self._frame(writer, direction, frame)
        except (ConnectionError, OSError):
            return

    async def _frame(
        self, writer: asyncio.StreamWriter, direction: Direction, frame: bytes
    ) -> None:
        self.frames += 1
        try:
            body = msgpack.unpackb(frame[4:], raw=False)
        except Exception:  # Not ours to judge: pass it on.
            body = None
        if isinstance(body, list) and body and direction is Direction.UP:
            # Rules act on adds one by one: a batch of adds goes on as the ADD_ENTRY frames it
            # stands for, which the bookie handles the same way.
            adds = _split_add_entries(body)
            if adds is not None:
                for add in adds:
                    packed = msgpack.packb(add)
                    await self._frame(writer, direction, _HEADER.pack(len(packed)) + packed)
                return
        if isinstance(body, list):
            for rule in self.rules:
                if rule.matches(direction, body):
                    rule.matched += 1
                    if rule.action == "drop":
                        return
                    if rule.action == "hold":
                        self._held.append((writer, frame))
                        return
                    if rule.action == "delay":
                        loop = asyncio.get_running_loop()
                        loop.call_later(rule.delay, self._late_write, writer, frame)
                        return
                    break
        await self._forward(writer, direction, frame)

    @staticmethod
    def _late_write(writer: asyncio.StreamWriter, frame: bytes) -> None:
        if not writer.is_closing():
            writer.write(frame)

    async def _forward(
        self, writer: asyncio.StreamWriter, direction: Direction, data: bytes
    ) -> None:
        if direction in self._blackholed:
            return
        low, high = self.delay
        if high > 0:
            await asyncio.sleep(self.rng.uniform(low, high))
        if self.bandwidth:
            await asyncio.sleep(len(data) / self.bandwidth)
        if self._cut or writer.is_closing():
            return
        writer.write(data)
        await writer.drain()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        running = [*self._tasks, *self._handlers]
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
