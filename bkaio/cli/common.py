"""Options and helpers shared by the CLI commands: `--metadata`, `--json`, running a coroutine."""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

import click

from bkaio.cli.params import METADATA_URI, FiniteFloat
from bkaio.env_names import CLIENT_TLS_ENV_CA, CLIENT_TLS_ENV_CERT, CLIENT_TLS_ENV_KEY

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

METADATA_ENV = "BKAIO_METADATA"


def metadata_option(function: F) -> F:
    """`--metadata URI`, falling back to $BKAIO_METADATA; required. With it `--timeout SECONDS`:
    how long to wait for etcd's first answer (it becomes the URI's `connect_timeout`, so every
    command that opens the URI honours it; default 5 s)."""

    @functools.wraps(function)
    def with_timeout(*args: Any, metadata_timeout: float | None, **kwargs: Any) -> Any:
        if metadata_timeout is not None:
            from bkaio.meta.uri import with_connect_timeout

            kwargs["metadata_uri"] = with_connect_timeout(kwargs["metadata_uri"], metadata_timeout)
        return function(*args, **kwargs)

    timeout = click.option(
        "--timeout",
        "metadata_timeout",
        type=FiniteFloat(min=0, min_open=True, max=3600),
        default=None,
        metavar="SECONDS",
        help="Give up on an unreachable etcd after this long (default: 5).",
    )
    uri = click.option(
        "--metadata",
        "metadata_uri",
        envvar=METADATA_ENV,
        required=True,
        type=METADATA_URI,
        help="Metadata store: etcd://host:port/prefix or sqlite:///path/meta.db "
        f"(default: ${METADATA_ENV}).",
    )
    return cast(F, uri(timeout(with_timeout)))


def json_option(function: F) -> F:
    decorator = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
    return decorator(function)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine on a fresh uvloop event loop."""
    import uvloop

    return uvloop.run(coroutine)


def run_with_timeout(coroutine: Coroutine[Any, Any, T], timeout_seconds: float) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout_seconds):
            return await coroutine

    return run(bounded())


def client_tls_from_env() -> ssl.SSLContext | None:
    """A client TLS context from $BKAIO_TLS_CA (+ $BKAIO_TLS_CERT/$BKAIO_TLS_KEY for mutual TLS)."""
    ca_file = os.environ.get(CLIENT_TLS_ENV_CA)
    if not ca_file:
        return None
    from bkaio.security import client_tls_context

    return client_tls_context(
        ca_file,
        cert_file=os.environ.get(CLIENT_TLS_ENV_CERT) or None,
        key_file=os.environ.get(CLIENT_TLS_ENV_KEY) or None,
    )


def client_options() -> dict[str, Any]:
    """BookKeeper.connect options the environment asks for: TLS files and an auth token."""
    return {"tls": client_tls_from_env(), "auth_token": os.environ.get("BKAIO_AUTH_TOKEN") or None}


def start_metrics_server(port: int, host: str, registry: Any) -> Any:
    """prometheus_client's HTTP server for `registry` on host:port (`--metrics-port`), its
    server object; ConfigError naming the option, the address and why it cannot listen there
    (a port another process holds, a host that does not resolve)."""
    from prometheus_client import start_http_server

    from bkaio.errors import ConfigError

    try:
        server, _thread = start_http_server(port, host, registry=registry)
    except OSError as error:  # socket.gaierror included.
        raise ConfigError(
            f"--metrics-port {port}: cannot listen on {host}:{port}: {error.strerror or error}"
        ) from error
    return server
