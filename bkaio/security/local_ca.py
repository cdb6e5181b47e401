"""A throw-away certificate authority for `bkaio standalone --tls` (a try-out, not production).

`generate_local_tls(directory)` writes, once, into `directory`:

    ca.pem                 the local CA (clients trust it)
    bookie.pem, bookie.key the bookies' certificate (SAN: localhost, 127.0.0.1, ::1, extra hosts)
    client.pem, client.key a client certificate signed by the same CA (mutual TLS)

Keys are ECDSA P-256, written with mode 0600; the CA's key is not kept (nothing more can be
signed later: run it again in an empty directory for new hosts). Existing files are reused, so
a restarted standalone cluster keeps its certificates. Blocking (key generation and files):
call it before starting the event loop, or in an executor.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bkaio.errors import ConfigError
from bkaio.security.tls import client_tls_context

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
_VALID_DAYS = 365


@dataclass(frozen=True, slots=True)
class LocalTls:
    """Where `generate_local_tls` put its files, and how to use them."""

    directory: Path
    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_file: Path
    client_key_file: Path

    def bookie_toml(self, *, require_client_cert: bool = False) -> str:
        """The [tls] section a bookie config needs to serve TLS with these files."""
        lines = [
            "[tls]",
            "enabled = true",
            f'cert_file = "{self.cert_file}"',
            f'key_file = "{self.key_file}"',
            f'ca_file = "{self.ca_file}"',
            f"require_client_cert = {'true' if require_client_cert else 'false'}",
            f'client_cert_file = "{self.client_cert_file}"',
            f'client_key_file = "{self.client_key_file}"',
        ]
        return "\n".join(lines) + "\n"

    def bookie_tls_section(self, *, require_client_cert: bool = False) -> dict[str, Any]:
        """The same [tls] section as a dict (for code that writes TOML itself)."""
        return {
            "enabled": True,
            "cert_file": str(self.cert_file),
            "key_file": str(self.key_file),
            "ca_file": str(self.ca_file),
            "require_client_cert": require_client_cert,
            "client_cert_file": str(self.client_cert_file),
            "client_key_file": str(self.client_key_file),
        }

    def client_context(self, *, with_client_cert: bool = True) -> ssl.SSLContext:
        """An SSL context for `BookKeeper.connect(uri, tls=...)` that trusts the local CA."""
        if with_client_cert:
            return client_tls_context(
                self.ca_file, cert_file=self.client_cert_file, key_file=self.client_key_file
            )
        return client_tls_context(self.ca_file)


def _files(directory: Path) -> LocalTls:
    return LocalTls(
        directory=directory,
        ca_file=directory / "ca.pem",
        cert_file=directory / "bookie.pem",
        key_file=directory / "bookie.key",
        client_cert_file=directory / "client.pem",
        client_key_file=directory / "client.key",
    )


def generate_local_tls(directory: Path | str, hosts: Sequence[str] = ()) -> LocalTls:
    """A local CA plus bookie and client certificates in `directory` (reused when present)."""
    try:
        from cryptography import x509  # noqa: F401  (checked here for a clear message)
    except ImportError:
        raise ConfigError(
            "bkaio standalone --tls needs the 'cryptography' package (pip install cryptography)"
        ) from None
    directory = Path(directory)
    files = _files(directory)
    paths = (
        files.ca_file,
        files.cert_file,
        files.key_file,
        files.client_cert_file,
        files.client_key_file,
    )
    if all(path.is_file() for path in paths):
        return files
    directory.mkdir(parents=True, exist_ok=True)
    all_hosts = tuple(dict.fromkeys((*DEFAULT_HOSTS, *hosts)))
    ca_key, ca_cert = _make_ca()
    bookie_key, bookie_cert = _make_leaf(ca_key, ca_cert, "bkaio bookie", all_hosts, server=True)
    client_key, client_cert = _make_leaf(ca_key, ca_cert, "bkaio client", (), server=False)
    _write(files.ca_file, _cert_pem(ca_cert), private=False)
    _write(files.cert_file, _cert_pem(bookie_cert), private=False)
    _write(files.key_file, _key_pem(bookie_key), private=True)
    _write(files.client_cert_file, _cert_pem(client_cert), private=False)
    _write(files.client_key_file, _key_pem(client_key), private=True)
    return files


def _write(path: Path, data: bytes, *, private: bool) -> None:
    temporary = path.with_name(path.name + ".tmp")
    descriptor = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644
    )
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    os.replace(temporary, path)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _make_ca() -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bkaio local CA")])
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def _san(hosts: Sequence[str]) -> list[Any]:
    from cryptography import x509

    names: list[Any] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _make_leaf(
    ca_key: Any, ca_cert: Any, common_name: str, hosts: Sequence[str], *, server: bool
) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san(hosts)), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _cert_pem(certificate: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = certificate.public_bytes(serialization.Encoding.PEM)
    return pem


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem
