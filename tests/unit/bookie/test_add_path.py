"""The bookie's one add path (`decode_adds` -> `ShardServer.add` -> storage -> journal) for
ADD_ENTRY frames: plain adds journaled with no task per add, everything else answered on the
same path with its precise status.

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
import structlog

from bkaio.bookie.connection import BookieServerProtocol
from bkaio.bookie.interfaces import AddRequests
from bkaio.bookie.server import ShardServer
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.errors import ProtocolError
from bkaio.protocol import FrameEncoder, Op, Status
from bkaio.protocol.adds import decode_adds
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.messages import HelloRequest
from tests.fixtures.shard import served_shard
from tests.fixtures.storage import read_entry
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
    for body in bodies:
        shard.server.add(shard.connection, decode_adds(body, 4096, AddRequests))
    assert shard.server.inflight_requests == 5
    assert not shard.server.tasks and not shard.storage._add_tasks  # No task per add.
    answers = await shard.answers(5)
    for body in bodies:
        assert answers[body[1]] == [int(Op.ADD_ENTRY), body[1], Status.OK, LEDGER, body[3]]
    assert shard.server.inflight_requests == 0
    assert shard.server.inflight_bytes == 0
    assert not shard.connection.inflight_ids
    stored = await read_entry(shard.storage, LEDGER, 5)
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
async def test_unusual_adds_get_their_precise_answer_on_the_one_path(
    shard: Shard, change: dict[str, Any], status: Status
) -> None:
    entry_id = 0 if "ledger_id" in change else 1
    body = shard.add_body(entry_id, **change)
    shard.send(body)
    answer = (await shard.answers(1))[body[1]]
    assert answer[2] == status
    assert shard.server.inflight_requests == 0 and not shard.connection.inflight_ids


@pytest.mark.parametrize(
    ("index", "value", "field"),
    [
        (6, 1.5, "lac"),
        (6, -2, "lac"),
        (3, True, "entry_id"),
        (5, "key", "master_key"),
        (9, bytearray(b"x"), "payload"),
    ],
)
async def test_fields_of_the_wrong_type_or_range_are_named_and_change_nothing(
    shard: Shard, index: int, value: Any, field: str
) -> None:
    body = shard.add_body(1)
    body[index] = value
    before = _unchanged(shard)
    with pytest.raises(ProtocolError, match=rf"ADD_ENTRY field {index} \({field}\)"):
        decode_adds(body, 4096, AddRequests)
    if type(value) is bytearray:
        return  # msgpack sends it as bytes: only a caller in process can pass one.
    shard.send(body)  # Through the connection: one ERROR answer naming it, then close.
    (answer,) = (await shard.answers(1)).values()
    assert answer[0] == int(Op.ERROR) and answer[2] == Status.BAD_REQUEST and field in answer[3]
    assert _unchanged(shard) == before
    assert shard.transport.closing


async def test_a_fenced_ledger_refuses_plain_adds(shard: Shard) -> None:
    await shard.storage.fence(LEDGER, KEY)
    body = shard.add_body(1)
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


async def test_an_answer_that_raises_releases_the_accounting_all_the_same(
    shard: Shard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug while answering a durable group must not leak in-flight bytes (they would keep
    the shard's reading paused): the group is released, and the bug reported."""

    def broken(*args: Any) -> None:
        raise RuntimeError("bug while answering")

    monkeypatch.setattr(shard.connection, "respond_add_ok", broken)
    monkeypatch.setattr(shard.connection, "respond_adds_ok", broken)
    bodies = [shard.add_body(entry_id) for entry_id in range(1, 6)]
    with structlog.testing.capture_logs() as logs:
        for body in bodies:
            shard.server.add(shard.connection, decode_adds(body, 4096, AddRequests))
        assert shard.server.inflight_bytes > 0
        for _ in range(1000):  # ~10 s: a bound for a hung test, not a timing claim.
            if not shard.server.inflight_requests:
                break
            await asyncio.sleep(0.01)
    assert shard.server.inflight_bytes == 0
    assert not shard.connection.inflight_ids
    failed = [e for e in logs if e["event"] == "task_failed"]
    assert failed and all(e["task"] == "add_answers" for e in failed)
    assert failed[0]["log_level"] == "error"
