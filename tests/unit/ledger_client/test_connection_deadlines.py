"""BookieConnection without a network: deadlines per timeout value, add answers, one write."""

from __future__ import annotations

import asyncio
from typing import Any

from bkaio.errors import BKError, BKTimeoutError, LedgerFencedError
from bkaio.ledger_client.connections import BookieConnection
from bkaio.ledger_client.types import ClientConfig
from bkaio.protocol import AddEntryResponse, FrameEncoder, Op, Status


class FakeTransport:
    """Records writes; enough of asyncio.Transport for BookieConnection."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def _connected() -> tuple[BookieConnection, FakeTransport]:
    connection = BookieConnection(
        bookie_id="b0", host="127.0.0.1", port=1, shard_index=0, config=ClientConfig()
    )
    transport = FakeTransport()
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
