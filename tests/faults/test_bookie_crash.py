"""Bookie crashes and shutdowns with real processes and a real etcd."""

from __future__ import annotations

import asyncio
import contextlib

from bkaio.protocol.messages import AddEntryResponse, Flag, ReadRangeRequest, ReadRangeResponse
from bkaio.protocol.status import Status
from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer
from tests.integration.bookie.raw_client import FIRST_SIGHT, RawClient, add_request


async def test_kill9_during_adds_loses_no_acknowledged_entry(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(metadata_uri=etcd_server.uri, config=FIRST_SIGHT)
    bookie = cluster[0]
    client = await RawClient.connect(bookie.host, bookie.port)
    ledger_id, payload = 9, b"p" * 512
    acknowledged: set[int] = set()
    enough = asyncio.Event()

    async def write() -> None:
        entry_id = 0
        while True:
            batch = [
                add_request(client.next_id(), ledger_id, e, payload)
                for e in range(entry_id, entry_id + 50)
            ]
            ids = {r.request_id: r.entry_id for r in batch}
            for request in batch:
                client.send(request)
            await client.writer.drain()
            for _ in batch:
                response = await client.read_response()
                assert isinstance(response, AddEntryResponse)
                if response.status is Status.OK:
                    acknowledged.add(ids[response.request_id])
            if len(acknowledged) >= 500:
                enough.set()
            entry_id += 50

    writer = asyncio.create_task(write())
    await enough.wait()
    cluster.kill9(0)
    with contextlib.suppress(ConnectionError, OSError, TimeoutError):
        await writer
    await client.close()
    await cluster.start(0)
    client = await RawClient.connect(bookie.host, bookie.port)
    response = await client.request(
        ReadRangeRequest(client.next_id(), ledger_id, 0, 100_000, 64 << 20, Flag.NONE, None)
    )
    assert isinstance(response, ReadRangeResponse) and response.status is Status.OK
    stored = {e.entry_id: e.payload for e in response.entries}
    assert acknowledged <= set(stored), sorted(acknowledged - set(stored))[:10]
    assert all(stored[e] == payload for e in acknowledged)
    await client.close()


async def test_lease_expiry_removes_a_killed_bookie(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(
        count=2, metadata_uri=etcd_server.uri, config=FIRST_SIGHT
    )
    assert set(await cluster.registered()) == set(cluster.bookie_ids)
    cluster.kill9(0)
    await cluster.wait_until_deregistered(0, timeout_seconds=15)
    assert set(await cluster.registered()) == {cluster[1].bookie_id}


async def test_sigterm_drains_cleanly_and_deregisters(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(
        shards=2, metadata_uri=etcd_server.uri, config=FIRST_SIGHT
    )
    bookie = cluster[0]
    client = await RawClient.connect(bookie.host, bookie.port)
    requests = [add_request(client.next_id(), 0, e, b"z" * 100) for e in range(2000)]
    for request in requests:
        client.send(request)
    await client.writer.drain()
    stopping = asyncio.create_task(cluster.stop(0))
    answered = 0
    try:
        while answered < len(requests):
            response = await client.read_response()
            assert response.status is Status.OK, response
            answered += 1
    except ConnectionError:
        pass  # Requests the bookie had not read yet when it stopped reading get no answer.
    assert await stopping == 0
    assert bookie.bookie_id not in await cluster.registered()
    await client.close()
