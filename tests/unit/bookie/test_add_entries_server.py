"""The bookie's side of ADD_ENTRIES: each add of a frame taken as if it came alone, OK answers
of one connection coalesced into one ADD_ENTRIES answer, errors answered per add, malformed
frames refused, reading paused within a frame, and the HELLO feature.

In process, as in test_add_path.py: real `ShardStorage` and journal (sync off) in a tmp dir,
`BookieServerProtocol`s on fake transports that decode what the server wrote.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bkaio.bookie.connection import BookieServerProtocol
from bkaio.bookie.server import ADD_ENTRIES_MIN_FRAME_BYTES, ShardServer
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.errors import NoSuchEntryError
from bkaio.protocol import U64_MAX, FrameEncoder, Op, Status
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.messages import HelloRequest
from tests.fixtures.shard import served_shard
from tests.fixtures.storage import read_entry
from tests.fixtures.transports import FakeServerTransport

KEY = b"k" * 32
LEDGER = 4  # Any ledger: one shard.
PAYLOAD = b"p" * 200
ADD_ENTRIES = int(Op.ADD_ENTRIES)
ADD_ENTRY = int(Op.ADD_ENTRY)
ERROR = int(Op.ERROR)


def entry_fields(entry_id: int, *, digest: int | None = None) -> list[Any]:
    """[entry_id, lac, length, digest, payload] of entry `entry_id` of LEDGER."""
    length = (entry_id + 1) * len(PAYLOAD)
    if digest is None:
        digest = entry_digest(LEDGER, entry_id, entry_id - 1, length, PAYLOAD)
    return [entry_id, entry_id - 1, length, digest, PAYLOAD]


def adds_body(
    request_id: int, entry_ids: range | list[int], *, bad_digest: tuple[int, ...] = ()
) -> list[Any]:
    """An ADD_ENTRIES body of LEDGER; entries in `bad_digest` carry a wrong digest."""
    body: list[Any] = [ADD_ENTRIES, request_id, LEDGER, 0, KEY]
    for entry_id in entry_ids:
        body += entry_fields(entry_id, digest=12345 if entry_id in bad_digest else None)
    return body


def add_body(request_id: int, entry_id: int) -> list[Any]:
    """A plain ADD_ENTRY body of LEDGER."""
    entry_id_, lac, length, digest, payload = entry_fields(entry_id)
    return [ADD_ENTRY, request_id, LEDGER, entry_id_, 0, KEY, lac, length, digest, payload]


def answered_ids(answer: list[Any]) -> list[int]:
    """The request ids one answer covers: a range for an ADD_ENTRIES answer, else its own."""
    if answer[0] == ADD_ENTRIES:
        return list(range(answer[1], answer[1] + answer[5]))
    return [answer[1]]


class CountingTransport(FakeServerTransport):
    """The decoding fake transport, also counting how often the server paused reading."""

    def __init__(self) -> None:
        super().__init__(decode=True)
        self.paused = 0

    def pause_reading(self) -> None:
        self.paused += 1


@dataclass
class Peer:
    """One client connection to the shard."""

    connection: BookieServerProtocol
    transport: CountingTransport

    @property
    def bodies(self) -> list[list[Any]]:
        return self.transport.bodies

    def send(self, *bodies: list[Any]) -> None:
        """All `bodies` in one read, as one data_received."""
        encoder = FrameEncoder()
        for body in bodies:
            encoder.add(body)
        self.connection.data_received(encoder.take())

    async def wait_until(self, done: Callable[[list[list[Any]]], bool]) -> None:
        """Wait (journal thread included) until `done(answers so far)`."""
        async with asyncio.timeout(10):
            while not done(self.bodies):
                self.transport.wrote.clear()
                await self.transport.wrote.wait()

    async def answers_for(self, request_ids: range | list[int]) -> list[list[Any]]:
        """Every answer until each of `request_ids` is covered (or an ERROR answer came: the
        connection closes then), then any stray extra ones."""
        wanted = set(request_ids)

        def done(bodies: list[list[Any]]) -> bool:
            covered = {i for body in bodies for i in answered_ids(body)}
            return wanted <= covered or any(body[0] == ERROR for body in bodies)

        await self.wait_until(done)
        await asyncio.sleep(0.05)  # Room for a duplicate answer to show up.
        taken, self.transport.bodies = list(self.bodies), []
        return taken


@dataclass
class Bookie:
    server: ShardServer
    storage: ShardStorage

    def connect(self) -> Peer:
        connection = BookieServerProtocol(self.server)
        transport = CountingTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        return Peer(connection, transport)

    async def hello(self) -> tuple[Peer, list[str]]:
        """A connection past HELLO, and the features the HELLO answer listed."""
        peer = self.connect()
        encoder = FrameEncoder()
        encoder.add(HelloRequest(1, 1, "test", None))
        peer.connection.data_received(encoder.take())
        (answer,) = await peer.answers_for([1])
        assert answer[0] == int(Op.HELLO) and answer[2] == Status.OK, answer
        return peer, answer[7]

    async def stored_ids(self, entry_ids: range | list[int]) -> list[int]:
        """Which of `entry_ids` storage holds, with the payload it was sent with."""
        stored = []
        for entry_id in entry_ids:
            try:
                entry = await read_entry(self.storage, LEDGER, entry_id)
            except NoSuchEntryError:
                continue
            assert entry.payload == PAYLOAD
            stored.append(entry_id)
        return stored


@asynccontextmanager
async def open_bookie(
    tmp_path: Path, server_options: str = "", storage_options: str = ""
) -> AsyncIterator[Bookie]:
    async with served_shard(tmp_path, server_options, storage_options) as (server, storage):
        yield Bookie(server, storage)


async def ledger_with_entry_0(bookie: Bookie) -> Peer:
    """A connection past HELLO to a shard where LEDGER exists (entry 0 added on the full path,
    which records the key): later adds can take the fast path."""
    peer, _ = await bookie.hello()
    peer.send(add_body(10, 0))
    (answer,) = await peer.answers_for([10])
    assert answer == [ADD_ENTRY, 10, Status.OK, LEDGER, 0]
    return peer


@pytest.fixture
async def bookie(tmp_path: Path) -> AsyncIterator[Bookie]:
    async with open_bookie(tmp_path) as opened:
        yield opened


async def test_a_frame_of_adds_is_answered_by_one_add_entries_ok(bookie: Bookie) -> None:
    """N adds in one frame: journaled in one group, answered by ONE [11, first, OK, ledger,
    first entry, N] frame; every entry stored; nothing left in flight."""
    peer = await ledger_with_entry_0(bookie)
    peer.send(adds_body(100, range(1, 9)))
    answers = await peer.answers_for(range(100, 108))
    assert answers == [[ADD_ENTRIES, 100, Status.OK, LEDGER, 1, 8]]
    assert await bookie.stored_ids(range(1, 9)) == list(range(1, 9))
    state = bookie.storage.ledger_state(LEDGER)
    assert state is not None and state.last_entry_id == 8
    assert bookie.server.inflight_requests == 0 and bookie.server.inflight_bytes == 0
    assert not peer.connection.inflight_ids
    assert not peer.transport.closing


async def test_adds_of_consecutive_frames_of_one_read_coalesce_into_one_answer(
    bookie: Bookie,
) -> None:
    """Two frames whose ids continue each other, in one read: one answer for both."""
    peer = await ledger_with_entry_0(bookie)
    peer.send(adds_body(100, range(1, 4)), adds_body(103, range(4, 6)))
    answers = await peer.answers_for(range(100, 105))
    assert answers == [[ADD_ENTRIES, 100, Status.OK, LEDGER, 1, 5]]


async def test_a_bad_digest_fails_that_add_alone(bookie: Bookie) -> None:
    """Entry 3 of 1..6 has a wrong digest: its own ADD_ENTRY BAD_DIGEST answer; the others
    are OK (as runs that skip it), stored, and each answered exactly once."""
    peer = await ledger_with_entry_0(bookie)
    peer.send(adds_body(100, range(1, 7), bad_digest=(3,)))
    answers = await peer.answers_for(range(100, 106))
    assert [ADD_ENTRY, 102, Status.BAD_DIGEST, LEDGER, 3] in answers
    ok = [answer for answer in answers if answer[2] == Status.OK]
    assert len(ok) + 1 == len(answers)
    covered = Counter(i for answer in ok for i in answered_ids(answer))
    assert covered == Counter([100, 101, 103, 104, 105])
    for answer in ok:  # Entry ids follow request ids in every answer.
        assert answer[3] == LEDGER and answer[4] == answer[1] - 99
    assert sorted(answer[1] for answer in ok) == [100, 103]  # Two runs: 1..2 and 4..6.
    assert await bookie.stored_ids(range(1, 7)) == [1, 2, 4, 5, 6]


async def test_a_plain_add_entry_is_never_coalesced(bookie: Bookie) -> None:
    """Plain ADD_ENTRYs, even with continuing ids and next to an ADD_ENTRIES frame, get the
    5-field ADD_ENTRY answer: a client that never sends ADD_ENTRIES never sees op 11."""
    peer = await ledger_with_entry_0(bookie)
    peer.send(*(add_body(100 + i, 1 + i) for i in range(4)))
    answers = await peer.answers_for(range(100, 104))
    assert sorted(answers) == [[ADD_ENTRY, 100 + i, Status.OK, LEDGER, 1 + i] for i in range(4)]
    peer.send(adds_body(200, range(5, 8)), add_body(203, 8))  # The plain one continues the ids.
    answers = await peer.answers_for(range(200, 204))
    assert sorted(answers) == [
        [ADD_ENTRY, 203, Status.OK, LEDGER, 8],
        [ADD_ENTRIES, 200, Status.OK, LEDGER, 5, 3],
    ]


async def test_a_frame_of_one_entry_is_answered(bookie: Bookie) -> None:
    """An ADD_ENTRIES of a single entry (10 fields) is one add like any other."""
    peer = await ledger_with_entry_0(bookie)
    peer.send(adds_body(100, [1]))
    answers = await peer.answers_for([100])
    assert len(answers) == 1 and answered_ids(answers[0]) == [100]
    assert answers[0][2] == Status.OK
    assert await bookie.stored_ids([1]) == [1]


async def test_a_frame_for_a_new_ledger_is_answered_in_full(bookie: Bookie) -> None:
    """The first adds of a ledger cannot take the fast path: every one still gets one OK."""
    peer, _ = await bookie.hello()
    peer.send(adds_body(100, range(0, 5)))
    answers = await peer.answers_for(range(100, 105))
    covered = Counter(i for answer in answers for i in answered_ids(answer))
    assert covered == Counter(range(100, 105))
    assert all(answer[2] == Status.OK for answer in answers)
    assert await bookie.stored_ids(range(0, 5)) == list(range(0, 5))


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (adds_body(100, [])[:5], "ADD_ENTRIES has 5 fields"),  # No entry.
        (adds_body(100, range(1, 3))[:-2], "ADD_ENTRIES has 13 fields"),  # A partial entry.
        ([*adds_body(100, range(1, 3)), 1], "ADD_ENTRIES has 16 fields"),
        (adds_body(U64_MAX - 1, range(1, 4)), "the last request id would exceed"),
        ([ADD_ENTRIES, "x", *adds_body(100, range(1, 3))[2:]], r"field 1 \(request_id\)"),
        (
            [*adds_body(100, [1])[:5], *entry_fields(1)[:4], "payload", *entry_fields(2)],
            r"\(payload\) must be bytes",
        ),
        (
            [*adds_body(100, [1])[:3], 8, KEY, *entry_fields(1), *entry_fields(2)],
            r"\(flags\) must be a combination",
        ),
    ],
    ids=[
        "no-entry",
        "partial-entry",
        "extra-field",
        "id-overflow",
        "request-id-str",
        "payload-str",
        "flags-unknown",
    ],
)
async def test_a_malformed_frame_after_hello_gets_error_and_closes(
    bookie: Bookie, body: list[Any], match: str
) -> None:
    """One ERROR answer with BAD_REQUEST naming the problem; then the connection closes."""
    peer = await ledger_with_entry_0(bookie)
    peer.send(body)
    await peer.wait_until(lambda bodies: any(b[0] == ERROR for b in bodies))
    await asyncio.sleep(0.05)
    errors = [b for b in peer.bodies if b[0] == ERROR]
    assert len(errors) == 1
    assert errors[0][2] == Status.BAD_REQUEST
    assert re.search(match, errors[0][3]), errors[0]
    assert peer.transport.closing


async def test_add_entries_before_hello_gets_bad_request_for_all_and_closes(bookie: Bookie) -> None:
    """Before HELLO: one AddEntriesResponse with BAD_REQUEST covering every entry, then close;
    nothing is stored."""
    peer = bookie.connect()
    peer.send(adds_body(100, range(0, 4)))
    await peer.wait_until(lambda bodies: bool(bodies))
    assert peer.bodies == [[ADD_ENTRIES, 100, Status.BAD_REQUEST, LEDGER, 0, 4]]
    assert peer.transport.closing
    assert bookie.storage.ledger_state(LEDGER) is None


async def test_reading_paused_between_frames_answers_every_add_once(tmp_path: Path) -> None:
    """max_inflight_per_connection = 3 and frames of exactly 3 adds plus a PING in one read:
    reading pauses after the first frame; the rest waits in the backlog and is answered
    later; every add is answered exactly once, OK, and stored."""
    async with open_bookie(tmp_path, "max_inflight_per_connection = 3\n") as bookie:
        peer = await ledger_with_entry_0(bookie)
        peer.send(
            adds_body(100, range(1, 4)),
            [int(Op.PING), 7],
            adds_body(103, range(4, 7)),
            adds_body(106, range(7, 10)),
        )
        assert peer.transport.paused >= 1
        await _every_add_answered_once(bookie, peer, range(100, 109))


async def _every_add_answered_once(bookie: Bookie, peer: Peer, request_ids: range) -> None:
    """Each of `request_ids` (entry = request id - 99) and the PING 7 answered OK exactly once,
    the entries stored, nothing left in flight, the connection open."""
    answers = await peer.answers_for([7, *request_ids])
    assert [body for body in answers if body[0] == ERROR] == []
    covered = Counter(i for answer in answers for i in answered_ids(answer))
    assert covered == Counter([7, *request_ids])
    assert all(answer[2] == Status.OK for answer in answers)
    for answer in answers:
        if answer[0] in (ADD_ENTRY, ADD_ENTRIES):
            assert answer[4] == answer[1] - 99  # Entry ids match request ids.
    entry_ids = range(request_ids[0] - 99, request_ids[-1] - 98)
    assert await bookie.stored_ids(entry_ids) == list(entry_ids)
    assert bookie.server.inflight_requests == 0
    assert not peer.transport.closing


async def test_reading_paused_within_a_frame_answers_every_add_once(tmp_path: Path) -> None:
    """max_inflight_per_connection = 3 and frames of 10 and 5 adds plus a PING in one read:
    reading pauses inside the first frame; its other adds wait and are answered later; every
    add is answered exactly once, OK, and stored."""
    async with open_bookie(tmp_path, "max_inflight_per_connection = 3\n") as bookie:
        peer = await ledger_with_entry_0(bookie)
        peer.send(adds_body(100, range(1, 11)), [int(Op.PING), 7], adds_body(110, range(11, 16)))
        assert peer.transport.paused >= 1  # Paused while the first frame was being taken.
        await _every_add_answered_once(bookie, peer, range(100, 115))


async def test_a_full_write_cache_stops_reading_until_the_waiting_adds_have_room(
    tmp_path: Path,
) -> None:
    """A write cache of 4 KiB and 40 adds of 200 bytes in one read: the adds past the room
    wait for it, and while they do no connection is read (a second one made meanwhile
    included); once the flush made room for them, reading resumes, and every add is
    answered exactly once, OK, and stored."""
    async with open_bookie(tmp_path, storage_options="write_cache_bytes = 4096\n") as bookie:
        peer = await ledger_with_entry_0(bookie)
        full: list[bool] = []
        noticed = asyncio.Event()
        listener = bookie.storage.room_pressure_listener
        assert listener is not None

        def noted(waiting: bool) -> None:
            full.append(waiting)
            noticed.set()
            listener(waiting)

        bookie.storage.room_pressure_listener = noted
        peer.send(adds_body(100, range(1, 41)), [int(Op.PING), 7])
        # The adds past the room wait in tasks; the first of them to run says so.
        await asyncio.wait_for(noticed.wait(), 10)
        assert full[0] is True and peer.transport.paused >= 1
        other = bookie.connect()
        if bookie.server.write_cache_full:  # (Unless the flush already made the room.)
            assert other.transport.paused == 1  # Made while the cache is full: not read.
        await _every_add_answered_once(bookie, peer, range(100, 140))
        assert full[-1] is False and not bookie.server.write_cache_full
        assert not peer.connection._reading_paused and not other.connection._reading_paused
        assert bookie.server.metrics.limit_hits.labels(limit="write_cache_bytes")._value.get() >= 1


async def test_features_with_default_limits_include_add_entries(bookie: Bookie) -> None:
    """The default max_frame_bytes (8 MiB) offers ADD_ENTRIES."""
    _, features = await bookie.hello()
    assert "add_entries" in features


@pytest.mark.parametrize(
    ("max_frame_bytes", "offered"),
    [
        (64 * 1024, False),
        (ADD_ENTRIES_MIN_FRAME_BYTES - 1, False),
        (ADD_ENTRIES_MIN_FRAME_BYTES, True),
    ],
)
async def test_features_depend_on_max_frame_bytes(
    tmp_path: Path, max_frame_bytes: int, offered: bool
) -> None:
    """A bookie with max_frame_bytes below 256 KiB does not offer ADD_ENTRIES; the other
    features stay."""
    assert ADD_ENTRIES_MIN_FRAME_BYTES == 256 * 1024
    async with open_bookie(tmp_path, f"max_frame_bytes = {max_frame_bytes}\n") as bookie:
        _, features = await bookie.hello()
    assert ("add_entries" in features) is offered
    assert {"read_range", "long_poll", "fence", "write_lac", "list_entries"} <= set(features)


async def test_adds_in_the_same_read_as_the_hello_take_the_add_path(bookie: Bookie) -> None:
    """HELLO, an ADD_ENTRY and an ADD_ENTRIES frame in one read: all answered OK."""
    peer = bookie.connect()
    encoder = FrameEncoder()
    encoder.add(HelloRequest(1, 1, "test", None))
    encoder.add(add_body(10, 0))
    encoder.add(adds_body(11, range(1, 4)))
    peer.connection.data_received(encoder.take())
    answers = await peer.answers_for([1, 10, 11, 12, 13])
    assert all(answer[2] == Status.OK for answer in answers), answers
    assert await bookie.stored_ids(range(0, 4)) == [0, 1, 2, 3]


async def test_adds_of_a_frame_whose_ids_are_in_flight_are_refused_alone(bookie: Bookie) -> None:
    """A frame reusing request ids still in flight: those adds get BAD_REQUEST at once and are
    not executed; the adds around them are taken and answered OK."""
    peer = await ledger_with_entry_0(bookie)
    # Entry 1 as request 101, in the same read as a frame that reuses 101: it is in flight
    # (journaled, not yet durable) when the frame is taken.
    peer.send(add_body(101, 1), adds_body(100, range(2, 5)))
    answers = await peer.answers_for([100, 101, 102])
    refused = [answer for answer in answers if answer[2] == Status.BAD_REQUEST]
    assert refused == [[ADD_ENTRY, 101, Status.BAD_REQUEST, LEDGER, 3]]
    ok = Counter(i for answer in answers if answer[2] == Status.OK for i in answered_ids(answer))
    assert ok == Counter([100, 101, 102])
    assert await bookie.stored_ids(range(1, 5)) == [1, 2, 4]  # Entry 3 was not executed.


async def test_drain_waits_for_journaled_adds_and_answers_them(bookie: Bookie) -> None:
    """Shutdown: reading stops, and the adds already journaled are answered before the drain
    returns (never dropped)."""
    peer = await ledger_with_entry_0(bookie)
    peer.send(adds_body(100, range(1, 21)))
    assert bookie.server.inflight_requests == 20
    await bookie.server.drain(10.0)
    assert bookie.server.inflight_requests == 0
    answers = await peer.answers_for(range(100, 120))
    assert Counter(i for answer in answers for i in answered_ids(answer)) == Counter(
        range(100, 120)
    )
    assert all(answer[2] == Status.OK for answer in answers)


@pytest.mark.parametrize("op", [[1, 2], {"a": 1}, b"x", 2.0, None])
async def test_a_body_whose_op_is_not_an_int_gets_error_and_closes(bookie: Bookie, op: Any) -> None:
    """Whatever msgpack value stands where the op should (a list, a map: unhashable), one
    ERROR answer and a close, nothing raised out of the connection."""
    peer, _ = await bookie.hello()
    peer.send([op, 5, 6])
    await peer.wait_until(lambda bodies: any(b[0] == ERROR for b in bodies))
    assert peer.transport.closing
