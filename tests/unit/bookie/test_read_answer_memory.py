"""The memory a shard spends on read answers is bounded whatever its clients do.

One shard served in process on a real socket (bkaio/bookie/read_memory.py). Clients send HELLO,
then pipeline range reads (and a few single-entry reads) of a ledger of 4 KB entries, and do
not read their sockets: each connection's unsent answers stay within its write buffer's
high-water mark plus one answer's bound, and the answers being prepared within three quarters
of the shard's memory bound, while the other reads wait holding nothing. Then the clients read
everything and every answer is complete and right. A lost connection's waiting reads give back
everything."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from bkaio.bookie.connection import BookieServerProtocol
from bkaio.bookie.read_memory import answer_bound
from bkaio.bookie.server import ShardServer
from bkaio.entrylog.types import StoredEntry
from bkaio.protocol import (
    PROTOCOL_VERSION,
    Flag,
    HelloRequest,
    ReadEntriesRequest,
    ReadEntriesResponse,
    ReadEntryRequest,
    ReadEntryResponse,
    Request,
    Response,
    Status,
)
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.frames import FrameDecoder, encode_frame
from bkaio.protocol.messages import decode_response
from bkaio.protocol.records import scan_records
from tests.fixtures.shard import served_shard
from tests.fixtures.storage import add_entries
from tests.unit.entrylog.conftest import KEY

LEDGER = 4
ENTRIES = 256
RANGE = 64  # Entries per range read: 64 x 4000 bytes, about 256 KB per answer.
HIGH = 128 * 1024
MAX_MEMORY = 8 * 1024 * 1024
SERVER_OPTIONS = (
    f"write_buffer_high_bytes = {HIGH}\nmax_memory_bytes = {MAX_MEMORY}\n"
    f"max_frame_bytes = {1024 * 1024}\nmax_read_range_bytes = {RANGE * 4000}\n"
)


def payload(entry_id: int) -> bytes:
    return b"%05d" % entry_id * 800


def read_request(request_id: int) -> Request:
    """Mostly range reads at moving starts; every fourth a single-entry read."""
    first = request_id % (ENTRIES - RANGE)
    if request_id % 4 == 0:
        return ReadEntryRequest(request_id, LEDGER, first, Flag.NONE, None)
    return ReadEntriesRequest(
        request_id, LEDGER, first, first + RANGE - 1, 1, RANGE, RANGE * 4000, Flag.NONE, -1, 0
    )


def check_answer(response: Response) -> None:
    """The answer has every entry it was asked for, intact."""
    request_id = response.request_id
    first = request_id % (ENTRIES - RANGE)
    assert response.status is Status.OK, response
    if request_id % 4 == 0:
        assert isinstance(response, ReadEntryResponse) and response.entry is not None
        assert response.entry.payload == payload(first)
        return
    assert isinstance(response, ReadEntriesResponse), response
    scan = scan_records(response.records_bytes, LEDGER, first, 1, first + RANGE - 1)
    assert scan.problem is None and not scan.corrupt
    assert scan.entry_ids == list(range(first, first + RANGE))
    assert scan.payloads == [payload(e) for e in scan.entry_ids]


class WatchedConnection(BookieServerProtocol):
    """The server's side of a connection (with a small send buffer), noting the most it ever
    had unsent, and the most the shard ever held in reservations, each time an answer is
    queued (read answers are queued before their reservation goes back)."""

    most_unsent = 0
    most_reserved = 0
    answered = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")  # Small kernel buffers: the transport's fill.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
        super().connection_made(transport)

    def respond(self, response: Response) -> None:
        super().respond(response)
        WatchedConnection.answered += 1
        WatchedConnection.most_unsent = max(WatchedConnection.most_unsent, self.unsent_bytes())
        memory = self._server.read_memory  # type: ignore[attr-defined]
        WatchedConnection.most_reserved = max(
            WatchedConnection.most_reserved, memory.reserved_bytes
        )


class SlowClient:
    """A raw client socket (small receive buffer) read only when told to."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.decoder = FrameDecoder(8 * 1024 * 1024)
        self.responses: list[Response] = []

    @classmethod
    async def connect(cls, port: int) -> SlowClient:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        sock.setblocking(False)
        client = cls(sock)
        await client.loop.sock_connect(sock, ("127.0.0.1", port))
        await client.send(HelloRequest(0, PROTOCOL_VERSION, "slow-test", None))
        assert (await client.read(1))[0].status is Status.OK
        return client

    async def send(self, *requests: Request) -> None:
        data = b"".join(encode_frame(request.to_body()) for request in requests)
        await self.loop.sock_sendall(self.sock, data)

    async def read(self, count: int) -> list[Response]:
        async with asyncio.timeout(60):
            while len(self.responses) < count:
                data = await self.loop.sock_recv(self.sock, 1 << 20)
                assert data, "the bookie closed the connection"
                self.responses.extend(decode_response(b) for b in self.decoder.feed(data))
        taken, self.responses = self.responses[:count], self.responses[count:]
        return taken

    def close(self) -> None:
        self.sock.close()

    def reset(self) -> None:
        """Close with a reset (unread data, linger 0)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


@asynccontextmanager
async def shard_on_a_socket(tmp_path: Path) -> AsyncIterator[tuple[ShardServer, int]]:
    """The shard with the ledger's entries, listening on a free port of 127.0.0.1."""
    WatchedConnection.most_unsent = WatchedConnection.most_reserved = 0
    WatchedConnection.answered = 0
    async with served_shard(tmp_path, SERVER_OPTIONS) as (server, storage):
        entries = [
            StoredEntry(
                LEDGER, e, e - 1, 4000, entry_digest(LEDGER, e, e - 1, 4000, payload(e)), payload(e)
            )
            for e in range(ENTRIES)
        ]
        await add_entries(storage, entries, KEY)
        listener = await asyncio.get_running_loop().create_server(
            lambda: WatchedConnection(server), "127.0.0.1", 0
        )
        try:
            yield server, listener.sockets[0].getsockname()[1]
        finally:
            listener.close()
            for connection in list(server.connections):
                connection.close_after_flush()
            await asyncio.sleep(0)
            await listener.wait_closed()


async def settle(server: ShardServer, done: Callable[[], bool]) -> None:
    """Yield to the shard until `done()` (each step checking the connections' bound)."""
    bound = HIGH + answer_bound(server.limits, RANGE * 4000, RANGE)
    async with asyncio.timeout(60):
        while True:
            assert WatchedConnection.most_unsent <= bound, WatchedConnection.most_unsent
            if done():
                return
            await asyncio.sleep(0.005)


def reads_stalled(server: ShardServer) -> bool:
    """Every read in flight waits for its reservation (none is being prepared)."""
    memory = server.read_memory
    return memory.held == 0 and memory.waiting_reads == server.inflight_requests > 0


async def test_answers_of_pipelined_reads_stay_within_the_bounds(tmp_path: Path) -> None:
    connections, reads = 24, 16
    async with shard_on_a_socket(tmp_path) as (server, port):
        clients = [await SlowClient.connect(port) for _ in range(connections)]
        hellos = WatchedConnection.answered
        for client in clients:
            await client.send(*(read_request(i) for i in range(1, reads + 1)))
        await settle(server, lambda: reads_stalled(server))
        one_answer = answer_bound(server.limits, RANGE * 4000, RANGE)
        assert WatchedConnection.answered - hellos < connections * reads  # Some wait.
        assert WatchedConnection.most_unsent <= HIGH + one_answer
        assert WatchedConnection.most_reserved <= max(MAX_MEMORY * 3 // 4, one_answer)
        assert server.read_memory.reserved_bytes == 0
        # The clients read: every read is answered, complete and right.
        for client in clients:
            answers = await client.read(reads)
            assert sorted(a.request_id for a in answers) == list(range(1, reads + 1))
            for answer in answers:
                check_answer(answer)
        await settle(server, lambda: server.inflight_requests == 0)
        assert server.read_memory.reserved_bytes == 0 and server.inflight_bytes == 0
        assert WatchedConnection.most_unsent <= HIGH + one_answer
        for client in clients:
            client.close()


async def test_a_lost_connection_gives_back_what_its_reads_waited_for(tmp_path: Path) -> None:
    async with shard_on_a_socket(tmp_path) as (server, port):
        greedy = await SlowClient.connect(port)
        other = await SlowClient.connect(port)
        # Single-entry reads, which only the shard can cancel (a range read is also cancelled
        # by its connection, as a long poll may be).
        await greedy.send(*(read_request(i) for i in range(4, 804, 4)))
        await settle(server, lambda: reads_stalled(server))
        assert server.read_memory.waiting_reads > 0
        greedy.reset()  # The waiting reads have nobody to answer.
        await settle(server, lambda: server.inflight_requests == 0)
        assert server.read_memory.reserved_bytes == 0 and server.inflight_bytes == 0
        assert server.read_memory.waiting_reads == 0
        # The shard still serves others.
        await other.send(read_request(1))
        (answer,) = await other.read(1)
        check_answer(answer)
        other.close()
