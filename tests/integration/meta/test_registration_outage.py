"""A bookie whose registration lapsed while etcd was away says so (is_ready 503, not
registered) until it has registered again, then is ready again by itself."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from bkaio.testing.procs import etcd_binary
from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer
from tests.integration.autorecovery.helpers import wait_for

pytestmark = pytest.mark.skipif(etcd_binary() is None, reason="etcd not installed")


def _registered_gauge(admin_url: str) -> float:
    with urllib.request.urlopen(f"{admin_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    (value,) = [
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("bkaio_bookie_registered ")
    ]
    return value


def _is_ready(admin_url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"{admin_url}/api/v1/bookie/is_ready", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def test_a_bookie_is_not_ready_while_its_registration_is_gone(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(
        1, metadata_uri=etcd_server.uri, registration_ttl_seconds=3.0
    )
    admin_url = cluster[0].admin_url
    status, body = await asyncio.to_thread(_is_ready, admin_url)
    assert status == 200 and body["registered"] is True
    assert await asyncio.to_thread(_registered_gauge, admin_url) == 1.0

    async def answers(wanted: int) -> bool:
        return (await asyncio.to_thread(_is_ready, admin_url))[0] == wanted

    await asyncio.to_thread(etcd_server.stop)
    try:
        # Past the TTL with no refresh confirmed: the store drops the key (or may have).
        await wait_for(lambda: answers(503), 30.0, "is_ready answering 503 while etcd is away")
        status, body = await asyncio.to_thread(_is_ready, admin_url)
        assert body["registered"] is False
        assert await asyncio.to_thread(_registered_gauge, admin_url) == 0.0
    finally:
        await asyncio.to_thread(etcd_server.start)
    await wait_for(lambda: answers(200), 60.0, "is_ready answering 200 once registered again")
    await cluster.wait_until_registered(0)
    assert await asyncio.to_thread(_registered_gauge, admin_url) == 1.0
