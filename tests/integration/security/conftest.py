"""Throw-away certificates (trustme, made per test, never committed) for the security tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # A CA that signed nothing here: trusting it must fail.

    def tls_section(self, *, require_client_cert: bool = False) -> dict[str, object]:
        return {
            "enabled": True,
            "cert_file": str(self.cert),
            "key_file": str(self.key),
            "ca_file": str(self.ca),
            "require_client_cert": require_client_cert,
        }


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    directory = tmp_path / "pki"
    directory.mkdir()
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client.bkaio.test")
    pki = Pki(
        ca=directory / "ca.pem",
        cert=directory / "bookie.pem",
        key=directory / "bookie.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        other_ca=directory / "other-ca.pem",
    )
    ca.cert_pem.write_to_path(str(pki.ca))
    server.cert_chain_pems[0].write_to_path(str(pki.cert))
    server.private_key_pem.write_to_path(str(pki.key))
    client.cert_chain_pems[0].write_to_path(str(pki.client_cert))
    client.private_key_pem.write_to_path(str(pki.client_key))
    trustme.CA().cert_pem.write_to_path(str(pki.other_ca))
    return pki
