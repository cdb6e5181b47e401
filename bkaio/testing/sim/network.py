"""The simulated network: in-memory TCP connections between simulated processes.

`SimNetwork.connect` (what `SimLoop.create_connection` calls) pairs two `SimTransport`s, one
per end, each an `asyncio.Transport` for the real protocol objects on it (the client's
`BookieConnection`, the bookie's `BookieServerProtocol`). Bytes written at one end reach the
peer protocol's `data_received` after a delay drawn from `NetworkModel`, as loop callbacks in
the receiving process's context:

- order is kept within a connection (it is TCP), never across connections;
- a delivery may be split (TCP segments), and writes that became due together are merged;
- a blocked path (`block`, `isolate`) holds bytes and connection attempts until it heals
  (TCP retransmits); `cut` resets the connections between two processes at once;
- a process that dies takes its connections down: its peers get a reset after a delay, through
  the same path (a blocked path holds the reset too); its listeners refuse new connections;
- `pause_reading` holds deliveries, the write buffer (bytes not delivered yet) drives
  `pause_writing` / `resume_writing`, `close` delivers an EOF after the data, `abort` a reset;
- `FrameRule`s (client to bookie only, frames parsed only while one is set) hold, drop or
  delay single requests, as the real-process harness's proxy does for the scripted schedules.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from bkaio.protocol import Flag, FrameDecoder, Op, encode_frame
from bkaio.testing.sim.process import Incarnation, SimProcess, owner_of

_EOF = b"<eof>"  # Markers in a pipe (compared by identity).
_RESET = b"<reset>"
MAX_FRAME_BYTES = 16 * 1024 * 1024  # Rules parse what clients send (8 MiB frames at most).
# Wire layout (docs/protocol.md): the flags' index by op, and ADD_ENTRIES' shape.
_FLAGS_INDEX = {int(Op.ADD_ENTRY): 4, int(Op.READ_ENTRY): 4, int(Op.READ_RANGE): 6,
                int(Op.READ_LAC): 3}  # fmt: skip
_ADD_ENTRIES_HEAD, _ADD_ENTRIES_EACH = 5, 5


@dataclass
class NetworkModel:
    """Delays of one seed's network (seconds)."""

    latency: tuple[float, float] = (0.0002, 0.002)
    slow: float = 0.0  # Chance that a write is slow ...
    slow_latency: tuple[float, float] = (0.02, 0.4)  # ... and how slow.
    split: float = 0.05  # Chance that a delivery is cut in two (TCP segments).

    def delay(self, rng: random.Random) -> float:
        if self.slow and rng.random() < self.slow:
            return rng.uniform(*self.slow_latency)
        return rng.uniform(*self.latency)


Action = Literal["hold", "drop", "delay"]


@dataclass
class FrameRule:
    """Acts on requests `op` (with `flag` set, if given) from process `src` to `dst`."""

    src: str
    dst: str
    op: Op
    action: Action = "hold"
    flag: Flag | None = None
    delay: float = 0.0
    count: int | None = None  # Only this many frames, then it stops matching.
    matched: int = 0

    def matches(self, src: str, dst: str, body: list[Any]) -> bool:
        if (src, dst) != (self.src, self.dst) or body[0] != int(self.op):
            return False
        if self.count is not None and self.matched >= self.count:
            return False
        if self.flag is not None:
            index = _FLAGS_INDEX.get(body[0])
            if index is None or len(body) <= index or not int(body[index]) & int(self.flag):
                return False
        return True


@dataclass
class _Listener:
    process: SimProcess
    incarnation: Incarnation
    factory: Callable[[], asyncio.Protocol]


class _Pipe:
    """One direction of a connection: what `src` wrote that `dst` has not received yet."""

    def __init__(self, network: SimNetwork, src: SimTransport, rng: random.Random) -> None:
        self.network = network
        self.src = src
        self.dst: SimTransport | None = None  # Set once both ends exist.
        self.rng = rng
        self.chunks: deque[tuple[float, bytes]] = deque()
        self.last_at = 0.0
        self.buffered = 0
        self.timer: asyncio.TimerHandle | None = None
        self.frames: FrameDecoder | None = None  # The sender's frames, while rules apply.

    def send(self, data: bytes, *, marker: bool = False) -> None:
        loop = self.network.loop
        at = max(self.last_at, loop.time() + self.network.model.delay(self.rng))
        if not marker:
            self.buffered += len(data)
        self.last_at = at
        self.chunks.append((at, data))
        self.schedule()

    def schedule(self) -> None:
        dst = self.dst
        if self.timer is not None or not self.chunks or dst is None:
            return
        self.timer = self.network.loop.call_at(self.chunks[0][0], self.deliver, context=dst.context)

    def deliver(self) -> None:
        self.timer = None
        dst = self.dst
        assert dst is not None
        if dst.lost or self.network.blocked(self.src.process_name, dst.process_name):
            return  # Held: `SimNetwork.heal` or the end's resume schedules it again.
        now = self.network.loop.time()
        parts: list[bytes] = []
        marker: bytes | None = None
        while self.chunks and self.chunks[0][0] <= now:
            _at, data = self.chunks[0]
            if data is _EOF or data is _RESET:
                if parts or (data is _EOF and dst.reading_paused):
                    break  # The data first, the marker in the next delivery.
                self.chunks.popleft()
                marker = data
                break
            if dst.reading_paused:
                break
            self.chunks.popleft()
            parts.append(data)
        if marker is _RESET:
            self.chunks.clear()
            dst.connection_lost_now(ConnectionResetError("connection reset by peer (simulated)"))
            return
        if marker is _EOF:
            dst.eof_now()
            self.schedule()
            return
        if parts:
            data = b"".join(parts)
            if len(data) > 1 and self.rng.random() < self.network.model.split:
                cut = self.rng.randrange(1, len(data))
                data, rest = data[:cut], data[cut:]
                self.chunks.appendleft((now, rest))
            self.buffered -= len(data)
            self.src.written(self.buffered)
            dst.protocol.data_received(data)  # type: ignore[attr-defined]
        if not dst.reading_paused:
            self.schedule()


class SimTransport(asyncio.Transport):
    """One end of a simulated TCP connection."""

    def __init__(
        self,
        network: SimNetwork,
        process_name: str,
        context: contextvars.Context,
        local: tuple[str, int],
        peer: tuple[str, int],
        rng: random.Random,
    ) -> None:
        super().__init__()
        self.network = network
        self.process_name = process_name
        self._context = context
        self.owner = owner_of(context)
        self.local, self.peer_address = local, peer
        self.protocol: asyncio.BaseProtocol = asyncio.Protocol()
        self.out = _Pipe(network, self, rng)
        self.inbound: _Pipe | None = None  # The peer's `out`.
        self.peer: SimTransport | None = None
        self.reading_paused = False
        self.closing = False
        self.lost = False
        self._high, self._low = 64 * 1024, 16 * 1024
        self._writing_paused = False

    @property
    def context(self) -> contextvars.Context:
        return self._context.copy()

    # ----------------------------------------------------------------- asyncio.Transport

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer_address, "sockname": self.local}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing or self.lost

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol

    def is_reading(self) -> bool:
        return not self.reading_paused and not self.is_closing()

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        if self.reading_paused:
            self.reading_paused = False
            if self.inbound is not None:
                self.inbound.schedule()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        self._high, self._low = high, (high // 4 if low is None else low)

    def get_write_buffer_size(self) -> int:
        return self.out.buffered

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.is_closing() or not data:
            return
        payload = bytes(data)
        if self.network.rules and self.peer is not None:
            self.network.apply_rules(self, payload)
        else:
            self.out.send(payload)
        if not self._writing_paused and self.out.buffered > self._high:
            self._writing_paused = True
            self.protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(bytes(part) for part in list_of_data))

    def write_eof(self) -> None:
        self.out.send(_EOF, marker=True)

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        if self.is_closing():
            return
        self.closing = True
        self.out.send(_EOF, marker=True)
        self.network.loop.call_soon(self._lost, None, context=self.context)

    def abort(self) -> None:
        if self.lost:
            return
        self.closing = True
        self.out.chunks.clear()
        self.out.buffered = 0
        self.out.send(_RESET, marker=True)
        self.network.loop.call_soon(self._lost, None, context=self.context)

    # ----------------------------------------------------------------- the network's side

    def written(self, buffered: int) -> None:
        """Bytes of ours were delivered; `buffered` are still on the way."""
        if self._writing_paused and buffered <= self._low:
            self._writing_paused = False
            self.network.loop.call_soon(self._resume_writing, context=self.context)

    def _resume_writing(self) -> None:
        if not self.lost:
            self.protocol.resume_writing()

    def eof_now(self) -> None:
        if self.lost:
            return
        keep_open = self.protocol.eof_received()  # type: ignore[attr-defined]
        if not keep_open:
            self.close()

    def connection_lost_now(self, error: Exception | None) -> None:
        self._lost(error)

    def _lost(self, error: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        self.closing = True
        self.network.forget(self)
        self.protocol.connection_lost(error)

    def died(self) -> None:
        """Our process is gone: the peer is reset; nothing reaches our protocol again."""
        if self.lost:
            return
        self.lost = True
        self.out.chunks.clear()
        self.out.buffered = 0
        self.out.send(_RESET, marker=True)
        self.network.forget(self)


class SimNetwork:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, rng: random.Random, model: NetworkModel
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.model = model
        self._listeners: dict[tuple[str, int], _Listener] = {}
        self._transports: list[SimTransport] = []
        self._blocked: set[tuple[str, str]] = set()
        self._healed: asyncio.Future[None] | None = None
        self.rules: list[FrameRule] = []
        self._held: dict[tuple[str, str], list[bytes]] = {}
        self._ports = 40000
        self.connections = 0

    # ----------------------------------------------------------------- listening, connecting

    def listen(
        self, process: SimProcess, host: str, port: int, factory: Callable[[], asyncio.Protocol]
    ) -> None:
        assert process.incarnation is not None
        self._listeners[(host, port)] = _Listener(process, process.incarnation, factory)

    async def connect(
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        client_context = contextvars.copy_context()
        client_name, rng, listener = await self._reach(host, port)
        self._ports += 1
        self.connections += 1
        local = (client_name, self._ports)
        client_end = SimTransport(self, client_name, client_context, local, (host, port), rng)
        server_end = SimTransport(
            self,
            listener.process.name,
            listener.process.context(),
            (host, port),
            local,
            random.Random(self.rng.random()),
        )
        client_end.peer, server_end.peer = server_end, client_end
        client_end.inbound, server_end.inbound = server_end.out, client_end.out
        client_end.out.dst, server_end.out.dst = server_end, client_end
        self._transports += [client_end, server_end]
        server_protocol = server_end.context.run(listener.factory)
        server_end.protocol = server_protocol
        self.loop.call_soon(server_protocol.connection_made, server_end, context=server_end.context)
        protocol = protocol_factory()
        client_end.protocol = protocol
        protocol.connection_made(client_end)
        return client_end, protocol

    async def _reach(self, host: str, port: int) -> tuple[str, random.Random, _Listener]:
        """TCP's handshake from the running process to `host:port`: its name, the new
        connection's generator and the listener; ConnectionRefusedError when none listens."""
        client = owner_of(None)
        client_name = client.name if client is not None else "world"
        rng = random.Random(self.rng.random())
        await asyncio.sleep(self.model.delay(rng))  # The SYN.
        listener = self._listeners.get((host, port))
        while listener is not None and (
            self.blocked(client_name, listener.process.name)
            or self.blocked(listener.process.name, client_name)
        ):
            await self._until_healed()  # SYNs are lost until the path heals (or a timeout).
            listener = self._listeners.get((host, port))
        if listener is None or listener.incarnation.dead:
            await asyncio.sleep(self.model.delay(rng))
            raise ConnectionRefusedError(f"{host}:{port}: connection refused (simulated)")
        return client_name, rng, listener

    async def handshake_with_plain_server(self, host: str, port: int) -> NoReturn:
        """A TLS client's connection (the client probes whether a bookie speaks TLS): TCP
        as `connect`, then the plain server's answer to the ClientHello ends the handshake,
        as OpenSSL reports it. No simulated server speaks TLS."""
        _client, rng, _listener = await self._reach(host, port)
        await asyncio.sleep(2 * self.model.delay(rng))  # ClientHello there, an answer back.
        error = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number (simulated)")
        error.reason, error.library = "WRONG_VERSION_NUMBER", "SSL"
        raise error

    def forget(self, transport: SimTransport) -> None:
        """Drop connections whose two ends are gone and whose pipes are empty."""
        del transport
        self._transports = [
            t
            for t in self._transports
            if not (t.lost and (t.peer is None or t.peer.lost) and not t.out.chunks)
        ]

    # ----------------------------------------------------------------- faults

    def blocked(self, src: str, dst: str) -> bool:
        return (src, dst) in self._blocked

    def block(self, src: str, dst: str, *, both_ways: bool = True) -> None:
        self._blocked.add((src, dst))
        if both_ways:
            self._blocked.add((dst, src))

    def isolate(self, name: str, others: list[str]) -> None:
        for other in others:
            if other != name:
                self.block(name, other)

    def unblock(self, src: str, dst: str, *, both_ways: bool = True) -> None:
        self._blocked.discard((src, dst))
        if both_ways:
            self._blocked.discard((dst, src))
        self._kick()

    def heal(self) -> None:
        """Every path open again, every frame rule gone and every held frame sent."""
        self._blocked.clear()
        self.rules.clear()
        for key in list(self._held):
            self.release(*key)
        self._kick()

    def _kick(self) -> None:
        for transport in list(self._transports):
            transport.out.schedule()
        healed, self._healed = self._healed, None
        if healed is not None and not healed.done():
            healed.set_result(None)

    async def _until_healed(self) -> None:
        if self._healed is None or self._healed.done():
            self._healed = self.loop.create_future()
        await asyncio.shield(self._healed)

    def cut(self, a: str, b: str) -> None:
        """Reset every connection between `a` and `b` now (both ends see the reset)."""
        for transport in list(self._transports):
            peer = transport.peer
            if (
                peer is not None
                and not transport.lost
                and {transport.process_name, peer.process_name} == {a, b}
            ):
                self.loop.call_soon(
                    transport.connection_lost_now,
                    ConnectionResetError("connection cut (simulated)"),
                    context=transport.context,
                )

    def process_died(self, process: SimProcess, incarnation: Incarnation) -> None:
        for key, listener in list(self._listeners.items()):
            if listener.incarnation is incarnation:
                del self._listeners[key]
        for transport in list(self._transports):
            if transport.owner is incarnation:
                transport.died()
        del process

    # ----------------------------------------------------------------- frame rules

    def release(self, src: str, dst: str) -> None:
        """Send the frames held on the path `src` -> `dst`, in order."""
        for frame in self._held.pop((src, dst), []):
            self._send_to(src, dst, frame)

    def _send_to(self, src: str, dst: str, frame: bytes) -> None:
        for transport in self._transports:
            peer = transport.peer
            if (
                transport.process_name == src
                and peer is not None
                and peer.process_name == dst
                and not transport.is_closing()
            ):
                transport.out.send(frame)
                return  # The first open connection on that path carries it.

    def apply_rules(self, transport: SimTransport, data: bytes) -> None:
        """Send `data` (whole frames: the client writes nothing else) through the rules of
        its path, frame by frame; a batch of adds as the single adds it stands for."""
        peer = transport.peer
        assert peer is not None
        src, dst = transport.process_name, peer.process_name
        if not any((rule.src, rule.dst) == (src, dst) for rule in self.rules):
            transport.out.send(data)
            return
        decoder = transport.out.frames
        if decoder is None:
            decoder = transport.out.frames = FrameDecoder(MAX_FRAME_BYTES)
        for body in decoder.feed(data):
            for one in _split_adds(body):
                self._frame(transport, src, dst, one)

    def _frame(self, transport: SimTransport, src: str, dst: str, body: list[Any]) -> None:
        frame = encode_frame(body)
        for rule in self.rules:
            if rule.matches(src, dst, body):
                rule.matched += 1
                if rule.action == "drop":
                    return
                if rule.action == "hold":
                    self._held.setdefault((src, dst), []).append(frame)
                    return
                self.loop.call_later(rule.delay, self._late, transport, frame)
                return
        transport.out.send(frame)

    @staticmethod
    def _late(transport: SimTransport, frame: bytes) -> None:
        if not transport.is_closing():
            transport.out.send(frame)


def _split_adds(body: list[Any]) -> list[list[Any]]:
    """An ADD_ENTRIES body as the ADD_ENTRY bodies it stands for (docs/protocol.md, "Batched
    adds"), so that rules act on adds one by one; any other body as it is."""
    if not body or body[0] != int(Op.ADD_ENTRIES):
        return [body]
    count, extra = divmod(len(body) - _ADD_ENTRIES_HEAD, _ADD_ENTRIES_EACH)
    if count < 1 or extra:
        return [body]
    _, request_id, ledger_id, flags, master_key = body[:_ADD_ENTRIES_HEAD]
    adds = []
    for index in range(count):
        start = _ADD_ENTRIES_HEAD + index * _ADD_ENTRIES_EACH
        entry_id, lac, length, digest, payload = body[start : start + _ADD_ENTRIES_EACH]
        adds.append(
            [int(Op.ADD_ENTRY), request_id + index, ledger_id, entry_id, flags, master_key, lac,
             length, digest, payload]
        )  # fmt: skip
    return adds
