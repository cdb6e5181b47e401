"""The simulated network: in-memory TCP between simulated processes (bkaio.testing.sim)."""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import msgpack

from bkaio.ledger_client.tls_diagnosis import peer_speaks_tls
from bkaio.protocol import Flag, Op
from bkaio.testing.sim.guards import sealed
from bkaio.testing.sim.loop import SimLoop
from bkaio.testing.sim.network import FrameRule, NetworkModel, SimNetwork
from bkaio.testing.sim.process import SimProcess
from bkaio.testing.sim.runner import run_isolated

T = TypeVar("T")


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.events: list[str] = []
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool | None:
        self.events.append("eof")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc
        self.events.append("lost")

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")


class World:
    def __init__(self, loop: SimLoop, model: NetworkModel, seed: int) -> None:
        self.loop = loop
        self.network = SimNetwork(loop, random.Random(seed), model)
        loop.network = self.network
        self.server = SimProcess("server", loop)
        self.client = SimProcess("client", loop)
        self.server.begin()
        self.client.begin()
        self.accepted: list[Recorder] = []

        def accept() -> Recorder:
            recorder = Recorder()
            self.accepted.append(recorder)
            return recorder

        self.network.listen(self.server, "10.0.0.1", 3181, accept)

    async def connect(self) -> tuple[asyncio.Transport, Recorder]:
        async def as_client() -> tuple[asyncio.Transport, Recorder]:
            transport, protocol = await self.loop.create_connection(Recorder, "10.0.0.1", 3181)
            assert isinstance(protocol, Recorder)
            return transport, protocol

        return await self.client.spawn(as_client(), "connect")


def simulate(
    main: Callable[[World], Coroutine[Any, Any, T]],
    model: NetworkModel | None = None,
    seed: int = 7,
) -> T:
    loop = SimLoop(random.Random(seed))

    async def run() -> T:
        return await main(World(loop, model or NetworkModel(split=0.3), seed))

    try:
        with sealed():
            return loop.run_until_complete(run())
    finally:
        loop.close()


def test_bytes_arrive_late_and_in_order_within_a_connection() -> None:
    async def main(world: World) -> tuple[bytes, bytes, float]:
        transport, _ = await world.connect()
        sent = b"".join(f"<{i}>".encode() for i in range(300))
        started = world.loop.time()
        for i in range(300):
            transport.write(f"<{i}>".encode())
        await asyncio.sleep(1)
        server = world.accepted[0]
        return sent, bytes(server.data), started

    sent, received, _ = simulate(main)
    assert received == sent


def test_a_blocked_path_holds_bytes_until_it_heals() -> None:
    async def main(world: World) -> tuple[bytes, bytes]:
        transport, _ = await world.connect()
        world.network.block("client", "server")
        transport.write(b"held")
        await asyncio.sleep(5)
        during = bytes(world.accepted[0].data)
        world.network.heal()
        await asyncio.sleep(0.1)
        return during, bytes(world.accepted[0].data)

    assert simulate(main) == (b"", b"held")


def test_connecting_across_a_blocked_path_waits_and_nobody_listening_is_refused() -> None:
    async def main(world: World) -> tuple[bool, bool]:
        world.network.block("client", "server")
        attempt = world.loop.create_task(world.connect())
        await asyncio.sleep(3)
        waited = not attempt.done()
        world.network.heal()
        await attempt

        async def elsewhere() -> None:
            await world.loop.create_connection(Recorder, "10.0.0.9", 3181)

        try:
            await world.client.spawn(elsewhere(), "refused")
        except ConnectionRefusedError:
            return waited, True
        return waited, False

    assert simulate(main) == (True, True)


def test_a_dead_process_resets_its_peers_and_stops_listening() -> None:
    def scenario() -> tuple[str, bool]:
        async def main(world: World) -> tuple[str, bool]:
            _, client_side = await world.connect()
            incarnation = world.server.kill()
            assert incarnation is not None
            world.network.process_died(world.server, incarnation)
            await asyncio.sleep(0.5)
            try:
                await world.connect()
            except ConnectionRefusedError:
                refused = True
            else:
                refused = False
            return type(client_side.lost).__name__, refused

        return simulate(main)

    assert run_isolated(scenario) == ("ConnectionResetError", True)


def test_close_sends_eof_after_the_data_and_abort_a_reset() -> None:
    async def main(world: World) -> tuple[list[str], bytes, list[str], str]:
        transport, client_side = await world.connect()
        transport.write(b"last words")
        transport.close()
        await asyncio.sleep(0.5)
        closed = world.accepted[0]
        other, _ = await world.connect()
        other.abort()
        await asyncio.sleep(0.5)
        aborted = world.accepted[1]
        return closed.events, bytes(closed.data), client_side.events, type(aborted.lost).__name__

    server_events, data, client_events, reset = simulate(main)
    assert server_events == ["made", "eof", "lost"] and data == b"last words"
    assert client_events == ["made", "lost"]
    assert reset == "ConnectionResetError"


def test_paused_reading_holds_data_and_a_full_buffer_pauses_the_writer() -> None:
    async def main(world: World) -> tuple[bytes, bytes, list[str]]:
        transport, client_side = await world.connect()
        await asyncio.sleep(0.1)
        server = world.accepted[0]
        assert server.transport is not None
        server.transport.pause_reading()
        transport.set_write_buffer_limits(high=100, low=10)
        transport.write(b"x" * 500)
        await asyncio.sleep(1)
        held = bytes(server.data)
        server.transport.resume_reading()
        await asyncio.sleep(1)
        return held, bytes(server.data), client_side.events

    held, received, events = simulate(main)
    assert held == b"" and received == b"x" * 500
    assert events == ["made", "pause", "resume"]


def _frame(body: list[Any]) -> bytes:
    packed: bytes = msgpack.packb(body)
    return struct.pack(">I", len(packed)) + packed


def test_frame_rules_hold_drop_and_release_single_requests() -> None:
    add = _frame([int(Op.ADD_ENTRY), 1, 7, 0, 0, b"k", -1, 1, 0, b"p"])
    fencing = _frame([int(Op.READ_LAC), 2, 7, int(Flag.FENCE), b"k"])
    plain = _frame([int(Op.READ_LAC), 3, 7, 0, b""])

    async def main(world: World) -> tuple[bytes, bytes]:
        transport, _ = await world.connect()
        world.network.rules += [
            FrameRule("client", "server", Op.ADD_ENTRY),
            FrameRule("client", "server", Op.READ_LAC, action="drop", flag=Flag.FENCE),
        ]
        transport.write(add + fencing + plain)
        await asyncio.sleep(1)
        before = bytes(world.accepted[0].data)
        world.network.release("client", "server")
        await asyncio.sleep(1)
        return before, bytes(world.accepted[0].data)

    before, after = simulate(main)
    assert before == plain
    assert after == plain + add


def test_the_order_across_connections_is_the_seeds() -> None:
    async def main(world: World) -> list[int]:
        first, _ = await world.connect()
        second, _ = await world.connect()
        order: list[int] = []
        world.accepted[0].data_received = lambda data: order.extend([1] * len(data))  # type: ignore[method-assign]
        world.accepted[1].data_received = lambda data: order.extend([2] * len(data))  # type: ignore[method-assign]
        for _ in range(10):
            first.write(b"a")
            second.write(b"b")
            await asyncio.sleep(0.001)
        await asyncio.sleep(1)
        return order

    model = NetworkModel(latency=(0.0001, 0.01), split=0.0)
    orders = [simulate(main, model, seed) for seed in range(5)]
    assert all(sorted(order) == [1] * 10 + [2] * 10 for order in orders)
    assert len({tuple(order) for order in orders}) > 1
    assert orders[3] == simulate(main, model, 3)


def test_a_tls_handshake_meets_a_plain_server() -> None:
    """The client asks whether a bookie that hung up speaks TLS: no simulated one does."""

    async def main(world: World) -> tuple[bool, bool]:
        async def probe(port: int) -> bool:
            return await peer_speaks_tls("10.0.0.1", port, timeout_seconds=1.0)

        listening = await world.client.spawn(probe(3181), "probe")
        nobody = await world.client.spawn(probe(3999), "probe")
        return listening, nobody

    assert simulate(main) == (False, False)
