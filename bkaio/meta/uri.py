"""Parsing of metadata service URIs; pure, no I/O.

etcd://host:port[,host:port...]/prefix[?ca=..&cert=..&key=..&user=..&password=..&timeout=..
    &retry_seconds=..&connect_timeout=..]
sqlite:///absolute/path/meta.db[?synchronous=full|normal&prefix=/root]
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from bkaio.errors import ConfigError

DEFAULT_ETCD_PORT = 2379
DEFAULT_ROOT = "/bkaio"


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
    "ca", "cert", "key", "user", "password", "timeout", "retry_seconds", "connect_timeout",
}  # fmt: skip
_SQLITE_OPTIONS = {"synchronous", "prefix"}


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
        value = -1.0
    if value <= 0:
        raise ConfigError(f"metadata URI {uri!r}: {name}={options[name]!r} must be > 0 seconds")
    return value


def _options(query: str, allowed: set[str], uri: str) -> dict[str, str]:
    options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=False))
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(
            f"metadata URI {uri!r}: unknown option(s) {unknown}; known: {sorted(allowed)}"
        )
    return options


def parse_etcd_uri(uri: str) -> EtcdUri:
    parts = urlsplit(uri)
    if parts.scheme != "etcd":
        raise ConfigError(f"metadata URI {uri!r}: scheme must be etcd://")
    if not parts.netloc:
        raise ConfigError(f"metadata URI {uri!r}: no etcd endpoint (etcd://host:port/prefix)")
    endpoints: list[tuple[str, int]] = []
    for endpoint in parts.netloc.replace(";", ",").split(","):
        host, _, port_text = endpoint.rpartition(":")
        if not host:
            host, port_text = endpoint, str(DEFAULT_ETCD_PORT)
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(f"metadata URI {uri!r}: bad endpoint {endpoint!r} (want host:port)")
        endpoints.append((host.strip("[]"), int(port_text)))
    options = _options(parts.query, _ETCD_OPTIONS, uri)
    if ("user" in options) != ("password" in options):
        raise ConfigError(f"metadata URI {uri!r}: user and password go together")
    if ("cert" in options) != ("key" in options):
        raise ConfigError(f"metadata URI {uri!r}: cert and key go together")
    return EtcdUri(
        endpoints=tuple(endpoints),
        root=_root(parts.path, uri) if parts.path not in ("", "/") else DEFAULT_ROOT,
        ca_file=options.get("ca"),
        cert_file=options.get("cert"),
        key_file=options.get("key"),
        user=options.get("user"),
        password=options.get("password"),
        operation_timeout_seconds=_float_option(options, "timeout", 10.0, uri),
        retry_seconds=_float_option(options, "retry_seconds", 30.0, uri),
        connect_timeout_seconds=_float_option(options, "connect_timeout", 5.0, uri),
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
    parts = urlsplit(uri)
    if parts.scheme != "sqlite":
        raise ConfigError(f"metadata URI {uri!r}: scheme must be sqlite://")
    if parts.netloc:
        raise ConfigError(
            f"metadata URI {uri!r}: host {parts.netloc!r} not allowed; use sqlite:///abs/path.db"
        )
    path = unquote(parts.path)
    if not path.startswith("/") or path.endswith("/"):
        raise ConfigError(
            f"metadata URI {uri!r}: want an absolute file path, sqlite:///dir/meta.db"
        )
    options = _options(parts.query, _SQLITE_OPTIONS, uri)
    synchronous = options.get("synchronous", "full").lower()
    if synchronous not in ("full", "normal"):
        raise ConfigError(f"metadata URI {uri!r}: synchronous must be full or normal")
    return SqliteUri(path=path, root=_root(options.get("prefix", ""), uri), synchronous=synchronous)
