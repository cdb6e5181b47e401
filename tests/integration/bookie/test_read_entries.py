"""READ_ENTRIES against a real bookie with the raw protocol client: the feature in HELLO,
ranges and strides with the bookie's own limits, long polls that answer with the entries up to
the LAC, and the errors (unknown ledger, bad flags)."""

from __future__ import annotations

import asyncio

from bkaio.protocol import (
    I64_MAX,
    READ_ENTRIES_FEATURE,
    ErrorResponse,
    Flag,
    HelloResponse,
    ReadEntriesRequest,
    ReadEntriesResponse,
    ReadLacRequest,
    Status,
    WriteLacRequest,
)
from bkaio.protocol.records import scan_records
from tests.fixtures.bookies import BookieClusterFactory
from tests.integration.bookie.raw_client import FIRST_SIGHT, MASTER_KEY, RawClient, add_request

LEDGER = 6


def read(
    client: RawClient,
    first: int,
    last: int,
    *,
    stride: int = 1,
    max_count: int = 1000,
    max_bytes: int = 1 << 20,
    flags: Flag = Flag.NONE,
    previous_lac: int = -1,
    timeout_ms: int = 0,
) -> ReadEntriesRequest:
    return ReadEntriesRequest(
        client.next_id(), LEDGER, first, last, stride, max_count, max_bytes, flags,
        previous_lac, timeout_ms,
    )  # fmt: skip


def found(response: object, first: int, last: int, stride: int = 1) -> tuple[list[int], int]:
    assert isinstance(response, ReadEntriesResponse) and response.status is Status.OK, response
    scan = scan_records(response.records_bytes, LEDGER, first, stride, last)
    assert scan.problem is None and not scan.corrupt
    assert scan.payloads == [b"payload %d" % e for e in scan.entry_ids]
    return scan.entry_ids, response.next_entry_id


async def add(client: RawClient, entry_id: int, lac: int) -> None:
    request = add_request(client.next_id(), LEDGER, entry_id, b"payload %d" % entry_id, lac=lac)
    assert (await client.request(request)).status is Status.OK


async def test_ranges_strides_and_the_bookies_limits(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    config = {**FIRST_SIGHT, "server": {**FIRST_SIGHT["server"], "max_read_range_count": 5}}
    cluster = await bookie_cluster_factory(config=config)
    client = await RawClient.connect(cluster[0].host, cluster[0].port, hello=False)
    hello = await client.hello()
    assert isinstance(hello, HelloResponse) and READ_ENTRIES_FEATURE in hello.features
    for entry_id in (0, 1, 2, 3, 5, 6, 7, 8, 9):  # 4 is missing here.
        await add(client, entry_id, entry_id - 1)
    assert found(await client.request(read(client, 0, 3)), 0, 3) == ([0, 1, 2, 3], 4)
    # The bookie's limit (5 entries) cuts the answer; next_entry_id says where to go on.
    assert found(await client.request(read(client, 0, 9)), 0, 9) == ([0, 1, 2, 3, 5], 6)
    assert found(await client.request(read(client, 1, 9, stride=2)), 1, 9, 2) == (
        [1, 3, 5, 7, 9],
        10,
    )
    answer = await client.request(read(client, 0, 9, max_bytes=20))  # 9-10 bytes each.
    assert found(answer, 0, 9) == ([0, 1], 2)
    other = ReadEntriesRequest(client.next_id(), 99, 0, 3, 1, 10, 100, Flag.NONE, -1, 0)
    missing = await client.request(other)
    assert missing.status is Status.NO_SUCH_LEDGER
    await client.close()


async def test_a_long_poll_answers_with_the_entries_up_to_the_lac(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(config=FIRST_SIGHT)
    writer = await RawClient.connect(cluster[0].host, cluster[0].port)
    reader = await RawClient.connect(cluster[0].host, cluster[0].port)
    poll = Flag.LONG_POLL
    # No ledger yet: the poll waits for it, then answers at its timeout with the LAC alone.
    timed_out = await reader.request(read(reader, 0, I64_MAX, flags=poll, timeout_ms=100))
    assert found(timed_out, 0, I64_MAX) == ([], 0)
    assert isinstance(timed_out, ReadEntriesResponse) and timed_out.lac == -1
    await add(writer, 0, -1)
    await add(writer, 1, -1)
    reader.send(read(reader, 0, I64_MAX, flags=poll, previous_lac=-1, timeout_ms=30_000))
    await reader.writer.drain()
    await asyncio.sleep(0.2)
    assert not reader.pending  # Entries 0 and 1 are there, but not confirmed.
    await add(writer, 2, 1)  # Piggybacks LAC 1: the poll answers with 0 and 1, not 2.
    woken = await reader.read_response(timeout_seconds=5.0)
    assert found(woken, 0, I64_MAX) == ([0, 1], 2)
    assert isinstance(woken, ReadEntriesResponse) and woken.lac == 1
    # An explicit LAC moves it too; entries already past it answer at once.
    reader.send(read(reader, 2, I64_MAX, flags=poll, previous_lac=1, timeout_ms=30_000))
    await reader.writer.drain()
    written = await writer.request(WriteLacRequest(writer.next_id(), LEDGER, MASTER_KEY, 2))
    assert written.status is Status.OK
    assert found(await reader.read_response(timeout_seconds=5.0), 2, I64_MAX) == ([2], 3)
    at_once = await reader.request(read(reader, 0, 5, flags=poll, previous_lac=0))
    assert found(at_once, 0, 5) == ([0, 1, 2], 3)
    await writer.close()
    await reader.close()


async def test_long_polls_count_against_their_connections_bound_with_lac_polls(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    config = {**FIRST_SIGHT, "server": {**FIRST_SIGHT["server"]}}
    config["server"]["max_long_poll_waiters_per_connection"] = 2
    cluster = await bookie_cluster_factory(config=config)
    greedy = await RawClient.connect(cluster[0].host, cluster[0].port)
    other = await RawClient.connect(cluster[0].host, cluster[0].port)
    poll = Flag.LONG_POLL
    # A READ_LAC poll and a READ_ENTRIES poll wait on this connection: its bound.
    greedy.send(ReadLacRequest(greedy.next_id(), LEDGER, poll, None, -1, 30_000))
    greedy.send(read(greedy, 0, I64_MAX, flags=poll, timeout_ms=30_000))
    await greedy.writer.drain()
    await asyncio.sleep(0.2)
    assert not greedy.pending  # Both wait.
    refused = await greedy.request(read(greedy, 0, I64_MAX, flags=poll, timeout_ms=30_000))
    assert refused.status is Status.TOO_MANY_REQUESTS
    # Another connection has its own slots: its poll waits (answered at its timeout).
    answered = await other.request(read(other, 0, I64_MAX, flags=poll, timeout_ms=200))
    assert found(answered, 0, I64_MAX) == ([], 0)
    await greedy.close()
    await other.close()


async def test_flags_other_than_long_poll_are_a_bad_request(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(config=FIRST_SIGHT)
    client = await RawClient.connect(cluster[0].host, cluster[0].port)
    body = read(client, 0, 3).to_body()
    body[8] = int(Flag.FENCE)
    answer = await client.request(body)
    assert isinstance(answer, ErrorResponse | ReadEntriesResponse)
    assert answer.status is Status.BAD_REQUEST
    assert await client.closed_by_peer()
    await client.close()
