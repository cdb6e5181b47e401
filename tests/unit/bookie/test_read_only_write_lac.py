"""A read-only shard refuses WRITE_LAC as it refuses adds (READ_ONLY), as BookKeeper's
WriteLacProcessorV3 does (EREADONLY): the LAC is journaled, and a shard turned read-only for a
full disk must not write its journal (a journal write that fails ends the bookie). The writer
only loses a hint for readers: its explicit-LAC job takes any error as "bookie down".

In process: a `ShardServer` on real storage, one `BookieServerProtocol` on a fake transport.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bkaio.bookie.connection import BookieServerProtocol
from bkaio.protocol import FrameEncoder, Status
from bkaio.protocol.messages import HelloRequest, WriteLacRequest
from tests.fixtures.shard import served_shard
from tests.fixtures.transports import FakeServerTransport

KEY = b"k" * 32
LEDGER = 4


async def test_a_read_only_shard_refuses_write_lac(tmp_path: Path) -> None:
    async with served_shard(tmp_path) as (server, storage):
        connection = BookieServerProtocol(server)
        transport = FakeServerTransport(decode=True)
        connection.connection_made(transport)  # type: ignore[arg-type]

        async def answer(request: WriteLacRequest | HelloRequest) -> int:
            encoder = FrameEncoder()
            encoder.add(request)
            transport.bodies.clear()
            connection.data_received(encoder.take())
            async with asyncio.timeout(10):
                while not transport.bodies:
                    transport.wrote.clear()
                    await transport.wrote.wait()
            return int(transport.bodies[0][2])

        assert await answer(HelloRequest(1, 1, "test", None)) == Status.OK
        server.set_read_only(disk_full=True)
        assert await answer(WriteLacRequest(2, LEDGER, KEY, 5)) == Status.READ_ONLY
        assert storage.ledger_state(LEDGER) is None  # Nothing recorded, nothing journaled.
        server.set_read_only(disk_full=False)
        assert await answer(WriteLacRequest(3, LEDGER, KEY, 5)) == Status.OK
        assert storage.last_add_confirmed(LEDGER) == 5
