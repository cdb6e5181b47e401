"""Parsing of metadata service URIs; pure, no I/O.

etcd://host:port[,host:port...]/prefix[?ca=..&cert=..&key=..&user=..&password=..&timeout=..
    &attempt_timeout=..&retry_seconds=..&connect_timeout=..]
sqlite:///absolute/path/meta.db[?synchronous=full|normal&prefix=/root]

Whatever would fail later (at connect, after a timeout, or with a traceback) is a ConfigError
here: an endpoint without a host, a port that is no port, an unclosed '[', credentials before
the host, an empty file option, a timeout that is not a finite number > 0 (or an
attempt_timeout above the timeout), a NUL byte in a path, a '#' (an unencoded one in a password
would cut it short). Errors show the URI with its password redacted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from urllib.parse import (
    SplitResult,
    parse_qsl,
    unquote,
    unquote_plus,
    urlencode,
    urlsplit,
    urlunsplit,
)

from bkaio.errors import ConfigError
from bkaio.security.tokens import redact_uri

DEFAULT_ETCD_PORT = 2379
DEFAULT_ROOT = "/bkaio"
DEFAULT_ATTEMPT_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class EtcdUri:
    endpoints: tuple[tuple[str, int], ...]
    root: str  # Key prefix every key lives under, no trailing "/" ("" = the whole keyspace).
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: str | None = None
    operation_timeout_seconds: float = 10.0
    # How long the first attempt of a request that may be repeated (a read, a lease call, an
    # unconditional write) waits for one member before it tries the next: a silent member
    # (stopped, partitioned) answers nothing, and only a deadline notices it. Each later attempt
    # of the request waits twice as long, up to operation_timeout_seconds, so a member that is
    # slow but alive still answers. Never above operation_timeout_seconds.
    attempt_timeout_seconds: float = DEFAULT_ATTEMPT_TIMEOUT_SECONDS
    retry_seconds: float = 30.0  # How long an operation keeps retrying a lost connection.
    # How long opening the store waits for a first answer: an unreachable etcd at start-up is
    # most often a wrong address, said quickly; a running service rides out retry_seconds.
    connect_timeout_seconds: float = 5.0


@dataclass(frozen=True, slots=True)
class SqliteUri:
    path: str
    root: str = ""
    synchronous: str = "full"


_ETCD_OPTIONS = {
    "ca", "cert", "key", "user", "password", "timeout", "attempt_timeout", "retry_seconds",
    "connect_timeout",
}  # fmt: skip
_SQLITE_OPTIONS = {"synchronous", "prefix"}
# Options naming a file: an empty one would read as absent, and an absent `ca` is no TLS.
_FILE_OPTIONS = ("ca", "cert", "key")
# Credentials before the host, with or without the scheme (a URI missing it is an error to show).
# One query option: `?name=` or `&name=` (group 1, the name alone group 2), then its value.
_QUERY_VALUE = re.compile(r"([?&]([^=&#]*)=)([^&]*)")
_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^/?#]*@")
_SLASHES = re.compile(r"/{2,}")  # A run of slashes in a path: one, to the file system.


def shown_uri(uri: str) -> str:
    """`uri` as an error may show it: as given (its options too: `?prefix=` says which cluster),
    less any password, in the query or before the host."""
    return _USERINFO.sub(r"\1***@", redact_uri(uri))


def _root(path: str, uri: str) -> str:
    root = unquote(path).rstrip("/")
    if root and not root.startswith("/"):
        raise ConfigError(f"metadata URI {uri!r}: prefix {root!r} must start with '/'")
    return root


def _float_option(options: dict[str, str], name: str, default: float, uri: str) -> float:
    if name not in options:
        return default
    try:
        value = float(options[name])
    except ValueError:
        value = math.nan
    # float() reads "nan" and "inf": NaN would pass a `<= 0` check, infinity waits forever.
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"metadata URI {uri!r}: {name}={options[name]!r} must be a finite number of seconds > 0"
        )
    return value


def _endpoint(endpoint: str, uri: str) -> tuple[str, int]:
    """`host:port`, `host` (port 2379), `[v6]:port` or `[v6]` as (host, port)."""
    host, colon, port_text = endpoint.rpartition(":")
    if not colon or endpoint.endswith("]"):
        host, port_text = endpoint, str(DEFAULT_ETCD_PORT)
    host = host.strip("[]")
    if not host.strip():
        raise ConfigError(
            f"metadata URI {uri!r}: bad endpoint {endpoint!r}: no host (want host:port)"
        )
    if not (port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536):
        raise ConfigError(
            f"metadata URI {uri!r}: bad endpoint {endpoint!r}: port {port_text!r} is not a "
            "number in [1, 65535] (want host:port)"
        )
    return host, int(port_text)


def _split(uri: str, shown: str) -> SplitResult:
    """`uri`'s parts; ConfigError for what urlsplit refuses (an unclosed '[') or a fragment,
    which no metadata URI has: an unencoded '#' in a password or path would cut the rest off
    unnoticed (a wrong password, options gone)."""
    try:
        parts = urlsplit(uri)
    except ValueError as error:
        raise ConfigError(f"metadata URI {shown!r}: {error} (want [v6-address]:port)") from None
    if "#" in uri:
        raise ConfigError(
            f"metadata URI {shown!r}: '#' has no meaning here; in a password or path, write it "
            "as %23"
        )
    return parts


def _options(query: str, allowed: set[str], uri: str) -> dict[str, str]:
    options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=False))
    unknown = sorted(set(options) - allowed)
    if unknown:
        # Their values hidden too: a mistyped `password` (passwd=, pwd=) still holds the secret.
        raise ConfigError(
            f"metadata URI {_hide_values(uri, unknown)!r}: unknown option(s) {unknown}; "
            f"known: {sorted(allowed)}"
        )
    return options


def _hide_values(uri: str, names: list[str]) -> str:
    """`uri` with the values of the query options called `names` replaced by ***."""

    def hide(option: re.Match[str]) -> str:
        return option.group(1) + "***" if unquote_plus(option.group(2)) in names else option[0]

    return _QUERY_VALUE.sub(hide, uri)


def parse_etcd_uri(uri: str) -> EtcdUri:
    shown = shown_uri(uri)
    parts = _split(uri, shown)
    if parts.scheme != "etcd":
        raise ConfigError(f"metadata URI {shown!r}: scheme must be etcd://")
    if not parts.netloc:
        raise ConfigError(f"metadata URI {shown!r}: no etcd endpoint (etcd://host:port/prefix)")
    if "@" in parts.netloc:
        raise ConfigError(
            f"metadata URI {shown!r}: credentials do not go before the host; pass them as "
            "options: etcd://host:port/prefix?user=NAME&password=SECRET"
        )
    endpoints = [
        _endpoint(endpoint, shown) for endpoint in parts.netloc.replace(";", ",").split(",")
    ]
    options = _options(parts.query, _ETCD_OPTIONS, shown)
    if ("user" in options) != ("password" in options):
        raise ConfigError(f"metadata URI {shown!r}: user and password go together")
    for name in _FILE_OPTIONS:
        if name in options and not options[name].strip():
            raise ConfigError(
                f"metadata URI {shown!r}: {name}= is empty: give the PEM file's path, or leave "
                "the option out"
            )
    if ("cert" in options) != ("key" in options):
        raise ConfigError(f"metadata URI {shown!r}: cert and key go together")
    timeout = _float_option(options, "timeout", 10.0, shown)
    attempt_timeout = _float_option(
        options, "attempt_timeout", min(DEFAULT_ATTEMPT_TIMEOUT_SECONDS, timeout), shown
    )
    if attempt_timeout > timeout:
        raise ConfigError(
            f"metadata URI {shown!r}: attempt_timeout={options['attempt_timeout']!r} must not"
            f" exceed timeout ({timeout:g} s): it bounds one attempt of a request to one member"
        )
    return EtcdUri(
        endpoints=tuple(endpoints),
        root=_root(parts.path, shown) if parts.path not in ("", "/") else DEFAULT_ROOT,
        ca_file=options.get("ca"),
        cert_file=options.get("cert"),
        key_file=options.get("key"),
        user=options.get("user"),
        password=options.get("password"),
        operation_timeout_seconds=timeout,
        attempt_timeout_seconds=attempt_timeout,
        retry_seconds=_float_option(options, "retry_seconds", 30.0, shown),
        connect_timeout_seconds=_float_option(options, "connect_timeout", 5.0, shown),
    )


def with_connect_timeout(uri: str, seconds: float) -> str:
    """`uri` with its etcd `connect_timeout` option set to `seconds` (any earlier value goes).

    An SQLite URI is returned as it is: a local file has no connection to wait for.
    """
    parts = urlsplit(uri)
    if parts.scheme != "etcd":
        return uri
    options = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    options = [(k, v) for k, v in options if k != "connect_timeout"]
    options.append(("connect_timeout", repr(float(seconds))))
    return urlunsplit(parts._replace(query=urlencode(options, safe="/")))


def parse_sqlite_uri(uri: str) -> SqliteUri:
    shown = shown_uri(uri)
    parts = _split(uri, shown)
    if parts.scheme != "sqlite":
        raise ConfigError(f"metadata URI {shown!r}: scheme must be sqlite://")
    if parts.netloc:
        raise ConfigError(
            f"metadata URI {shown!r}: host {parts.netloc.rpartition('@')[2]!r} not allowed; "
            "use sqlite:///abs/path.db"  # The host alone: what precedes an '@' may be a secret.
        )
    path = unquote(parts.path)
    if not path.startswith("/") or path.endswith("/"):
        raise ConfigError(
            f"metadata URI {shown!r}: want an absolute file path, sqlite:///dir/meta.db"
        )
    if "\x00" in path:  # %00: no file system path holds one (open() raises ValueError).
        raise ConfigError(f"metadata URI {shown!r}: the path holds a NUL byte (%00)")
    # As the file system reads it: sqlite:////dir/meta.db (what f"sqlite:///{path}" gives for an
    # absolute path) names /dir/meta.db, and errors and logs must show it so, not as //dir.
    path = _SLASHES.sub("/", path)
    options = _options(parts.query, _SQLITE_OPTIONS, shown)
    synchronous = options.get("synchronous", "full").lower()
    if synchronous not in ("full", "normal"):
        raise ConfigError(f"metadata URI {shown!r}: synchronous must be full or normal")
    root = _root(options.get("prefix", ""), shown)
    return SqliteUri(path=path, root=root, synchronous=synchronous)
