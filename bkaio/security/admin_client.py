"""How a process speaks to a bookie's admin API as a client: with TLS or without, by the scheme
of the admin URL the bookie registered (`https://` when its admin.tls serves HTTPS).

A process that has TLS for bookies (a bookie's [tls], the command line's $BKAIO_TLS_CA) asks
HTTPS bookies with that context, and refuses to send the admin token in clear to a bookie that
registered plain `http://` on another host; a process without TLS refuses an `https://` bookie
at once, naming what to set, rather than failing in the handshake against the system's CAs.
"""

from __future__ import annotations

import ipaddress
import ssl
from typing import Final
from urllib.parse import urlsplit

from bkaio.errors import ConfigError

# Where a process that asks bookies' admin APIs gets its TLS from, for errors to name.
ADMIN_CLIENT_TLS_SETTINGS: Final = (
    "a bookie's tls.enabled with tls.client_ca_file or tls.ca_file; the bkaio command's "
    "$BKAIO_TLS_CA"
)


class AdminTlsMismatchError(ConfigError):
    """The admin URL's scheme and this process's TLS settings do not go together."""


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def admin_request_ssl(
    admin_url: str, tls: ssl.SSLContext | None, *, tls_setting: str
) -> ssl.SSLContext | bool:
    """What a request to `admin_url` passes as aiohttp's `ssl=` (urllib's `context=`: None
    for True): `tls` for an https:// bookie, True (no TLS) for an http:// one.

    `tls_setting` names how this process is given TLS, for the error when it is missing or
    when plain HTTP would leave the machine (AdminTlsMismatchError)."""
    parts = urlsplit(admin_url)
    host = parts.hostname or ""
    if parts.scheme == "https":
        if tls is None:
            raise AdminTlsMismatchError(
                f"the admin API at {admin_url} serves HTTPS (its admin.tls) and this process "
                f"has no TLS settings to verify it: set {tls_setting}"
            )
        return tls
    if parts.scheme == "http":
        if tls is not None and not _loopback(host):
            raise AdminTlsMismatchError(
                f"the admin API at {admin_url} serves plain HTTP (its admin.tls is off) and "
                f"this process uses TLS ({tls_setting}): the admin token is not sent in clear; "
                'serve the admin API over HTTPS (admin.tls = "auto" or "on")'
            )
        return True
    raise AdminTlsMismatchError(f"admin URL {admin_url!r} is neither http:// nor https://")
