"""BookieConnection without a network: deadlines per timeout value, add answers, one write."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from bkaio.errors import BKError, BKTimeoutError, BookieUnavailableError, LedgerFencedError
from bkaio.ledger_client.connections import BookieConnection
from bkaio.ledger_client.types import ClientConfig
from bkaio.protocol import (
    PROTOCOL_VERSION,
    AddEntryResponse,
    FrameEncoder,
    HelloResponse,
    Op,
    Status,
    encode_frame,
)
from tests.fixtures.transports import FakeClientTransport


def _connected() -> tuple[BookieConnection, FakeClientTransport]:
    connection = BookieConnection(
        bookie_id="b0", host="127.0.0.1", port=1, shard_index=0, config=ClientConfig()
    )
    transport = FakeClientTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def _add_body(entry_id: int) -> list[Any]:
    return [int(Op.ADD_ENTRY), 0, 5, entry_id, 0, b"k" * 32, -1, 10, 0, b"payload"]


async def test_requests_expire_in_order_and_answered_ones_never() -> None:
    connection, _transport = _connected()
    results: dict[str, BKError | None] = {}
    first_expired = asyncio.Event()

    def recorder(name: str) -> Any:
        def record(result: BKError | None) -> None:
            results.setdefault(name, result)
            if name == "add0":
                first_expired.set()

        return record

    for entry_id in range(3):
        connection.send_body(_add_body(entry_id), recorder(f"add{entry_id}"), 0.01)
    connection.send(Op.READ_LAC, (5, 0, None, -1, 0), recorder("long"), 30.0)
    encoder = FrameEncoder()
    encoder.add(AddEntryResponse(3, Status.OK, 5, 1))  # Request id 1 is HELLO's.
    encoder.add(AddEntryResponse(4, Status.FENCED, 5, 2))
    connection.data_received(encoder.take())
    assert results["add1"] is None
    assert isinstance(results["add2"], LedgerFencedError)
    await asyncio.wait_for(first_expired.wait(), 5.0)
    assert isinstance(results["add0"], BKTimeoutError)
    assert results.keys() == {"add0", "add1", "add2"}  # The 30 s request is still waiting.
    await connection.close()
    assert "long" in results


async def test_frames_of_one_iteration_go_out_in_one_write() -> None:
    connection, transport = _connected()
    transport.writes.clear()
    for entry_id in range(50):
        connection.send_body(_add_body(entry_id), lambda result: None, 5.0)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(transport.writes) == 1
    await connection.close()


def _connected_with(config: ClientConfig) -> tuple[BookieConnection, FakeClientTransport]:
    connection = BookieConnection(
        bookie_id="b0", host="127.0.0.1", port=1, shard_index=0, config=config
    )
    transport = FakeClientTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(  # HELLO (request id 1) answered: only the adds are left.
        encode_frame(HelloResponse(1, Status.OK, PROTOCOL_VERSION, "b0", 0, 1, ()).to_body())
    )
    return connection, transport


class Results:
    """Records each request's result and the loop time it arrived."""

    def __init__(self) -> None:
        self.results: dict[str, BKError | None] = {}
        self.at: dict[str, float] = {}
        self.order: list[str] = []
        self.changed = asyncio.Event()

    def callback(self, name: str) -> Any:
        def record(result: BKError | None) -> None:
            self.results[name] = result
            self.at[name] = time.monotonic()
            self.order.append(name)
            self.changed.set()

        return record

    async def wait_for(self, *names: str) -> None:
        while not all(name in self.results for name in names):
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 5.0)


async def test_adds_of_one_iteration_share_one_deadline_record_and_expire_in_order() -> None:
    connection, _transport = _connected_with(ClientConfig())
    seen = Results()
    for entry_id in range(20):
        connection.send_body(_add_body(entry_id), seen.callback(f"add{entry_id}"), 0.05)
    assert len(connection._deadlines[0.05]) == 1  # One record for the 20 requests.
    encoder = FrameEncoder()
    for request_id in (3, 10, 21):  # Entries 0, 7 and 18 answered in time.
        encoder.add(AddEntryResponse(request_id, Status.OK, 5, request_id - 3))
    connection.data_received(encoder.take())
    await seen.wait_for(*(f"add{i}" for i in range(20)))
    answered = {"add1", "add8", "add19"}
    assert {name for name, result in seen.results.items() if result is None} == answered
    expired = [name for name in seen.order if name not in answered]
    assert expired == [f"add{i}" for i in range(20) if f"add{i}" not in answered]
    assert all(isinstance(seen.results[name], BKTimeoutError) for name in expired)
    await connection.close()


async def test_other_timeouts_in_the_same_iteration_keep_their_own_deadlines() -> None:
    connection, _transport = _connected_with(ClientConfig())
    seen = Results()
    connection.send_body(_add_body(0), seen.callback("add0"), 0.05)
    connection.send_body(_add_body(1), seen.callback("add1"), 0.05)
    connection.send(Op.READ_LAC, (5, 0, None, -1, 0), seen.callback("read"), 30.0)
    connection.send_body(_add_body(2), seen.callback("add2"), 0.05)
    await seen.wait_for("add0", "add1", "add2")
    assert seen.order == ["add0", "add1", "add2"]
    assert "read" not in seen.results  # Between the adds' request ids, with its own 30 s.
    await connection.close()
    assert isinstance(seen.results["read"], BookieUnavailableError)


async def test_no_request_of_a_batch_expires_before_its_own_timeout() -> None:
    connection, _transport = _connected_with(ClientConfig())
    seen = Results()
    connection.send_body(_add_body(0), seen.callback("first"), 0.2)
    # Blocking on purpose: still the same loop iteration, so the second add joins the record.
    time.sleep(0.15)  # noqa: ASYNC251
    sent_second = time.monotonic()
    connection.send_body(_add_body(1), seen.callback("second"), 0.2)
    await seen.wait_for("first", "second")
    assert seen.at["second"] - sent_second >= 0.2
    assert isinstance(seen.results["second"], BKTimeoutError)
    await connection.close()


async def test_a_later_iteration_gets_a_later_deadline() -> None:
    connection, _transport = _connected_with(ClientConfig())
    seen = Results()
    connection.send_body(_add_body(0), seen.callback("early"), 0.3)
    await asyncio.sleep(0.25)
    connection.send_body(_add_body(1), seen.callback("late"), 0.3)
    await seen.wait_for("early")
    assert "late" not in seen.results
    await seen.wait_for("late")
    assert seen.at["late"] - seen.at["early"] >= 0.15
    await connection.close()


async def test_no_hello_reply_aborts_the_connection_and_fails_the_queued_adds() -> None:
    config = ClientConfig(connect_timeout=0.1, add_timeout=30.0)
    connection = BookieConnection(
        bookie_id="b0", host="127.0.0.1", port=1, shard_index=0, config=config
    )
    transport = FakeClientTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    seen = Results()
    for entry_id in range(3):  # Batched after HELLO, with a deadline far beyond its own.
        connection.send_body(_add_body(entry_id), seen.callback(f"add{entry_id}"), 30.0)
    await seen.wait_for("add0", "add1", "add2")
    assert transport.closed
    for name in ("add0", "add1", "add2"):
        error = seen.results[name]
        assert isinstance(error, BKTimeoutError) and "no HELLO reply" in str(error)
    await connection.close()


class _MillisecondLoopClock:
    """The running loop as uvloop's clock shows it: `time()` is whole milliseconds of the
    precise clock the test sets (`precise`), so it reads up to 1 ms behind; everything else is
    the real loop's."""

    def __init__(self, loop: asyncio.AbstractEventLoop, precise: float) -> None:
        self._loop = loop
        self.precise = precise

    def time(self) -> float:
        return math.floor(self.precise * 1000) / 1000

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


async def test_no_request_expires_before_its_timeout_on_the_precise_clock() -> None:
    # The fresh-clone CI of 4e6e5cd saw a request expire 5 us before its 0.2 s timeout on
    # uvloop: stamped just before a millisecond ended, its deadline counted from that
    # millisecond's start.
    connection, _transport = _connected_with(ClientConfig())
    clock = _MillisecondLoopClock(asyncio.get_running_loop(), precise=1000.0009)
    connection._loop = clock  # type: ignore[assignment]
    seen = Results()
    connection.send_body(_add_body(0), seen.callback("add"), 0.25)
    await asyncio.sleep(0)  # The flush: the request's deadline record is stamped.
    await asyncio.sleep(0)
    clock.precise = 1000.0009 + 0.25 - 0.0001  # The loop clock reads 1000.25.
    connection._expire()
    assert "add" not in seen.results  # Its 0.25 s have not passed yet.
    clock.precise = 1000.0009 + 0.25 + 0.003
    connection._expire()
    assert isinstance(seen.results["add"], BKTimeoutError)
    await connection.close()
