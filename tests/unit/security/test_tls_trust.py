"""Which certificates a client context trusts: with a CA file, that CA's and no others."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme

from bkaio.config import TlsConfig, build_bookie_config
from bkaio.errors import ConfigError
from bkaio.security.tls import bookie_client_tls_context, client_tls_context


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext, host: str) -> None:
    """A TLS handshake in memory; raises ssl.SSLError when either side refuses."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(to_client, to_server, server_hostname=host)
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    done = {client_side: False, server_side: False}
    for _ in range(20):
        for side in (client_side, server_side):
            if done[side]:
                continue
            try:
                side.do_handshake()
                done[side] = True
            except ssl.SSLWantReadError:
                pass
        if all(done.values()):
            return
    raise AssertionError("the handshake did not finish")


@pytest.fixture
def cas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, trustme.CA]:
    """The cluster's CA file, and another CA that the system store trusts (SSL_CERT_FILE is
    where OpenSSL's default store is read from)."""
    ours, public = trustme.CA(), trustme.CA()
    ours.cert_pem.write_to_path(str(tmp_path / "ours.pem"))
    public.cert_pem.write_to_path(str(tmp_path / "public.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "public.pem"))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    return tmp_path / "ours.pem", public


def _server(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(context)
    return context


def test_a_ca_file_replaces_the_system_store(cas: tuple[Path, trustme.CA]) -> None:
    ca_file, public = cas
    # A bookie impostor with a certificate for the bookie's host from a publicly trusted CA.
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(client_tls_context(ca_file), _server(public), "localhost")
    tls = TlsConfig(enabled=True, cert_file="/c.pem", key_file="/k.pem", ca_file=str(ca_file))
    bookie_as_client = bookie_client_tls_context(tls)
    assert bookie_as_client is not None
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(bookie_as_client, _server(public), "localhost")


def test_without_a_ca_file_the_system_store_is_used(cas: tuple[Path, trustme.CA]) -> None:
    _, public = cas
    _handshake(client_tls_context(), _server(public), "localhost")
    with pytest.raises(ssl.SSLCertVerificationError):  # The host name is checked all the same.
        _handshake(client_tls_context(), _server(public), "bookie.example")


def test_mutual_tls_without_tls_is_refused(tmp_path: Path) -> None:
    """require_client_cert with TLS off would serve plain TCP to anybody: a config error."""
    with pytest.raises(ConfigError, match=r"needs tls\.enabled"):
        TlsConfig(require_client_cert=True, ca_file=str(tmp_path / "ca.pem"))
    data = {
        "bookie": {"shards": 1},
        "storage": {"ledger_dirs": [str(tmp_path)]},
        "tls": {"require_client_cert": True, "ca_file": str(tmp_path / "ca.pem")},
    }
    with pytest.raises(ConfigError, match=r"needs tls\.enabled"):
        build_bookie_config(data, env={})
