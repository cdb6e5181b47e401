"""The bookie's add loop (`ShardServer.take_add`): plain adds straight from their fields,
everything else left, untouched, to the full request path with its precise answer.

In process: real `ShardStorage` and journal (sync off) in tmp dirs, one `BookieServerProtocol`
on a fake transport that records what the server wrote.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bkaio.bookie.connection import BookieServerProtocol
from bkaio.bookie.server import ShardServer
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.protocol import FrameEncoder, Op, Status
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.messages import HelloRequest
from tests.fixtures.shard import served_shard
from tests.fixtures.transports import FakeServerTransport

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
LEDGER = 4  # Any ledger: one shard.
PAYLOAD = b"p" * 200


@dataclass
class Shard:
    server: ShardServer
    storage: ShardStorage
    connection: BookieServerProtocol
    transport: FakeServerTransport
    next_request_id: int = 100
    length: int = 0
    sent: list[int] = field(default_factory=list)

    def add_body(
        self,
        entry_id: int,
        *,
        key: bytes = KEY,
        flags: int = 0,
        payload: bytes = PAYLOAD,
        digest: int | None = None,
        request_id: int | None = None,
        ledger_id: int = LEDGER,
    ) -> list[Any]:
        if request_id is None:
            request_id = self.next_request_id
            self.next_request_id += 1
        length = (entry_id + 1) * len(payload)
        if digest is None:
            digest = entry_digest(ledger_id, entry_id, entry_id - 1, length, payload)
        return [
            int(Op.ADD_ENTRY), request_id, ledger_id, entry_id, flags, key, entry_id - 1,
            length, digest, payload,
        ]  # fmt: skip

    def send(self, *bodies: list[Any]) -> None:
        encoder = FrameEncoder()
        for body in bodies:
            encoder.add(body)
        self.connection.data_received(encoder.take())

    async def answer_list(self, count: int) -> list[list[Any]]:
        """The next `count` answers in the order written, waiting for the journal as needed."""
        async with asyncio.timeout(10):
            while len(self.transport.bodies) < count:
                self.transport.wrote.clear()
                await self.transport.wrote.wait()
        taken, self.transport.bodies = self.transport.bodies[:count], self.transport.bodies[count:]
        return taken

    async def answers(self, count: int) -> dict[int, list[Any]]:
        """The next `count` answers by request id."""
        return {body[1]: body for body in await self.answer_list(count)}


@pytest.fixture
async def shard(tmp_path: Path) -> AsyncIterator[Shard]:
    async with served_shard(tmp_path) as (server, storage):
        connection = BookieServerProtocol(server)
        transport = FakeServerTransport(decode=True)
        connection.connection_made(transport)  # type: ignore[arg-type]
        hello = FrameEncoder()
        hello.add(HelloRequest(1, 1, "test", None))
        connection.data_received(hello.take())
        result = Shard(server, storage, connection, transport)
        assert (await result.answers(1))[1][2] == Status.OK
        result.send(result.add_body(0))  # First add of the ledger: the full path records its key.
        assert next(iter((await result.answers(1)).values()))[2] == Status.OK
        yield result


def _unchanged(shard: Shard) -> tuple[Any, ...]:
    server = shard.server
    return (
        server.inflight_requests,
        server.inflight_bytes,
        len(shard.connection.inflight_ids),
        shard.storage.ledger_state(LEDGER),
    )


async def test_plain_adds_are_taken_journaled_applied_and_answered(shard: Shard) -> None:
    bodies = [shard.add_body(entry_id) for entry_id in range(1, 6)]
    assert all(shard.server.take_add(shard.connection, body) for body in bodies)
    assert shard.server.inflight_requests == 5
    assert not shard.server.tasks  # No task per add.
    answers = await shard.answers(5)
    for body in bodies:
        assert answers[body[1]] == [int(Op.ADD_ENTRY), body[1], Status.OK, LEDGER, body[3]]
    assert shard.server.inflight_requests == 0
    assert shard.server.inflight_bytes == 0
    assert not shard.connection.inflight_ids
    stored = await shard.storage.read_entry(LEDGER, 5)
    assert stored.payload == PAYLOAD
    state = shard.storage.ledger_state(LEDGER)
    assert state is not None and state.last_entry_id == 5


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"digest": 12345}, Status.BAD_DIGEST),
        ({"key": OTHER_KEY}, Status.UNAUTHORIZED),
        ({"payload": b"x" * 5000}, Status.BAD_REQUEST),  # Above server.max_entry_bytes.
        ({"ledger_id": 77}, Status.OK),  # A new ledger: its key is recorded first.
        ({"flags": 1}, Status.OK),  # A recovery add.
    ],
)
async def test_unusual_adds_are_left_to_the_full_path_untouched(
    shard: Shard, change: dict[str, Any], status: Status
) -> None:
    entry_id = 0 if "ledger_id" in change else 1
    body = shard.add_body(entry_id, **change)
    before = _unchanged(shard)
    assert not shard.server.take_add(shard.connection, body)
    assert _unchanged(shard) == before
    shard.send(body)  # The same bytes through the connection: the full path answers.
    answer = (await shard.answers(1))[body[1]]
    assert answer[2] == status


async def test_fields_of_the_wrong_type_or_range_are_left_to_the_decoder(shard: Shard) -> None:
    for index, value in [(6, 1.5), (6, -2), (3, True), (5, "key"), (9, bytearray(b"x"))]:
        body = shard.add_body(1)
        body[index] = value
        before = _unchanged(shard)
        assert not shard.server.take_add(shard.connection, body)
        assert _unchanged(shard) == before


async def test_a_fenced_ledger_refuses_plain_adds(shard: Shard) -> None:
    await shard.storage.fence(LEDGER, KEY)
    body = shard.add_body(1)
    assert not shard.server.take_add(shard.connection, body)
    shard.send(body)
    assert (await shard.answers(1))[body[1]][2] == Status.FENCED


async def test_a_duplicate_request_id_in_flight_is_refused_by_the_full_path(shard: Shard) -> None:
    first = shard.add_body(1)
    second = shard.add_body(2, request_id=first[1])
    shard.send(first, second)  # One read: the second arrives while the first is in flight.
    statuses = sorted(body[2] for body in await shard.answer_list(2))
    assert statuses == [Status.OK, Status.BAD_REQUEST]
    state = shard.storage.ledger_state(LEDGER)
    assert state is not None and state.last_entry_id == 1  # The duplicate was not executed.


async def test_a_read_only_shard_refuses_plain_adds(shard: Shard) -> None:
    shard.server.set_read_only(forced=True)
    body = shard.add_body(1)
    assert not shard.server.take_add(shard.connection, body)
    shard.send(body)
    assert (await shard.answers(1))[body[1]][2] == Status.READ_ONLY


async def test_adds_mixed_with_other_requests_keep_their_answers(shard: Shard) -> None:
    ping = [int(Op.PING), 7]
    bodies = [shard.add_body(1), ping, shard.add_body(2), shard.add_body(3, digest=1)]
    shard.send(*bodies)
    answers = await shard.answers(4)
    assert answers[7][2] == Status.OK
    assert answers[bodies[0][1]][2] == Status.OK
    assert answers[bodies[2][1]][2] == Status.OK
    assert answers[bodies[3][1]][2] == Status.BAD_DIGEST
