"""Why a connection to a bookie failed, told so that a user knows which setting to change.

A TLS mismatch looks like an ordinary network failure from inside a connection: a plain-TCP
client's HELLO to a TLS bookie is met by a closed connection (the bookie's TLS layer drops
bytes that are not a handshake, without a word); a TLS client's handshake with a plain bookie
fails with an SSL error about record versions. Without a diagnosis the writer only sees "lost
connection" and swaps bookies until it runs out of them. Here:

- `explain_connect_error`: a failed connect or handshake (certificate not trusted, a plain
  bookie answering a TLS handshake, anything else as it is);
- `explain_refusal`: a connection closed before the bookie answered HELLO. A TLS client
  learns why from the TLS alert when one came (no client certificate, a certificate the bookie
  does not trust), else it points at the client certificate (a mutual-TLS bookie may close
  without a word); a plain client probes the port once with a TLS handshake that checks
  nothing, and if a TLS server answers, says that the bookie wants TLS.

The messages name the settings: `BookKeeper.connect(tls=...)` for programs, BKAIO_TLS_CA,
BKAIO_TLS_CERT and BKAIO_TLS_KEY for the command line (docs/security.md).
"""

from __future__ import annotations

import asyncio
import ssl

# Where a client's TLS settings live, for the messages below.
CLIENT_TLS_SETTINGS = (
    "BookKeeper.connect(tls=client_tls_context(ca_file, cert_file=..., key_file=...)); "
    "for the bkaio command line BKAIO_TLS_CA, BKAIO_TLS_CERT and BKAIO_TLS_KEY"
)
# OpenSSL reasons for a handshake answered by something that is not TLS.
_PLAIN_PEER_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"}
)
# TLS alerts a bookie sends when it wants a client certificate it did not get.
_NO_CLIENT_CERT_REASONS = frozenset(
    {"TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE"}
)
# TLS alerts a bookie sends about the client's certificate.
_BAD_CLIENT_CERT_REASONS = frozenset(
    {
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_ACCESS_DENIED",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    }
)


def _reason(error: BaseException | None) -> str:
    if isinstance(error, ssl.SSLError):
        return str(error.reason or "")
    return ""


def explain_connect_error(label: str, error: BaseException, *, tls: bool) -> str:
    """The message for a connect (TCP and, with `tls`, the handshake) that failed."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return (
            f"TLS handshake with bookie {label} failed: its certificate is not trusted "
            f"({error.verify_message}); the client's CA file must hold the CA that signed "
            f"the bookie's certificate ({CLIENT_TLS_SETTINGS})"
        )
    reason = _reason(error)
    if reason in _PLAIN_PEER_REASONS:
        return (
            f"bookie {label} does not speak TLS (the TLS handshake got a plain-TCP answer: "
            f"{reason}): this client connects with TLS; connect without tls= (unset "
            f"BKAIO_TLS_CA for the command line), or enable [tls] on the bookie"
        )
    if isinstance(error, ssl.SSLError):
        return _refused_by_tls_alert(label, reason) or (
            f"TLS handshake with bookie {label} failed: {error}; check {CLIENT_TLS_SETTINGS}"
        )
    if isinstance(error, TimeoutError) and tls:
        return f"cannot connect to {label}: no TCP connection or TLS handshake in time"
    return f"cannot connect to {label}: {error!r}"


def _refused_by_tls_alert(label: str, reason: str) -> str | None:
    if reason in _NO_CLIENT_CERT_REASONS:
        return (
            f"bookie {label} requires a client certificate (mutual TLS) and this client "
            f"sent none: give the client a certificate and key ({CLIENT_TLS_SETTINGS})"
        )
    if reason in _BAD_CLIENT_CERT_REASONS:
        return (
            f"bookie {label} refused this client's TLS certificate ({reason}): use a "
            f"certificate signed by a CA the bookie trusts ({CLIENT_TLS_SETTINGS})"
        )
    return None


async def explain_refusal(
    label: str,
    host: str,
    port: int,
    error: BaseException | None,
    *,
    tls: bool,
    timeout_seconds: float,
) -> str:
    """The message for a connection that ended before the bookie answered HELLO."""
    plain = f"bookie {label} closed the connection before answering HELLO" + (
        f": {error!r}" if error is not None else ""
    )
    if tls:
        return _refused_by_tls_alert(label, _reason(error)) or (
            f"{plain}, right after the TLS handshake: most likely it wants a client "
            f"certificate (mutual TLS) that this client did not send, or does not trust the "
            f"one it sent ({CLIENT_TLS_SETTINGS})"
        )
    if await peer_speaks_tls(host, port, timeout_seconds):
        return (
            f"bookie {label} serves TLS and this client connects in plain TCP: connect with "
            f"TLS ({CLIENT_TLS_SETTINGS})"
        )
    return plain


async def peer_speaks_tls(host: str, port: int, timeout_seconds: float) -> bool:
    """Does a TLS server answer at host:port? One handshake that verifies nothing (it only
    tells whether TLS is spoken there); any failure to find out counts as no."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_seconds):
            transport, _ = await loop.create_connection(
                asyncio.Protocol, host, port, ssl=context, server_hostname=host
            )
    except ssl.SSLError as error:
        # A handshake alert (no client certificate, say) comes from a TLS server too.
        return _reason(error) not in _PLAIN_PEER_REASONS and not isinstance(
            error, ssl.SSLEOFError | ssl.SSLZeroReturnError
        )
    except (OSError, TimeoutError):
        return False
    transport.close()
    return True
