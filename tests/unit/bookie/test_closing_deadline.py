"""A connection the bookie closes (after a protocol error, the client's EOF, a refused HELLO,
shutdown) is gone within `server.frame_read_timeout_seconds` even when its client never reads.

`transport.close()` waits until the last answers are written; a client that stopped reading
(its receive window shut, or it vanished without a reset) keeps that wait, the answers it left
unread and its place among `max_connections` for as long as it likes: the deadline sweep
skipped closing connections. It now aborts one still open past the deadline, as it does a
connection that stalls mid-frame.

In process: a `ShardServer` on real storage, one `BookieServerProtocol` on a fake transport
whose `close` never completes (the peer reads nothing), the sweep called with a later time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bkaio.bookie.connection import BookieServerProtocol
from bkaio.protocol import FrameEncoder, Status
from bkaio.protocol.messages import HelloRequest
from tests.fixtures.shard import served_shard
from tests.fixtures.transports import FakeServerTransport


class UnreadTransport(FakeServerTransport):
    """A peer that reads nothing: `close` waits for a flush that never comes."""

    def __init__(self) -> None:
        super().__init__(decode=True)
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True
        super().abort()


async def test_a_closing_connection_whose_client_never_reads_is_aborted(tmp_path: Path) -> None:
    async with served_shard(tmp_path, server_options="frame_read_timeout_seconds = 5.0\n") as (
        server,
        _storage,
    ):
        loop = asyncio.get_running_loop()
        connection = BookieServerProtocol(server)
        transport = UnreadTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        hello = FrameEncoder()
        hello.add(HelloRequest(1, 1, "test", None))
        connection.data_received(hello.take())
        connection.data_received(b"\x00\x00\x00\x01\xc1")  # A body that is not msgpack.
        await asyncio.sleep(0)  # The flush: the answers written, close() asked.
        assert transport.closing and not transport.aborted
        assert [body[2] for body in transport.bodies] == [Status.OK, Status.BAD_REQUEST]
        now = loop.time()
        server.sweep(now + 4.0)  # Within the deadline: the client may still read.
        assert not transport.aborted
        server.sweep(now + 6.0)
        assert transport.aborted
