"""etcd with client and peer TLS, client certificates and RBAC limited to bkaio's prefix."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from bkaio.errors import BKError
from bkaio.meta import initialise_cluster_at, open_metadata
from bkaio.meta.ledger_metadata import LedgerMetadata
from bkaio.testing.procs import LOOPBACK, etcd_binary, free_port, kill_process, wait_for_port

ROOT = "/bkaio-sec"


@dataclass(frozen=True)
class SecureEtcd:
    endpoint: str
    ca: Path
    cert: Path
    key: Path

    def tls_args(self) -> list[str]:
        return [
            f"--endpoints=https://{self.endpoint}",
            f"--cacert={self.ca}",
            f"--cert={self.cert}",
            f"--key={self.key}",
        ]

    def uri(self, *, user: str | None = "bkaio", password: str = "bk-pw", root: str = ROOT) -> str:
        query = f"ca={self.ca}&cert={self.cert}&key={self.key}&timeout=3&retry_seconds=1"
        if user is not None:
            query += f"&user={user}&password={password}"
        return f"etcd://{self.endpoint}{root}?{query}"


def _etcdctl(etcd: SecureEtcd, *args: str, user: str | None = None) -> str:
    command = ["etcdctl", *etcd.tls_args(), *([f"--user={user}"] if user else []), *args]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=30,
        env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


@pytest.fixture
def secure_etcd_process(tmp_path: Path) -> Iterator[SecureEtcd]:
    binary = etcd_binary()
    if binary is None or shutil.which("etcdctl") is None:
        pytest.skip("etcd and etcdctl are needed (apt-get install etcd-server etcd-client)")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("bkaio-client")
    pki = tmp_path / "pki"
    pki.mkdir()
    paths = {name: pki / name for name in ("ca.pem", "s.pem", "s.key", "c.pem", "c.key")}
    ca.cert_pem.write_to_path(str(paths["ca.pem"]))
    server.cert_chain_pems[0].write_to_path(str(paths["s.pem"]))
    server.private_key_pem.write_to_path(str(paths["s.key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["c.pem"]))
    client.private_key_pem.write_to_path(str(paths["c.key"]))
    client_port, peer_port = free_port(), free_port()
    client_url = f"https://{LOOPBACK}:{client_port}"
    peer_url = f"https://{LOOPBACK}:{peer_port}"
    tls = [
        f"--cert-file={paths['s.pem']}",
        f"--key-file={paths['s.key']}",
        f"--trusted-ca-file={paths['ca.pem']}",
        "--client-cert-auth",
        f"--peer-cert-file={paths['s.pem']}",
        f"--peer-key-file={paths['s.key']}",
        f"--peer-trusted-ca-file={paths['ca.pem']}",
        "--peer-client-cert-auth",
    ]
    command = [
        binary,
        "--name=bkaio-sec",
        f"--data-dir={tmp_path / 'etcd-data'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=bkaio-sec={peer_url}",
        "--heartbeat-interval=20",
        "--election-timeout=200",
        "--log-level=error",
        "--logger=zap",
        *tls,
    ]
    with (tmp_path / "etcd.log").open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        wait_for_port(LOOPBACK, client_port, timeout_seconds=15, process=process)
        etcd = SecureEtcd(
            f"{LOOPBACK}:{client_port}", paths["ca.pem"], paths["c.pem"], paths["c.key"]
        )
        deadline = time.monotonic() + 15
        while True:  # The port opens before a leader is elected.
            try:
                _etcdctl(etcd, "endpoint", "health")
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        _etcdctl(etcd, "user", "add", "root:root-pw")
        _etcdctl(etcd, "user", "grant-role", "root", "root")
        _etcdctl(etcd, "role", "add", "bkaio")
        _etcdctl(etcd, "role", "grant-permission", "bkaio", "--prefix=true", "readwrite", ROOT)
        _etcdctl(etcd, "user", "add", "bkaio:bk-pw")
        _etcdctl(etcd, "user", "grant-role", "bkaio", "bkaio")
        _etcdctl(etcd, "auth", "enable")
        yield etcd
    finally:
        kill_process(process)


@pytest.fixture
async def secure_etcd(secure_etcd_process: SecureEtcd) -> SecureEtcd:
    """The secured etcd with a cluster initialised as the bkaio user, in its prefix."""
    await initialise_cluster_at(secure_etcd_process.uri())
    return secure_etcd_process


async def test_metadata_over_tls_with_a_user_limited_to_the_prefix(
    secure_etcd: SecureEtcd,
) -> None:
    meta = await open_metadata(secure_etcd.uri())
    try:
        created = await meta.ledgers.create(
            LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1, ensembles=((0, ("b",)),))
        )
        assert (await meta.ledgers.get(created.ledger_id)).ensembles == ((0, ("b",)),)
    finally:
        await meta.close()
    # The bkaio user reads its prefix and nothing else.
    listed = _etcdctl(secure_etcd, "get", "--prefix", "--keys-only", ROOT, user="bkaio:bk-pw")
    assert f"{ROOT}/ledgers/" in listed
    with pytest.raises(RuntimeError, match="permission denied"):
        _etcdctl(secure_etcd, "put", "/elsewhere", "x", user="bkaio:bk-pw")
    with pytest.raises(RuntimeError, match="permission denied"):
        _etcdctl(secure_etcd, "get", "/", "--prefix", user="bkaio:bk-pw")


@pytest.mark.parametrize(
    "variant", ["wrong_password", "no_user", "outside_prefix", "no_tls", "no_client_cert"]
)
async def test_metadata_access_is_refused_without_the_right_credentials(
    secure_etcd: SecureEtcd, variant: str
) -> None:
    uris = {
        "wrong_password": secure_etcd.uri(password="guess"),
        "no_user": secure_etcd.uri(user=None),
        "outside_prefix": secure_etcd.uri(root="/other"),
        "no_tls": f"etcd://{secure_etcd.endpoint}{ROOT}?user=bkaio&password=bk-pw&timeout=2"
        "&retry_seconds=1",
        "no_client_cert": f"etcd://{secure_etcd.endpoint}{ROOT}?ca={secure_etcd.ca}"
        "&user=bkaio&password=bk-pw&timeout=2&retry_seconds=1",
    }
    with pytest.raises(BKError):
        meta = await open_metadata(uris[variant])
        try:
            await meta.ledgers.create(
                LedgerMetadata(
                    ensemble_size=1, write_quorum=1, ack_quorum=1, ensembles=((0, ("b",)),)
                )
            )
        finally:
            await meta.close()
