"""TLS, mutual TLS and the HELLO auth token against real bookie processes."""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from pathlib import Path

import pytest

import bkaio
from bkaio.errors import BKError
from bkaio.protocol.messages import PROTOCOL_VERSION, HelloRequest, HelloResponse, PingRequest
from bkaio.protocol.status import Status
from bkaio.security.local_ca import generate_local_tls
from bkaio.security.tls import client_tls_context
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory
from tests.integration.bookie.raw_client import RawClient

from .conftest import Pki

TOKEN = "s3cret-token"


async def _raw_tls(cluster: BookieCluster, context: ssl.SSLContext | None) -> RawClient:
    bookie = cluster[0]
    reader, writer = await asyncio.open_connection(
        bookie.host,
        bookie.port,
        ssl=context,
        server_hostname=bookie.host if context is not None else None,
        limit=1 << 24,
    )
    return RawClient(reader, writer)


def _metric(cluster: BookieCluster, name: str) -> float:
    url, context = f"{cluster[0].admin_url}/metrics", cluster[0].admin_ssl
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_mutual_tls_and_token_end_to_end(
    bookie_cluster_factory: BookieClusterFactory, pki: Pki
) -> None:
    cluster = await bookie_cluster_factory(
        count=2,
        config={
            "tls": pki.tls_section(require_client_cert=True),
            "server": {"auth_token": TOKEN},
        },
    )
    context = client_tls_context(pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    async with bkaio.BookKeeper.connect(cluster.metadata_uri, tls=context, auth_token=TOKEN) as bk:
        handle = await bk.create_ledger(
            ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"pw"
        )
        payloads = [f"entry-{i}".encode() for i in range(20)]
        await asyncio.gather(*(handle.append(p) for p in payloads))
        await handle.close()
        reader = await bk.open_ledger(handle.ledger_id, password=b"pw", recovery=False)
        assert [e.payload for e in await reader.read(0, 19)] == payloads


async def test_tls_refuses_untrusted_peers_and_plain_tcp(
    bookie_cluster_factory: BookieClusterFactory, pki: Pki
) -> None:
    cluster = await bookie_cluster_factory(
        config={"tls": pki.tls_section(require_client_cert=True)}
    )
    # A client that trusts another CA refuses the bookie.
    with pytest.raises(ssl.SSLCertVerificationError):
        await _raw_tls(cluster, client_tls_context(pki.other_ca))
    # A client without a certificate gets nothing from a mutual-TLS bookie.
    no_cert = await _raw_tls(cluster, client_tls_context(pki.ca))
    with pytest.raises((ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)):
        await no_cert.hello()
    await no_cert.close()
    # Plain TCP to a TLS port: no protocol answer, the connection is closed.
    plain = await _raw_tls(cluster, None)
    with pytest.raises((ConnectionError, ssl.SSLError)):
        await plain.hello()
    await plain.close()
    # The bookie still serves a proper client.
    good = await _raw_tls(
        cluster, client_tls_context(pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    )
    response = await good.hello()
    assert isinstance(response, HelloResponse) and response.status is Status.OK
    assert (await good.request(PingRequest(good.next_id()))).status is Status.OK
    await good.close()
    assert cluster[0].running


async def test_wrong_token_gets_only_the_hello_error_slowly_and_is_counted(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(
        config={
            "server": {
                "auth_token": TOKEN,
                "auth_failure_delay_seconds": 0.05,
                "auth_failure_max_delay_seconds": 0.2,
            }
        }
    )
    for token in (None, "Zq9-guessed-token", TOKEN + "x"):
        client = await RawClient.connect(cluster[0].host, cluster[0].port, hello=False)
        # A request pipelined behind the bad HELLO is never executed or answered.
        client.send(HelloRequest(client.next_id(), PROTOCOL_VERSION, "raw-test", token))
        client.send(PingRequest(client.next_id()))
        response = await client.read_response()
        assert response.status is Status.UNAUTHORIZED and response.request_id == 1
        assert await client.closed_by_peer()
        assert client.pending == []  # Nothing but the HELLO error.
        await client.close()
    good = await RawClient.connect(cluster[0].host, cluster[0].port, hello=False)
    assert (await good.hello(token=TOKEN)).status is Status.OK
    await good.close()
    assert _metric(cluster, "bkaio_bookie_auth_failures_total") == 3
    assert _metric(cluster, 'bkaio_bookie_limit_hits_total{limit="auth_failure_delay"}') == 3
    # The token never reaches the bookie's log.
    assert "Zq9-guessed-token" not in cluster[0].log_path.read_text()


async def test_client_with_a_wrong_token_cannot_write(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(config={"server": {"auth_token": TOKEN}})
    async with bkaio.BookKeeper.connect(
        cluster.metadata_uri, auth_token="nope", add_timeout=2.0
    ) as bk:
        handle = await bk.create_ledger(
            ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"pw"
        )
        with pytest.raises(BKError):
            await handle.append(b"x")


async def test_local_ca_of_standalone_tls_serves_real_bookies(
    bookie_cluster_factory: BookieClusterFactory, tmp_path: Path
) -> None:
    local = await asyncio.to_thread(generate_local_tls, tmp_path / "standalone-tls")
    cluster = await bookie_cluster_factory(
        config={"tls": local.bookie_tls_section(require_client_cert=True)}
    )
    async with bkaio.BookKeeper.connect(cluster.metadata_uri, tls=local.client_context()) as bk:
        handle = await bk.create_ledger(
            ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"pw"
        )
        assert await handle.append(b"over tls") == 0
        await handle.close()
