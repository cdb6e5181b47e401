"""TLS contexts (certificates from trustme, made in the test) and the local CA for standalone."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme

from bkaio.config import TlsConfig, build_bookie_config
from bkaio.errors import ConfigError
from bkaio.security.local_ca import generate_local_tls
from bkaio.security.tls import (
    bookie_client_tls_context,
    client_tls_context,
    server_tls_context,
    server_tls_context_from_config,
)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@bkaio")
    files = {
        "ca": tmp_path / "ca.pem",
        "cert": tmp_path / "server.pem",
        "key": tmp_path / "server.key",
        "client_cert": tmp_path / "client.pem",
        "client_key": tmp_path / "client.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    return files


def test_server_context_needs_tls_1_2_and_optionally_client_certs(pki: dict[str, Path]) -> None:
    plain = server_tls_context(pki["cert"], pki["key"])
    assert plain.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert plain.verify_mode == ssl.CERT_NONE
    mutual = server_tls_context(
        pki["cert"], pki["key"], ca_file=pki["ca"], require_client_cert=True, min_version="1.3"
    )
    assert mutual.verify_mode == ssl.CERT_REQUIRED
    assert mutual.minimum_version == ssl.TLSVersion.TLSv1_3


def test_client_context_verifies_by_default(pki: dict[str, Path]) -> None:
    context = client_tls_context(pki["ca"])
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    with_cert = client_tls_context(
        pki["ca"], cert_file=pki["client_cert"], key_file=pki["client_key"]
    )
    assert with_cert.verify_mode == ssl.CERT_REQUIRED


def test_bad_files_are_config_errors(pki: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        server_tls_context(tmp_path / "missing.pem", pki["key"])
    with pytest.raises(ConfigError, match="cannot be loaded"):
        server_tls_context(pki["cert"], pki["client_key"])  # Key of another certificate.
    with pytest.raises(ConfigError, match="needs a CA file"):
        server_tls_context(pki["cert"], pki["key"], require_client_cert=True)
    with pytest.raises(ConfigError, match="go together"):
        client_tls_context(pki["ca"], cert_file=pki["client_cert"])
    with pytest.raises(ConfigError, match="min_version"):
        client_tls_context(pki["ca"], min_version="1.0")
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        client_tls_context(tmp_path / "junk.pem")


def test_tls_section_of_the_bookie_config(pki: dict[str, Path]) -> None:
    tls = {
        "enabled": True,
        "cert_file": str(pki["cert"]),
        "key_file": str(pki["key"]),
        "ca_file": str(pki["ca"]),
        "require_client_cert": True,
        "client_cert_file": str(pki["client_cert"]),
        "client_key_file": str(pki["client_key"]),
    }
    data = {"bookie": {"shards": 1}, "storage": {"ledger_dirs": ["/tmp/x"]}, "tls": tls}
    config = build_bookie_config(data, env={})
    assert config.tls.enabled and config.tls.require_client_cert
    server = server_tls_context_from_config(config.tls)
    assert server is not None and server.verify_mode == ssl.CERT_REQUIRED
    client = bookie_client_tls_context(config.tls)
    assert client is not None and client.check_hostname
    assert server_tls_context_from_config(TlsConfig()) is None
    assert bookie_client_tls_context(TlsConfig()) is None


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"enabled": True}, "needs tls.cert_file and tls.key_file"),
        ({"require_client_cert": True}, "needs tls.ca_file"),
        ({"min_version": "1.1"}, "must be 1.2 or 1.3"),
        ({"client_cert_file": "/x.pem"}, "go together"),
    ],
)
def test_bad_tls_sections_are_refused(section: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_bookie_config({"bookie": {"shards": 1}, "tls": section}, env={})


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"ledger_key_check": "trust_me"}, "metadata|first_sight"),
        ({"auth_failure_delay_seconds": 9.0}, "auth_failure_delay_seconds"),
        ({"max_entry_bytes": 0}, "max_entry_bytes"),
        ({"write_buffer_high_bytes": -1}, "write_buffer_high_bytes"),
    ],
)
def test_bad_security_server_options_are_refused(server: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_bookie_config({"bookie": {"shards": 1}, "server": server}, env={})


def test_local_ca_makes_files_that_load_and_are_reused(tmp_path: Path) -> None:
    local = generate_local_tls(tmp_path / "tls", hosts=["bookie-1.example"])
    assert local.key_file.stat().st_mode & 0o077 == 0  # Private keys are owner-only.
    assert local.client_key_file.stat().st_mode & 0o077 == 0
    server = server_tls_context(
        local.cert_file, local.key_file, ca_file=local.ca_file, require_client_cert=True
    )
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert local.client_context().verify_mode == ssl.CERT_REQUIRED
    assert local.client_context(with_client_cert=False).check_hostname
    before = local.ca_file.read_bytes()
    again = generate_local_tls(tmp_path / "tls")
    assert again.ca_file.read_bytes() == before
    snippet = local.bookie_toml(require_client_cert=True)
    assert "[tls]" in snippet and "require_client_cert = true" in snippet
    assert local.bookie_tls_section()["cert_file"] == str(local.cert_file)
    import tomllib

    parsed = tomllib.loads(snippet)
    config = build_bookie_config({"bookie": {"shards": 1}, **parsed}, env={})
    assert config.tls.enabled
