"""A real bookie process, driven over the wire with the raw protocol client."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from bkaio.protocol.digest import master_key
from bkaio.protocol.messages import (
    AddEntryResponse,
    Flag,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    PingRequest,
    ReadEntryRequest,
    ReadEntryResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    WireEntry,
    WriteLacRequest,
)
from bkaio.protocol.status import Status
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory, running_on_own_loop

from .raw_client import FIRST_SIGHT, MASTER_KEY, RawClient, add_request


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieCluster]:
    """One bookie started once for the tests that use ledgers no other test of it uses (7, 3, 5)
    and assert nothing bookie-wide; the tests of shards, bounds, disk usage and counters start
    their own. On an event loop of its own: the tests' loops are per test."""
    base = tmp_path_factory.mktemp("bookie-server")
    cluster = BookieCluster(f"sqlite://{base / 'meta.db'}", base, config=FIRST_SIGHT)
    with running_on_own_loop(cluster):
        yield cluster


async def _ok(client: RawClient, request: Any) -> None:
    response = await client.request(request)
    assert response.status is Status.OK, response


def _http(url: str, method: str = "GET", body: Any = None, token: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


async def test_pipelined_adds_on_one_connection_are_all_readable(shared: BookieCluster) -> None:
    bookie = shared[0]
    client = await RawClient.connect(bookie.host, bookie.port)
    ledger_id, count, payload = 7, 10_000, b"x" * 100
    requests = [
        add_request(client.next_id(), ledger_id, entry_id, payload, lac=entry_id - 1)
        for entry_id in range(count)
    ]
    responses = await client.pipeline(requests)
    assert all(
        isinstance(r, AddEntryResponse) and r.status is Status.OK for r in responses.values()
    )
    entries: list[WireEntry] = []
    while len(entries) < count:
        response = await client.request(
            ReadRangeRequest(
                client.next_id(), ledger_id, len(entries), 1000, 1 << 20, Flag.NONE, None
            )
        )
        assert isinstance(response, ReadRangeResponse) and response.status is Status.OK, response
        entries.extend(response.entries)
    assert [e.entry_id for e in entries] == list(range(count))
    assert all(e.payload == payload for e in entries)
    last = await client.request(ReadEntryRequest(client.next_id(), ledger_id, -1, Flag.NONE, None))
    assert isinstance(last, ReadEntryResponse) and last.entry_id == count - 1
    assert last.lac == count - 2
    listed = await client.request(ListEntriesRequest(client.next_id(), ledger_id))
    assert isinstance(listed, ListEntriesResponse) and listed.ranges == ((0, count - 1),)
    await client.close()


async def test_two_shards_route_by_ledger_id(bookie_cluster_factory: BookieClusterFactory) -> None:
    cluster = await bookie_cluster_factory(shards=2, config=FIRST_SIGHT)
    bookie = cluster[0]
    shard0 = await RawClient.connect(bookie.host, bookie.shard_port(0))
    shard1 = await RawClient.connect(bookie.host, bookie.shard_port(1))
    for ledger_id in (10, 11):
        owner, other = (shard0, shard1) if ledger_id % 2 == 0 else (shard1, shard0)
        ok = await owner.request(add_request(owner.next_id(), ledger_id, 0, b"a"))
        assert ok.status is Status.OK, ok
        wrong = await other.request(add_request(other.next_id(), ledger_id, 0, b"a"))
        assert wrong.status is Status.WRONG_SHARD, wrong
        read = await other.request(ReadEntryRequest(other.next_id(), ledger_id, 0, Flag.NONE, None))
        assert read.status is Status.WRONG_SHARD, read
    info = await shard1.request(GetBookieInfoRequest(shard1.next_id()))
    assert isinstance(info, GetBookieInfoResponse)
    assert (info.shard_index, info.shard_count, info.read_only) == (1, 2, False)
    assert info.total_bytes > 0
    await shard0.close()
    await shard1.close()


async def test_fencing_wrong_keys_and_digests(shared: BookieCluster) -> None:
    client = await RawClient.connect(shared[0].host, shared[0].port)
    ledger_id = 3
    assert (
        await client.request(add_request(client.next_id(), ledger_id, 0, b"e0"))
    ).status is Status.OK
    other_key = master_key(b"not the password", 0)
    wrong = await client.request(add_request(client.next_id(), ledger_id, 1, b"e1", key=other_key))
    assert wrong.status is Status.UNAUTHORIZED
    bad_digest = await client.request(add_request(client.next_id(), ledger_id, 1, b"e1", digest=1))
    assert bad_digest.status is Status.BAD_DIGEST
    missing = await client.request(
        ReadEntryRequest(client.next_id(), ledger_id, 1, Flag.NONE, None)
    )
    assert missing.status is Status.NO_SUCH_ENTRY
    # A fencing read with the wrong key is refused and fences nothing.
    refused = await client.request(
        ReadEntryRequest(client.next_id(), ledger_id, -1, Flag.FENCE, other_key)
    )
    assert refused.status is Status.UNAUTHORIZED
    assert (
        await client.request(add_request(client.next_id(), ledger_id, 1, b"e1"))
    ).status is Status.OK
    fenced = await client.request(
        ReadLacRequest(client.next_id(), ledger_id, Flag.FENCE, MASTER_KEY, -1, 0)
    )
    assert isinstance(fenced, ReadLacResponse) and fenced.status is Status.OK
    assert fenced.last_entry_id == 1
    after = await client.request(add_request(client.next_id(), ledger_id, 2, b"e2"))
    assert after.status is Status.FENCED
    recovery = await client.request(
        add_request(client.next_id(), ledger_id, 2, b"e2", flags=Flag.RECOVERY_ADD)
    )
    assert recovery.status is Status.OK
    await client.close()


async def test_long_poll_read_lac(shared: BookieCluster) -> None:
    writer = await RawClient.connect(shared[0].host, shared[0].port)
    reader = await RawClient.connect(shared[0].host, shared[0].port)
    ledger_id = 5
    assert (
        await writer.request(add_request(writer.next_id(), ledger_id, 0, b"a"))
    ).status is Status.OK
    # Nothing beyond LAC -1 arrives: the poll answers at its timeout with the current LAC.
    timed_out = await reader.request(
        ReadLacRequest(reader.next_id(), ledger_id, Flag.LONG_POLL, None, -1, 200)
    )
    assert isinstance(timed_out, ReadLacResponse) and timed_out.lac == -1
    reader.send(ReadLacRequest(reader.next_id(), ledger_id, Flag.LONG_POLL, None, -1, 30_000))
    await reader.writer.drain()
    await asyncio.sleep(0.2)
    assert not reader.pending
    # Entry 1 piggybacks LAC 0: the poll wakes at once.
    assert (
        await writer.request(add_request(writer.next_id(), ledger_id, 1, b"b", lac=0))
    ).status is Status.OK
    woken = await reader.read_response(timeout_seconds=5.0)
    assert isinstance(woken, ReadLacResponse) and woken.status is Status.OK and woken.lac == 0
    # WRITE_LAC wakes pollers too.
    reader.send(ReadLacRequest(reader.next_id(), ledger_id, Flag.LONG_POLL, None, 0, 30_000))
    await reader.writer.drain()
    written = await writer.request(WriteLacRequest(writer.next_id(), ledger_id, MASTER_KEY, 1))
    assert written.status is Status.OK
    woken = await reader.read_response(timeout_seconds=5.0)
    assert isinstance(woken, ReadLacResponse) and woken.lac == 1
    await writer.close()
    await reader.close()


async def test_long_polls_are_bounded_per_connection(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    config = {**FIRST_SIGHT, "server": {**FIRST_SIGHT["server"]}}
    config["server"]["max_long_poll_waiters_per_connection"] = 2
    cluster = await bookie_cluster_factory(config=config)
    greedy = await RawClient.connect(cluster[0].host, cluster[0].port)
    other = await RawClient.connect(cluster[0].host, cluster[0].port)
    for ledger_id in (5, 6):  # Two polls wait on this connection: its bound.
        greedy.send(ReadLacRequest(greedy.next_id(), ledger_id, Flag.LONG_POLL, None, -1, 30_000))
    await greedy.writer.drain()
    await asyncio.sleep(0.2)
    refused = await greedy.request(
        ReadLacRequest(greedy.next_id(), 7, Flag.LONG_POLL, None, -1, 30_000)
    )
    assert refused.status is Status.TOO_MANY_REQUESTS
    # Another connection still has its own slots: it waits (answered at its timeout).
    answered = await other.request(
        ReadLacRequest(other.next_id(), 7, Flag.LONG_POLL, None, -1, 200)
    )
    assert isinstance(answered, ReadLacResponse) and answered.status is Status.OK
    await greedy.close()
    await other.close()


async def test_read_only_flips_on_injected_disk_usage(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    """A disk that reports itself full (the Disk seam, through the test entry point)."""
    cluster = await bookie_cluster_factory(config=FIRST_SIGHT, fake_disk_usage=True)
    client = await RawClient.connect(cluster[0].host, cluster[0].port)
    await _ok(client, add_request(client.next_id(), 1, 0, b"a"))
    cluster.set_disk_usage(0, 0.99)
    await cluster.wait_until_registered(0, read_only=True, timeout_seconds=10)
    refused = await client.request(add_request(client.next_id(), 1, 1, b"b"))
    assert refused.status is Status.READ_ONLY
    read = await client.request(ReadEntryRequest(client.next_id(), 1, 0, Flag.NONE, None))
    assert read.status is Status.OK
    recovery = await client.request(
        add_request(client.next_id(), 1, 1, b"b", flags=Flag.RECOVERY_ADD)
    )
    assert recovery.status is Status.OK
    cluster.set_disk_usage(0, 0.5)
    await cluster.wait_until_registered(0, read_only=False, timeout_seconds=10)
    await _ok(client, add_request(client.next_id(), 1, 2, b"c"))
    await client.close()


async def test_admin_http(bookie_cluster_factory: BookieClusterFactory) -> None:
    cluster = await bookie_cluster_factory(config=FIRST_SIGHT)
    bookie = cluster[0]
    client = await RawClient.connect(bookie.host, bookie.port)
    await _ok(client, add_request(client.next_id(), 2, 0, b"a"))
    await _ok(client, PingRequest(client.next_id()))
    status, body = await asyncio.to_thread(_http, bookie.admin_url + "/heartbeat")
    assert status == 200 and body.strip() == b"OK"
    status, body = await asyncio.to_thread(_http, bookie.admin_url + "/metrics")
    text = body.decode()
    assert status == 200
    assert 'bkaio_bookie_request_seconds_count{op="add_entry",success="true"} 1.0' in text
    assert "bkaio_journal_syncs_total" in text
    status, body = await asyncio.to_thread(_http, bookie.admin_url + "/api/v1/bookie/info")
    info = json.loads(body)
    assert status == 200 and info["bookie_id"] == bookie.bookie_id and info["total_bytes"] > 0
    url = bookie.admin_url + "/api/v1/bookie/state"
    status, _ = await asyncio.to_thread(_http, url, "PUT", {"read_only": True})
    assert status == 401
    status, _ = await asyncio.to_thread(_http, url, "PUT", {"read_only": True}, "wrong")
    assert status == 403
    status, _ = await asyncio.to_thread(
        _http, url, "PUT", {"read_only": "yes"}, cluster.admin_token
    )
    assert status == 400
    status, body = await asyncio.to_thread(
        _http, url, "PUT", {"read_only": True}, cluster.admin_token
    )
    assert status == 200 and json.loads(body)["read_only"] is True
    await cluster.wait_until_registered(0, read_only=True, timeout_seconds=10)
    refused = await client.request(add_request(client.next_id(), 2, 1, b"b"))
    assert refused.status is Status.READ_ONLY
    status, body = await asyncio.to_thread(
        _http, url, "PUT", {"read_only": False}, cluster.admin_token
    )
    assert status == 200 and json.loads(body)["read_only"] is False
    await cluster.wait_until_registered(0, read_only=False, timeout_seconds=10)
    await client.close()
