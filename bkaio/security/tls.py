"""SSL contexts for the client port: bookies serve TLS, clients verify them, optionally both ways.

Every context refuses anything below TLS 1.2 and verifies its peer by default: a client checks
the bookie's certificate chain and that its SAN names the host it dialled (bookie ids are
`host:port`, so the bookie's host goes in the SAN); a bookie with `require_client_cert` checks
the client's chain against its `ca_file` (mutual TLS). Building a context reads files, so do it
once at start-up, not on the event loop's hot path.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from bkaio.errors import ConfigError

if TYPE_CHECKING:
    from bkaio.config import TlsConfig

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def _tls_version(min_version: str) -> ssl.TLSVersion:
    try:
        return _VERSIONS[min_version]
    except KeyError:
        raise ConfigError(f"TLS min_version={min_version!r} must be 1.2 or 1.3") from None


def _existing(path: str | Path, what: str) -> str:
    text = str(path)
    if not text:
        raise ConfigError(f"TLS {what} is not set")
    if not Path(text).is_file():
        raise ConfigError(f"TLS {what} {text!r} does not exist or is not a file")
    return text


def _load_chain(context: ssl.SSLContext, cert_file: str | Path, key_file: str | Path) -> None:
    cert = _existing(cert_file, "certificate")
    key = _existing(key_file, "private key")
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as error:
        raise ConfigError(
            f"TLS certificate {cert!r} / key {key!r} cannot be loaded: {error}"
        ) from None


def _load_cas(context: ssl.SSLContext, ca_file: str | Path) -> None:
    ca = _existing(ca_file, "CA file")
    try:
        context.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as error:
        raise ConfigError(f"TLS CA file {ca!r} cannot be loaded: {error}") from None


def server_tls_context(
    cert_file: str | Path,
    key_file: str | Path,
    *,
    ca_file: str | Path | None = None,
    require_client_cert: bool = False,
    min_version: str = "1.2",
) -> ssl.SSLContext:
    """A bookie's context: serves `cert_file`; with `require_client_cert`, mutual TLS."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _tls_version(min_version)
    context.options |= ssl.OP_NO_COMPRESSION
    _load_chain(context, cert_file, key_file)
    if ca_file:
        _load_cas(context, ca_file)
    if require_client_cert:
        if not ca_file:
            raise ConfigError("mutual TLS (require_client_cert) needs a CA file for the clients")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def server_tls_context_from_config(config: TlsConfig) -> ssl.SSLContext | None:
    """The context of a bookie's [tls] section, or None when TLS is off."""
    if not config.enabled:
        return None
    return server_tls_context(
        config.cert_file,
        config.key_file,
        ca_file=config.ca_file or None,
        require_client_cert=config.require_client_cert,
        min_version=config.min_version,
    )


def client_tls_context(
    ca_file: str | Path | None = None,
    *,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
    check_hostname: bool = True,
    min_version: str = "1.2",
) -> ssl.SSLContext:
    """A client's context for `BookKeeper.connect(uri, tls=...)`: verifies bookies against
    `ca_file` (None: the system store); `cert_file`/`key_file` for mutual TLS."""
    if ca_file:
        # The CA file alone: `create_default_context` would trust the system store as well, so
        # anyone with a publicly trusted certificate for a bookie's host could stand in for it.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # Verifies chain and host name.
        _load_cas(context, ca_file)
    else:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = _tls_version(min_version)
    if bool(cert_file) != bool(key_file):
        raise ConfigError("a TLS client certificate and its key go together")
    if cert_file and key_file:
        _load_chain(context, cert_file, key_file)
    context.check_hostname = check_hostname  # Verification of the chain stays on regardless.
    assert context.verify_mode == ssl.CERT_REQUIRED, context.verify_mode
    return context


def bookie_client_tls_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The context a bookie uses as a client of other bookies (autorecovery), or None."""
    if not config.enabled:
        return None
    return client_tls_context(
        config.client_ca_file or config.ca_file or None,
        cert_file=config.client_cert_file or None,
        key_file=config.client_key_file or None,
        min_version=config.min_version,
    )
