"""The client's side of ADD_ENTRIES: `BookieConnection.batches_adds` from the HELLO answer,
`send_adds` / `send_add_to_entries` frames, ADD_ENTRIES answers (OK, errors, a broken count),
timeouts and connection loss; `BookiePool.add_entries` refusing a connection that does not
batch. No network: a fake transport records the writes; answers are fed to data_received.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from types import MethodType
from typing import Any

import pytest

from bkaio.errors import (
    BKError,
    BKTimeoutError,
    BookieUnavailableError,
    LedgerFencedError,
    ProtocolError,
)
from bkaio.ledger_client.add_batching import _frames_of
from bkaio.ledger_client.connections import BookieConnection, BookiePool
from bkaio.ledger_client.errors import RequestRefusedError
from bkaio.ledger_client.types import ClientConfig
from bkaio.protocol import (
    PROTOCOL_VERSION,
    AddEntriesRequest,
    AddEntriesResponse,
    AddEntryResponse,
    Flag,
    FrameEncoder,
    HelloResponse,
    Op,
    ReadLacRequest,
    Status,
    WireEntry,
    encode_frame,
)
from bkaio.protocol.encoder import ADD_ENTRIES_BATCH_BYTES
from tests.fixtures.transports import FakeClientTransport

KEY = b"k" * 32
LEDGER = 5
FEATURES = ("read_range", "add_entries")
_PACKER = FrameEncoder()


def _connection(config: ClientConfig | None = None) -> tuple[BookieConnection, FakeClientTransport]:
    """A connection whose transport is up; HELLO (request id 1) written, not answered."""
    connection = BookieConnection(
        bookie_id="b0", host="127.0.0.1", port=1, shard_index=0, config=config or ClientConfig()
    )
    transport = FakeClientTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def _answer_hello(connection: BookieConnection, features: tuple[str, ...]) -> None:
    hello = HelloResponse(1, Status.OK, PROTOCOL_VERSION, "b0", 0, 1, features)
    connection.data_received(encode_frame(hello.to_body()))


def _batching(config: ClientConfig | None = None) -> tuple[BookieConnection, FakeClientTransport]:
    """A connection past a HELLO answer that offers ADD_ENTRIES; nothing written since."""
    connection, transport = _connection(config)
    _answer_hello(connection, FEATURES)
    assert connection.batches_adds
    transport.writes.clear()
    return connection, transport


def _answer(
    connection: BookieConnection, *responses: AddEntriesResponse | AddEntryResponse
) -> None:
    encoder = FrameEncoder()
    for response in responses:
        encoder.add(response)
    connection.data_received(encoder.take())


@dataclass(frozen=True)
class Add:
    """What a ledger handle passes as an add: here only its entry."""

    entry: WireEntry

    @property
    def packed(self) -> bytes:
        e = self.entry
        return _PACKER.pack_fields([e.entry_id, e.lac, e.length, e.digest, e.payload])


def _adds(first_entry: int, count: int, payload: bytes = b"payload") -> list[Add]:
    return [
        Add(WireEntry(i, i - 1, (i + 1) * len(payload), 1000 + i, payload))
        for i in range(first_entry, first_entry + count)
    ]


class Answers:
    """The handler of `send_adds`: records (add, result) pairs in arrival order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Add, BKError | None]] = []
        self.changed = asyncio.Event()

    def handler(self, add: Add, result: BKError | None) -> None:
        self.calls.append((add, result))
        self.changed.set()

    def of(self, add: Add) -> list[BKError | None]:
        return [result for called, result in self.calls if called is add]

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(2.0):
            while len(self.calls) < count:
                self.changed.clear()
                await self.changed.wait()


def _send(
    connection: BookieConnection, answers: Answers, adds: list[Add], timeout: float = 5.0
) -> None:
    frames = _frames_of([add.packed for add in adds])
    connection.send_adds(LEDGER, 0, KEY, answers.handler, adds, frames, timeout)


async def _flushed() -> None:
    """Let the connection's call_soon flush run."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


# --- batches_adds --------------------------------------------------------------------------------


async def test_batches_adds_follows_the_hello_answer_and_the_connection() -> None:
    """False before the HELLO answer, True once it lists add_entries, False after loss."""
    connection, _ = _connection()
    assert not connection.batches_adds
    _answer_hello(connection, FEATURES)
    assert connection.batches_adds
    connection.connection_lost(None)
    assert not connection.batches_adds
    await connection.close()


async def test_a_hello_answer_without_the_feature_means_no_batches() -> None:
    """An older bookie (no add_entries in its features): adds go one by one."""
    connection, _ = _connection()
    _answer_hello(connection, ("read_range", "long_poll", "fence"))
    assert not connection.batches_adds
    await connection.close()


async def test_a_refused_hello_means_no_batches() -> None:
    """A HELLO answered with an error status aborts: batches_adds stays False."""
    connection, transport = _connection()
    hello = HelloResponse(1, Status.UNAUTHORIZED, PROTOCOL_VERSION, "", 0, 0, ("add_entries",))
    connection.data_received(encode_frame(hello.to_body()))
    assert not connection.batches_adds
    assert transport.closed
    await connection.close()


# --- sending -------------------------------------------------------------------------------------


async def test_send_adds_writes_add_entries_frames_with_consecutive_request_ids() -> None:
    """A batch of 3 small and 2 large adds: frames as _frames_of cut them, request ids from
    2 (1 is HELLO's) in order across frames, every entry as given, in one write."""
    connection, transport = _batching()
    adds = _adds(0, 3) + _adds(3, 2, b"L" * 40_000)
    answers = Answers()
    _send(connection, answers, adds)
    await _flushed()
    assert len(transport.writes) == 1
    first, second = transport.requests()
    assert first == AddEntriesRequest(
        2, LEDGER, Flag.NONE, KEY, tuple(add.entry for add in adds[:4])
    )
    assert second == AddEntriesRequest(6, LEDGER, Flag.NONE, KEY, (adds[4].entry,))
    assert isinstance(first, AddEntriesRequest) and isinstance(second, AddEntriesRequest)
    split_ids = [add.request_id for add in first.split() + second.split()]
    assert split_ids == [2, 3, 4, 5, 6]
    assert not answers.calls
    await connection.close()


async def test_send_add_to_entries_joins_one_frame_until_another_request() -> None:
    """Single adds of one ledger join a frame; a READ_LAC in between closes it (order kept)."""
    connection, transport = _batching()
    answers = Answers()
    adds = _adds(0, 4)
    for add in adds[:2]:
        connection.send_add_to_entries(
            LEDGER, 0, KEY, add.packed, MethodType(answers.handler, add), 5.0
        )
    connection.send(Op.READ_LAC, (LEDGER, 0, None, -1, 0), lambda result: None, 5.0)
    for add in adds[2:]:
        connection.send_add_to_entries(
            LEDGER, 0, KEY, add.packed, MethodType(answers.handler, add), 5.0
        )
    await _flushed()
    assert transport.requests() == [
        AddEntriesRequest(2, LEDGER, Flag.NONE, KEY, (adds[0].entry, adds[1].entry)),
        ReadLacRequest(4, LEDGER, Flag.NONE, None, -1, 0),
        AddEntriesRequest(5, LEDGER, Flag.NONE, KEY, (adds[2].entry, adds[3].entry)),
    ]
    _answer(connection, AddEntriesResponse(2, Status.OK, LEDGER, 0, 2))
    _answer(connection, AddEntriesResponse(5, Status.OK, LEDGER, 2, 2))
    assert [(add.entry.entry_id, result) for add, result in answers.calls] == [
        (0, None), (1, None), (2, None), (3, None),
    ]  # fmt: skip
    await connection.close()


async def test_an_entry_above_max_frame_bytes_fails_its_adds_only() -> None:
    """send_adds: a frame the encoder refuses fails its adds with the encoder's error; the
    other frames go out."""
    connection, transport = _batching(ClientConfig(max_frame_bytes=100_000))
    answers = Answers()
    adds = _adds(0, 2) + _adds(2, 1, b"H" * 150_000) + _adds(3, 1)
    _send(connection, answers, adds)
    await answers.wait_for(1)
    await _flushed()
    assert [add.entry.entry_id for add, _ in answers.calls] == [2]
    error = answers.calls[0][1]
    assert isinstance(error, RequestRefusedError) and "max_frame_bytes=100000" in str(error)
    assert [request.request_id for request in transport.requests()] == [2, 5]
    _answer(connection, AddEntryResponse(2, Status.OK, LEDGER, 0))
    _answer(connection, AddEntriesResponse(3, Status.OK, LEDGER, 1, 1))
    _answer(connection, AddEntryResponse(5, Status.OK, LEDGER, 3))
    assert [result for _, result in answers.calls[1:]] == [None, None, None]
    await connection.close()


# --- answers -------------------------------------------------------------------------------------


async def test_an_ok_answer_calls_every_handler_once() -> None:
    """One ADD_ENTRIES OK for the whole batch: handler(add, None) once per add, in order; a
    repeated answer calls nobody again."""
    connection, _ = _batching()
    answers = Answers()
    adds = _adds(10, 6)
    _send(connection, answers, adds)
    _answer(connection, AddEntriesResponse(2, Status.OK, LEDGER, 10, 6))
    assert answers.calls == [(add, None) for add in adds]
    _answer(connection, AddEntriesResponse(2, Status.OK, LEDGER, 10, 6))
    assert len(answers.calls) == 6
    await connection.close()


async def test_the_bookies_fixed_width_answer_takes_the_fast_path() -> None:
    """The 43-byte frame the bookie packs answers every add of its range."""
    connection, _ = _batching()
    answers = Answers()
    adds = _adds(0, 4)
    _send(connection, answers, adds)
    frame = struct.pack(">IBBBQBBQBQBQ", 39, 0x96, 11, 0xCF, 3, 0, 0xCF, LEDGER, 0xCF, 1, 0xCF, 3)
    connection.data_received(frame)
    assert answers.calls == [(add, None) for add in adds[1:]]
    await connection.close()


async def test_answers_in_parts_and_mixed_kinds_answer_each_add_once() -> None:
    """Runs and single ADD_ENTRY answers in any order: each add answered once, with its own
    result; adds of no answer wait."""
    connection, _ = _batching()
    answers = Answers()
    adds = _adds(0, 6)
    _send(connection, answers, adds)
    _answer(
        connection,
        AddEntriesResponse(5, Status.OK, LEDGER, 3, 2),
        AddEntryResponse(4, Status.BAD_DIGEST, LEDGER, 2),
        AddEntriesResponse(2, Status.OK, LEDGER, 0, 2),
    )
    assert [(add.entry.entry_id, result is None) for add, result in answers.calls] == [
        (3, True), (4, True), (2, False), (0, True), (1, True),
    ]  # fmt: skip
    assert all(len(answers.of(add)) == 1 for add in adds[:5])
    assert answers.of(adds[5]) == []
    await connection.close()


async def test_an_error_answer_gives_each_add_its_mapped_error() -> None:
    """ADD_ENTRIES with FENCED: each add gets a LedgerFencedError naming its own entry."""
    connection, _ = _batching()
    answers = Answers()
    adds = _adds(20, 4)
    _send(connection, answers, adds)
    _answer(connection, AddEntriesResponse(2, Status.FENCED, LEDGER, 20, 4))
    assert [add for add, _ in answers.calls] == adds
    for add, error in answers.calls:
        assert isinstance(error, LedgerFencedError)
        assert f"entry {add.entry.entry_id} " in str(error)
    await connection.close()


async def test_a_bad_request_answer_is_a_refusal_of_the_add_itself() -> None:
    """BAD_REQUEST to an add (above the bookie's max_entry_bytes), as ADD_ENTRIES or ADD_ENTRY
    answer: a RequestRefusedError (a ProtocolError) per add, which a ledger handle does not
    take for a failed bookie; the connection stays up."""
    connection, transport = _batching()
    answers = Answers()
    adds = _adds(0, 3)
    _send(connection, answers, adds)
    _answer(
        connection,
        AddEntriesResponse(2, Status.BAD_REQUEST, LEDGER, 0, 2),
        AddEntryResponse(4, Status.BAD_REQUEST, LEDGER, 2),
    )
    assert [add for add, _ in answers.calls] == adds
    for add, error in answers.calls:
        assert isinstance(error, RequestRefusedError) and isinstance(error, ProtocolError)
        assert f"entry {add.entry.entry_id} failed with BAD_REQUEST" in str(error)
        assert "max_entry_bytes" in str(error)
    assert not transport.closed
    await connection.close()


async def test_an_answer_whose_first_waiter_is_gone_still_answers_the_rest() -> None:
    """An OK answer for a range whose first add timed out (no waiter): the decoded path
    answers the adds that still wait."""
    connection, _ = _batching()
    answers = Answers()
    adds = _adds(0, 3)
    _send(connection, answers, adds)
    _answer(connection, AddEntryResponse(2, Status.OK, LEDGER, 0))
    _answer(connection, AddEntriesResponse(2, Status.OK, LEDGER, 0, 3))
    assert answers.calls == [(add, None) for add in adds]
    await connection.close()


@pytest.mark.parametrize("status", [Status.OK, Status.FENCED])
async def test_a_huge_count_answers_only_existing_waiters_and_returns(status: Status) -> None:
    """count = 2**40 from a broken bookie: returns at once, answers the batch's adds only (an
    earlier READ_LAC below the range keeps waiting), connection stays up."""
    connection, transport = _batching()
    other: list[Any] = []
    connection.send(Op.READ_LAC, (LEDGER, 0, None, -1, 0), other.append, 5.0)  # Request id 2.
    answers = Answers()
    adds = _adds(0, 3)
    _send(connection, answers, adds)  # Request ids 3..5.
    loop = asyncio.get_running_loop()
    started = loop.time()
    _answer(connection, AddEntriesResponse(3, status, LEDGER, 0, 2**40))
    assert loop.time() - started < 0.5
    assert [add for add, _ in answers.calls] == adds
    assert all((result is None) == (status is Status.OK) for _, result in answers.calls)
    assert other == []
    assert not transport.closed
    await connection.close()
    assert len(other) == 1 and isinstance(other[0], BookieUnavailableError)


async def test_unanswered_adds_time_out() -> None:
    """Adds of a batch with no answer fail with BKTimeoutError after their timeout; an add
    answered in time does not."""
    connection, _ = _batching()
    answers = Answers()
    adds = _adds(0, 4)
    _send(connection, answers, adds, timeout=0.05)
    _answer(connection, AddEntryResponse(3, Status.OK, LEDGER, 1))
    await answers.wait_for(4)
    assert answers.of(adds[1]) == [None]
    for add in (adds[0], adds[2], adds[3]):
        (error,) = answers.of(add)
        assert isinstance(error, BKTimeoutError)
    assert not connection._waiters
    await connection.close()


async def test_connection_loss_fails_pending_batch_adds() -> None:
    """connection_lost: every unanswered add of a batch gets BookieUnavailableError, once."""
    connection, _ = _batching()
    answers = Answers()
    adds = _adds(0, 5)
    _send(connection, answers, adds)
    _answer(connection, AddEntriesResponse(2, Status.OK, LEDGER, 0, 2))
    connection.connection_lost(ConnectionResetError("reset"))
    assert not connection.batches_adds
    assert answers.of(adds[0]) == [None] and answers.of(adds[1]) == [None]
    for add in adds[2:]:
        (error,) = answers.of(add)
        assert isinstance(error, BookieUnavailableError)
    await asyncio.sleep(0.06)  # A deadline tick: nothing is answered twice.
    assert len(answers.calls) == 5
    await connection.close()


# --- BookiePool ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Address:
    bookie_id: str
    host: str = "127.0.0.1"
    port: int = 1
    shard_count: int = 1


async def test_pool_add_entries_sends_only_on_a_batching_connection() -> None:
    """False (nothing sent) for an unknown bookie, a connection not made yet and one whose
    bookie lacks the feature; True and one frame for a connection that batches."""
    known = {"old": Address("old"), "new": Address("new")}
    pool = BookiePool(ClientConfig(), known.get)
    answers = Answers()
    adds = _adds(0, 2)
    frames = _frames_of([add.packed for add in adds])
    assert not pool.add_entries("nobody", LEDGER, False, KEY, answers.handler, adds, frames)
    assert not pool.add_entries("new", LEDGER, False, KEY, answers.handler, adds, frames)
    transports = {}
    for bookie_id, features in (("old", ("read_range",)), ("new", FEATURES)):
        connection = pool._connection(bookie_id, LEDGER)
        transports[bookie_id] = transport = FakeClientTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        _answer_hello(connection, features)
        transport.writes.clear()
    assert not pool.add_entries("old", LEDGER, False, KEY, answers.handler, adds, frames)
    assert pool.add_entries("new", LEDGER, True, KEY, answers.handler, adds, frames)
    await _flushed()
    assert transports["old"].writes == []
    (request,) = transports["new"].requests()
    assert request == AddEntriesRequest(
        2, LEDGER, Flag.RECOVERY_ADD, KEY, tuple(add.entry for add in adds)
    )
    assert answers.calls == []
    await pool.close()
    assert [type(result) for _, result in answers.calls] == [BookieUnavailableError] * 2


def test_batch_bytes_is_64_kib() -> None:
    """The frame budget both sides assume."""
    assert ADD_ENTRIES_BATCH_BYTES == 64 * 1024


async def test_when_writable_waits_for_resume_writing_or_the_connection_loss() -> None:
    """A paused transport: `when_writable` takes the callback and runs it once on
    resume_writing; a writable one says False; a lost connection runs the callbacks too."""
    connection, _ = _batching()
    calls: list[str] = []
    assert not connection.when_writable(lambda: calls.append("unexpected"))
    connection.pause_writing()
    assert connection.when_writable(lambda: calls.append("resumed"))
    connection.resume_writing()
    assert calls == ["resumed"]
    connection.resume_writing()
    assert calls == ["resumed"]
    connection.pause_writing()
    assert connection.when_writable(lambda: calls.append("lost"))
    connection.connection_lost(None)
    await asyncio.sleep(0)
    assert calls == ["resumed", "lost"]
    assert not connection.when_writable(lambda: calls.append("after loss"))
