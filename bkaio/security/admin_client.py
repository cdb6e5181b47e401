"""How a process speaks to a bookie's admin API as a client: with TLS or without, by the scheme
of the admin URL the bookie registered (`https://` when its admin.tls serves HTTPS).

A process that has TLS for bookies (a bookie's [tls], the command line's $BKAIO_TLS_CA) asks
HTTPS bookies with that context, and refuses to send the admin token in clear to a bookie that
registered plain `http://` on another host; a process without TLS refuses an `https://` bookie
at once, naming what to set, rather than failing in the handshake against the system's CAs.

Every request about one bookie names that bookie's id in the `X-Bkaio-Bookie-Id` header
(`admin_headers`), and a bookie's admin API answers 409 (kind `WrongBookie`) to a request meant
for another id: a registered URL that reaches another bookie (admin.host = 127.0.0.1 followed
from another host, to whatever listens on that port there) is an error naming the setting
(`raise_if_wrong_bookie`), never that other bookie's answer taken for this one's.
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


# The header naming the bookie a request is meant for, and the kind of the 409 answer.
ADMIN_BOOKIE_HEADER: Final = "X-Bkaio-Bookie-Id"
WRONG_BOOKIE_KIND: Final = "WrongBookie"
WRONG_BOOKIE_STATUS: Final = 409


class AdminTlsMismatchError(ConfigError):
    """The admin URL's scheme and this process's TLS settings do not go together."""


class AdminWrongBookieError(ConfigError):
    """A bookie's registered admin URL reached another bookie (its admin API refused the
    request: 409 WrongBookie)."""


def admin_headers(bookie_id: str, token: str | None = None) -> dict[str, str]:
    """Headers of an admin request meant for bookie `bookie_id` (with the admin token when
    given)."""
    headers = {ADMIN_BOOKIE_HEADER: bookie_id}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def raise_if_wrong_bookie(bookie_id: str, admin_url: str, status: int, body: object) -> None:
    """AdminWrongBookieError when the answer to a request for `bookie_id` at `admin_url` says
    another bookie's admin API answered it."""
    if status != WRONG_BOOKIE_STATUS or not isinstance(body, dict):
        return
    if body.get("kind") != WRONG_BOOKIE_KIND:
        return
    reached = body.get("bookie_id")
    raise AdminWrongBookieError(
        f"bookie {bookie_id}'s registered admin URL {admin_url} reached bookie {reached}: "
        f"set admin.host of bookie {bookie_id} to an address other hosts reach it by (its "
        "advertised_host, or 0.0.0.0 to register that), not 127.0.0.1 (docs/deployment.md)"
    )


def loopback_admin_url_of_remote(admin_url: str, advertised_host: str) -> bool:
    """Whether a bookie advertised on `advertised_host` registered a loopback `admin_url`: only
    a process on the bookie's own host reaches it there."""
    return _loopback(urlsplit(admin_url).hostname or "") and not _loopback(advertised_host)


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
