"""A stream writer's backpressure is the ledger handle's: writes beyond the handle's bound
(max_outstanding_adds + max_queued_adds), whether held during a roll or sent at once, are
refused with TooManyRequestsError and the writer goes on; what it accepted lands, in order."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.errors import TooManyRequestsError
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.stream import StreamPosition, open_namespace
from bkaio.stream.namespace import Namespace
from bkaio.stream.reader import StreamReader
from bkaio.stream.writer import StreamWriter
from tests.unit.stream.conftest import ClientFactory

# What one ledger handle takes at once: two adds in flight, three queued behind them.
LIMITS = {"max_outstanding_adds": 2, "max_queued_adds": 3}
BOUND = 5


async def small_writer(make_client: ClientFactory) -> tuple[BookKeeper, Namespace, StreamWriter]:
    bk = await make_client(**LIMITS)
    ns = await open_namespace(bk, "tenant", create=True)
    return bk, ns, await ns.open_writer("log", roll_bytes=10)


async def read_all(ns: Namespace, count: int) -> list[bytes]:
    payloads: list[bytes] = []
    reader: StreamReader
    async with await ns.open_reader("log") as reader, asyncio.timeout(10):
        async for record in reader:
            payloads.append(record.payload)
            if len(payloads) == count:
                break
    return payloads


async def test_writes_held_during_a_roll_beyond_the_bound_are_refused_and_the_writer_goes_on(
    make_client: ClientFactory,
) -> None:
    _, ns, writer = await small_writer(make_client)
    first = writer.write(b"0123456789")  # Fills the segment: a roll starts.
    held = [writer.write(b"%d" % i) for i in range(BOUND)]  # Held until the roll ends.
    for _ in range(3):
        with pytest.raises(TooManyRequestsError, match="wait_for_capacity"):
            writer.write(b"one too many")
    async with asyncio.timeout(10):
        positions = await asyncio.gather(first, *held)
        later = await writer.write(b"after")  # The refusals did not fail the writer.
    assert [p.seq for p in positions] == list(range(BOUND + 1))
    assert positions[1].ledger_id != positions[0].ledger_id  # Held went to the new ledger.
    assert later.seq == BOUND + 1
    await writer.close()
    expected = [b"0123456789", *(b"%d" % i for i in range(BOUND)), b"after"]
    assert await read_all(ns, len(expected)) == expected


async def test_held_writes_beyond_what_the_new_ledger_takes_are_sent_as_room_frees(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer holds more than the new ledger takes at once (its bound raised past the
    handle's here): the re-send sends what fits, keeps the rest, and sends it as adds complete."""
    _, ns, writer = await small_writer(make_client)
    monkeypatch.setattr(writer, "_max_held", 3 * BOUND, raising=False)
    first = writer.write(b"0123456789")  # Fills the segment: a roll starts.
    held = [writer.write(b"%d" % (i % 10)) for i in range(9)]  # 9 bytes: no second roll.
    async with asyncio.timeout(10):
        positions = await asyncio.gather(first, *held)
        await writer.flush()
        later = await writer.write(b"x")
    assert [p.seq for p in positions] == list(range(10))
    assert len({p.ledger_id for p in positions[1:]}) == 1
    assert later.seq == 10
    await writer.close()
    expected = [b"0123456789", *(b"%d" % (i % 10) for i in range(9)), b"x"]
    assert await read_all(ns, len(expected)) == expected


async def test_writes_beyond_the_ledgers_bound_are_refused_without_failing_the_writer(
    make_client: ClientFactory,
) -> None:
    _, ns, writer = await small_writer(make_client)
    accepted = [writer.write(b"%d" % i) for i in range(BOUND)]  # Two sent, three queued.
    with pytest.raises(TooManyRequestsError, match="wait_for_capacity"):
        writer.write(b"one too many")
    async with asyncio.timeout(10):
        positions = await asyncio.gather(*accepted)
        later = await writer.write(b"5")
    assert [p.seq for p in [*positions, later]] == list(range(BOUND + 1))
    await writer.close()
    assert await read_all(ns, BOUND + 1) == [b"%d" % i for i in range(BOUND + 1)]


async def test_wait_for_capacity_waits_out_a_roll_and_the_ledgers_queue(
    make_client: ClientFactory,
) -> None:
    _, ns, writer = await small_writer(make_client)
    futures: list[asyncio.Future[StreamPosition]] = [writer.write(b"0123456789")]  # Rolls.
    futures += [writer.write(b"%d" % i) for i in range(BOUND)]  # Held: as many as allowed.
    async with asyncio.timeout(10):
        for i in range(20):  # Each write goes once there is room: none is refused.
            await writer.wait_for_capacity()
            futures.append(writer.write(b"w%02d" % i))
        positions = await asyncio.gather(*futures)
    assert [p.seq for p in positions] == list(range(len(futures)))
    await writer.close()
    expected = [
        b"0123456789",
        *(b"%d" % i for i in range(BOUND)),
        *(b"w%02d" % i for i in range(20)),
    ]
    assert await read_all(ns, len(expected)) == expected
