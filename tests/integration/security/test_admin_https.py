"""A bookie with TLS serves its admin API over HTTPS only (admin.tls "auto"), registers an
https:// admin URL, and every client of that API in bkaio reaches it with the cluster CA:
`bkaio bookie info`, the master-key requests of autorecovery and `bkaio shell recover`."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import bkaio
from bkaio.autorecovery import ReplicationError
from bkaio.autorecovery.cluster import ClusterView, MasterKeys, key_matches
from bkaio.security.tls import client_tls_context
from tests.fixtures.bookies import BookieClusterFactory

from .conftest import Pki

BKAIO = str(Path(sys.executable).parent / "bkaio")


def _get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        return int(response.status), response.read()


def _bkaio(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BKAIO, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
        check=False,
    )


async def test_a_tls_bookie_serves_its_admin_api_over_https_only(
    bookie_cluster_factory: BookieClusterFactory, pki: Pki
) -> None:
    cluster = await bookie_cluster_factory(
        config={"tls": pki.tls_section(require_client_cert=True)}
    )
    bookie = cluster[0]
    (info,) = (await cluster.registered()).values()
    assert info.admin_url == f"https://127.0.0.1:{bookie.admin_port}"

    trusted = client_tls_context(pki.ca)  # Server authentication only: no client certificate.
    status, body = await asyncio.to_thread(_get, f"{info.admin_url}/api/v1/bookie/info", trusted)
    assert status == 200 and json.loads(body)["admin_url"] == info.admin_url
    status, body = await asyncio.to_thread(_get, f"{info.admin_url}/metrics", trusted)
    assert status == 200 and b"bkaio_" in body  # What Prometheus scrapes, with the CA.

    # Plain HTTP gets no answer at all, and a client that trusts another CA refuses the bookie.
    plain = f"http://127.0.0.1:{bookie.admin_port}/api/v1/bookie/info"
    with pytest.raises((OSError, http.client.HTTPException)):
        await asyncio.to_thread(_get, plain)
    with pytest.raises(urllib.error.URLError) as untrusted:
        await asyncio.to_thread(_get, info.admin_url + "/health", client_tls_context(pki.other_ca))
    assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)

    # `bkaio bookie info` asks the running bookie's /status over HTTPS with its [tls] CA.
    shown = await asyncio.to_thread(
        _bkaio, "bookie", "info", "--config", str(bookie.config_path), "--json"
    )
    assert shown.returncode == 0, shown.stderr
    described: dict[str, Any] = json.loads(shown.stdout)
    assert described["admin"] == info.admin_url
    assert described["status"] is not None and described["status"]["healthy"] is True


async def test_master_keys_and_shell_recover_use_https_with_the_cluster_ca(
    bookie_cluster_factory: BookieClusterFactory, pki: Pki
) -> None:
    cluster = await bookie_cluster_factory(
        count=3,
        config={
            "tls": pki.tls_section(require_client_cert=True),
            "autorecovery": {"enabled": False},  # Only the command acts.
        },
    )
    context = client_tls_context(pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    async with bkaio.BookKeeper.connect(cluster.metadata_uri, tls=context) as bk:
        handle = await bk.create_ledger(
            ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"pw"
        )
        payloads = [f"entry-{i}".encode() for i in range(20)]
        await asyncio.gather(*(handle.append(p) for p in payloads))
        await handle.close()
    meta = await cluster.metadata()
    metadata = await meta.ledgers.get(handle.ledger_id)

    # Autorecovery learns the ledger's master key from the bookies' HTTPS admin APIs; a
    # process without TLS is refused at once, told what to set.
    view = ClusterView(meta, tls=context)
    await view.start()
    with_tls = MasterKeys(view, cluster.admin_token, tls=context)
    without_tls = MasterKeys(view, cluster.admin_token)
    try:
        key = await with_tls.master_key(metadata)
        assert key is not None and key_matches(metadata, key)
        with pytest.raises(ReplicationError, match=r"serves HTTPS.*BKAIO_TLS_CA"):
            await without_tls.master_key(metadata)
    finally:
        await with_tls.close()
        await without_tls.close()
        await view.close()

    # `bkaio shell recover` of a dead bookie copies its fragments over TLS, the master key
    # fetched over HTTPS with $BKAIO_TLS_CA.
    target = metadata.ensembles[0][1][0]
    index = cluster.bookie_ids.index(target)
    cluster.kill9(index)
    await cluster.wait_until_deregistered(index)
    env = {
        "BKAIO_TLS_CA": str(pki.ca),
        "BKAIO_TLS_CERT": str(pki.client_cert),
        "BKAIO_TLS_KEY": str(pki.client_key),
    }
    token = ("--admin-token", cluster.admin_token, "--metadata", cluster.metadata_uri)
    recovered = await asyncio.to_thread(
        _bkaio, "shell", "recover", target, "--recover-timeout", "60", "--json", *token, env=env
    )
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    after = await meta.ledgers.get(handle.ledger_id)
    assert all(target not in ensemble for _, ensemble in after.ensembles), after


# Where autorecovery runs: in the bookies, in `bkaio autorecovery`, in `python -m
# bkaio.autorecovery` (the latter two take TLS from $BKAIO_TLS_*).
_FAST = {
    "lost_bookie_delay_seconds": 0.0,
    "auditor_lease_ttl_seconds": 2.0,
    "worker_lease_ttl_seconds": 2.0,
    "retry_backoff_seconds": 0.5,
    "poll_interval_seconds": 0.5,
}
_COMMANDS = {
    "bkaio": [BKAIO, "autorecovery"],
    "module": [sys.executable, "-m", "bkaio.autorecovery"],
}


@pytest.mark.parametrize("runner", ["bookie", "bkaio", "module"])
async def test_autorecovery_repairs_a_tls_cluster_over_https_admin_apis(
    bookie_cluster_factory: BookieClusterFactory, pki: Pki, runner: str
) -> None:
    autorecovery = {"enabled": True, **_FAST} if runner == "bookie" else {"enabled": False}
    cluster = await bookie_cluster_factory(
        count=3,
        config={
            "tls": {
                **pki.tls_section(require_client_cert=True),
                "client_cert_file": str(pki.client_cert),
                "client_key_file": str(pki.client_key),
            },
            "autorecovery": autorecovery,
        },
    )
    context = client_tls_context(pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    async with bkaio.BookKeeper.connect(cluster.metadata_uri, tls=context) as bk:
        handle = await bk.create_ledger(
            ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"pw"
        )
        await asyncio.gather(*(handle.append(b"entry-%d" % i) for i in range(20)))
        await handle.close()
    meta = await cluster.metadata()
    target = (await meta.ledgers.get(handle.ledger_id)).ensembles[0][1][0]
    env = {
        **os.environ,
        "BKAIO_TLS_CA": str(pki.ca),
        "BKAIO_TLS_CERT": str(pki.client_cert),
        "BKAIO_TLS_KEY": str(pki.client_key),
        "BKAIO_ADMIN_TOKEN": cluster.admin_token,
    }
    log_path = cluster.base_dir / "autorecovery.log"
    process = None
    if runner in _COMMANDS:
        with log_path.open("wb") as log_file:
            process = await asyncio.create_subprocess_exec(
                *_COMMANDS[runner],
                "--metadata",
                cluster.metadata_uri,
                "--lost-bookie-delay",
                "0",
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
            )
    index = cluster.bookie_ids.index(target)

    def logs() -> str:
        if process is None:
            return "\n".join(b.log_tail(30) for i, b in enumerate(cluster.bookies) if i != index)
        return log_path.read_text()[-4000:]

    try:
        cluster.kill9(index)
        await cluster.wait_until_deregistered(index)
        deadline = asyncio.get_running_loop().time() + 90.0
        while True:
            ensembles = (await meta.ledgers.get(handle.ledger_id)).ensembles
            if all(target not in ensemble for _, ensemble in ensembles):
                break
            assert process is None or process.returncode is None, logs()
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"not re-replicated:\n{logs()}")
            await asyncio.sleep(0.2)
    finally:
        if process is not None:
            if process.returncode is None:
                process.terminate()
            await asyncio.wait_for(process.wait(), 30)


def _admin_call(
    url: str, context: ssl.SSLContext, token: str, method: str = "GET", body: Any = None
) -> Any:
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return json.loads(response.read())


async def test_a_recover_job_started_over_https_reaches_the_tls_bookies(
    bookie_cluster_factory: BookieClusterFactory, pki: Pki
) -> None:
    # PUT /api/v1/autorecovery/bookie runs the recovery in the bookie: it reaches the other
    # bookies (client port and HTTPS admin API) with its own [tls] client side.
    cluster = await bookie_cluster_factory(
        count=3,
        config={
            "tls": {
                **pki.tls_section(require_client_cert=True),
                "client_cert_file": str(pki.client_cert),
                "client_key_file": str(pki.client_key),
            },
            "autorecovery": {"enabled": False},
        },
    )
    context = client_tls_context(pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    async with bkaio.BookKeeper.connect(cluster.metadata_uri, tls=context) as bk:
        handle = await bk.create_ledger(
            ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"pw"
        )
        await asyncio.gather(*(handle.append(b"entry-%d" % i) for i in range(20)))
        await handle.close()
    meta = await cluster.metadata()
    target = (await meta.ledgers.get(handle.ledger_id)).ensembles[0][1][0]
    index = cluster.bookie_ids.index(target)
    cluster.kill9(index)
    await cluster.wait_until_deregistered(index)
    asked = cluster[(index + 1) % 3]
    admin = client_tls_context(pki.ca)
    base = f"{asked.admin_url}/api/v1/autorecovery"
    job = await asyncio.to_thread(
        _admin_call, f"{base}/bookie", admin, cluster.admin_token, "PUT", {"bookie_src": target}
    )
    deadline = asyncio.get_running_loop().time() + 90.0
    while job["state"] == "running":
        assert asyncio.get_running_loop().time() < deadline, job
        await asyncio.sleep(0.2)
        job = await asyncio.to_thread(
            _admin_call, f"{base}/jobs?id={job['id']}", admin, cluster.admin_token
        )
    assert job["state"] == "done", job
    after = await meta.ledgers.get(handle.ledger_id)
    assert all(target not in ensemble for _, ensemble in after.ensembles), after
