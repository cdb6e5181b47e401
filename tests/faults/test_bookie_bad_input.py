"""Hostile and broken clients: each gets an error or a close; a good client is unaffected."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import msgpack
import pytest

from bkaio.protocol.messages import (
    ErrorResponse,
    HelloResponse,
    Op,
    PingRequest,
)
from bkaio.protocol.status import Status
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory
from tests.integration.bookie.raw_client import RawClient, add_request


@pytest.fixture
async def guarded(
    bookie_cluster_factory: BookieClusterFactory,
) -> AsyncIterator[tuple[BookieCluster, RawClient]]:
    """A bookie with short deadlines and a canary client that keeps adding throughout."""
    cluster = await bookie_cluster_factory(
        config={
            "server": {
                "frame_read_timeout_seconds": 1.0,
                "hello_timeout_seconds": 1.0,
                "ledger_key_check": "first_sight",
            }
        }
    )
    canary = await RawClient.connect(cluster[0].host, cluster[0].port)
    yield cluster, canary
    # The canary still works, and the bookie process never restarted.
    for entry_id in range(3):
        request = add_request(canary.next_id(), 77, entry_id, b"canary")
        assert (await canary.request(request)).status is Status.OK
    assert cluster[0].running
    await canary.close()


async def _raw(cluster: BookieCluster, hello: bool = True) -> RawClient:
    return await RawClient.connect(cluster[0].host, cluster[0].port, hello=hello)


async def test_garbage_bytes_get_an_error_and_a_close(
    guarded: tuple[BookieCluster, RawClient],
) -> None:
    cluster, _ = guarded
    client = await _raw(cluster)
    client.send_raw(struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1")
    response = await client.read_response()
    assert isinstance(response, ErrorResponse) and response.status is Status.BAD_REQUEST
    assert await client.closed_by_peer()
    await client.close()


async def test_huge_length_prefix_is_refused_before_the_body(
    guarded: tuple[BookieCluster, RawClient],
) -> None:
    cluster, _ = guarded
    client = await _raw(cluster)
    client.send_raw(struct.pack(">I", 0xFFFFFFFF) + b"abc")
    response = await client.read_response()
    assert isinstance(response, ErrorResponse) and response.status is Status.BAD_REQUEST
    assert "max_frame_bytes" in response.message
    assert await client.closed_by_peer()
    await client.close()


@pytest.mark.parametrize(
    "body",
    [
        [Op.ADD_ENTRY, 5, "ledger", 0, 0, b"k", -1, 1, 0, b"x"],  # str for an int
        [Op.READ_ENTRY, 6, 1, 0],  # too short
        [Op.PING, 7, True],  # too long
        [99, 8],  # unknown op
    ],
)
async def test_malformed_requests_get_bad_request(
    guarded: tuple[BookieCluster, RawClient], body: list[object]
) -> None:
    cluster, _ = guarded
    client = await _raw(cluster)
    client.send_raw(_frame(body))
    response = await client.read_response()
    assert response.status is Status.BAD_REQUEST
    assert response.request_id == body[1]
    assert await client.closed_by_peer()
    await client.close()


async def test_requests_before_hello_and_bad_versions(
    guarded: tuple[BookieCluster, RawClient],
) -> None:
    cluster, _ = guarded
    client = await _raw(cluster, hello=False)
    response = await client.request(PingRequest(1))
    assert response.status is Status.BAD_REQUEST
    assert await client.closed_by_peer()
    await client.close()
    client = await _raw(cluster, hello=False)
    response = await client.hello(version=99)
    assert isinstance(response, HelloResponse) and response.status is Status.UNSUPPORTED_VERSION
    assert await client.closed_by_peer()
    await client.close()


async def test_slow_loris_half_frame_is_closed_at_the_deadline(
    guarded: tuple[BookieCluster, RawClient],
) -> None:
    cluster, canary = guarded
    client = await _raw(cluster)
    frame = _frame(PingRequest(3).to_body())
    client.send_raw(frame[:3])
    await asyncio.sleep(0.3)
    assert (await canary.request(PingRequest(canary.next_id()))).status is Status.OK
    assert await client.closed_by_peer(timeout_seconds=10.0)
    await client.close()
    silent = await _raw(cluster, hello=False)  # Never says HELLO.
    assert await silent.closed_by_peer(timeout_seconds=10.0)
    await silent.close()


def _frame(body: list[object]) -> bytes:
    packed: bytes = msgpack.packb(body)
    return struct.pack(">I", len(packed)) + packed
