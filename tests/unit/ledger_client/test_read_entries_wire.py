"""`BookiePool.read_entries` on the wire: READ_ENTRIES to a bookie whose HELLO answer offers
it, the older requests (READ_RANGE, READ_ENTRY, READ_LAC) to one that does not, and the wait
for that answer. No network: a fake transport records the writes; answers are fed in."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from bkaio.errors import BookieUnavailableError
from bkaio.ledger_client.connections import BookieConnection, BookiePool
from bkaio.ledger_client.types import ClientConfig, EntriesAnswer
from bkaio.protocol import (
    PROTOCOL_VERSION,
    READ_ENTRIES_FEATURE,
    Flag,
    FrameEncoder,
    HelloResponse,
    ReadEntriesRequest,
    ReadEntriesResponse,
    ReadEntryRequest,
    ReadEntryResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    Request,
    Response,
    Status,
    WireEntry,
)
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.records import pack_record, scan_records
from tests.fixtures.transports import FakeClientTransport

LEDGER = 4


@dataclass(frozen=True)
class Address:
    bookie_id: str = "b0"
    host: str = "127.0.0.1"
    port: int = 1
    shard_count: int = 1


def wire(entry_id: int) -> WireEntry:
    payload = b"p%d" % entry_id
    digest = entry_digest(LEDGER, entry_id, entry_id - 1, entry_id + 1, payload)
    return WireEntry(entry_id, entry_id - 1, entry_id + 1, digest, payload)


def records(*entry_ids: int) -> bytes:
    parts: list[bytes] = []
    for e in map(wire, entry_ids):
        parts += pack_record(LEDGER, e.entry_id, e.lac, e.length, e.digest, e.payload)
    return b"".join(parts)


class Bookie:
    """The pool's connection to one fake bookie, its HELLO not yet answered."""

    def __init__(self, pool: BookiePool) -> None:
        self.connection: BookieConnection = pool._connection("b0", LEDGER)
        self.transport = FakeClientTransport()
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]

    def answer(self, response: Response) -> None:
        encoder = FrameEncoder()
        encoder.add(response)
        self.connection.data_received(encoder.take())

    def hello(self, *features: str) -> None:
        self.answer(HelloResponse(1, Status.OK, PROTOCOL_VERSION, "b0", 0, 1, features))

    async def request(self) -> Request:
        """The one request sent after HELLO (waiting for it to be written)."""
        for _ in range(100):
            sent = [r for r in self.transport.requests() if r.request_id != 1]
            if sent:
                (request,) = sent
                return request
            await asyncio.sleep(0)
        raise AssertionError("nothing was sent")


async def test_a_bookie_with_the_feature_gets_read_entries() -> None:
    pool = BookiePool(ClientConfig(), lambda _bookie: Address())
    bookie = Bookie(pool)
    read = asyncio.ensure_future(
        pool.read_entries("b0", LEDGER, 3, 20, stride=4, max_count=9, max_bytes=1000)
    )
    await asyncio.sleep(0)
    assert not read.done()  # Waits for the HELLO answer, which says what the bookie takes.
    bookie.hello(READ_ENTRIES_FEATURE)
    request = await bookie.request()
    assert request == ReadEntriesRequest(
        request.request_id, LEDGER, 3, 20, 4, 9, 1000, Flag.NONE, -1, 0
    )
    bookie.answer(
        ReadEntriesResponse(request.request_id, Status.OK, LEDGER, 2, 12, (records(3, 7),))
    )
    assert await read == EntriesAnswer(2, 12, records(3, 7))
    poll = asyncio.ensure_future(
        pool.read_entries(
            "b0",
            LEDGER,
            8,
            2**63 - 1,
            max_count=5,
            max_bytes=100,
            previous_lac=7,
            long_poll_seconds=0.25,
        )
    )
    request = await bookie.request()
    assert isinstance(request, ReadEntriesRequest)
    assert (request.flags, request.previous_lac, request.timeout_ms) == (Flag.LONG_POLL, 7, 250)
    bookie.answer(ReadEntriesResponse(request.request_id, Status.OK, LEDGER, 8, 9, (records(8),)))
    assert await poll == EntriesAnswer(8, 9, records(8))


async def test_an_older_bookie_is_read_with_read_range_and_read_entry() -> None:
    pool = BookiePool(ClientConfig(), lambda _bookie: Address())
    bookie = Bookie(pool)
    bookie.hello("read_range", "long_poll")
    read = asyncio.ensure_future(
        pool.read_entries("b0", LEDGER, 5, 9, max_count=100, max_bytes=1000)
    )
    request = await bookie.request()
    assert request == ReadRangeRequest(request.request_id, LEDGER, 5, 5, 1000, Flag.NONE, None)
    entries = (wire(5), wire(6))  # Stops before 7, which it lacks.
    bookie.answer(ReadRangeResponse(request.request_id, Status.OK, LEDGER, 6, entries))
    answer = await read
    assert (answer.lac, answer.next_entry_id) == (6, 7)
    assert scan_records(answer.records, LEDGER, 5, 1, 9).entry_ids == [5, 6]

    stride = asyncio.ensure_future(
        pool.read_entries("b0", LEDGER, 7, 20, stride=3, max_count=5, max_bytes=1000)
    )
    request = await bookie.request()
    assert request == ReadEntryRequest(request.request_id, LEDGER, 7, Flag.NONE, None)
    bookie.answer(ReadEntryResponse(request.request_id, Status.NO_SUCH_ENTRY, LEDGER, 7, 6, None))
    assert await stride == EntriesAnswer(-1, 10, b"")  # Entry 7 alone, which it lacks.

    poll = asyncio.ensure_future(
        pool.read_entries(
            "b0",
            LEDGER,
            7,
            50,
            max_count=5,
            max_bytes=100,
            previous_lac=6,
            long_poll_seconds=1.0,
        )
    )
    request = await bookie.request()
    assert isinstance(request, ReadLacRequest) and request.flags is Flag.LONG_POLL
    bookie.answer(ReadLacResponse(request.request_id, Status.OK, LEDGER, 9, 9))
    assert await poll == EntriesAnswer(9, 7, b"")  # The LAC only: nothing looked at.


async def test_a_connection_lost_before_its_hello_answer_fails_the_read() -> None:
    pool = BookiePool(ClientConfig(), lambda _bookie: Address())
    bookie = Bookie(pool)
    read = asyncio.ensure_future(
        pool.read_entries("b0", LEDGER, 0, 9, max_count=10, max_bytes=1000)
    )
    await asyncio.sleep(0)
    bookie.connection.connection_lost(None)
    with pytest.raises(
        BookieUnavailableError, match="closed the connection before answering HELLO"
    ):
        await read
    await pool.close()
