"""The fault harness's link proxy (tests/faults/harness/proxy.py) leaves no connection behind.

A connection accepted while the proxy closes, its handler still connecting to the target, was
opened after `close` and never closed: finalised in a later test, its socket, transport and
stream writer made unraisable ResourceWarnings there (fresh-clone-like run on 2aa70ec: the
fault suite's test_f9_two_concurrent_recoverers failed so, after F8's proxies had closed).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.faults.harness.proxy import LinkProxy

LOOPBACK = "127.0.0.1"


async def _ended(reader: asyncio.StreamReader) -> bool:
    """Whether the other end closed or reset the connection (reads until it does)."""
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True


async def test_a_connection_accepted_while_the_proxy_closes_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
        writer.close()

    target = await asyncio.start_server(echo, LOOPBACK, 0)
    port = int(target.sockets[0].getsockname()[1])
    real_open_connection = asyncio.open_connection
    connecting = asyncio.Event()
    go_on = asyncio.Event()
    upstream: list[asyncio.StreamWriter] = []

    async def open_connection_held(
        *args: Any, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The proxy's upstream connect, held until the test lets it go on."""
        connecting.set()
        await go_on.wait()
        reader, writer = await real_open_connection(*args, **kwargs)
        upstream.append(writer)
        return reader, writer

    proxy = await LinkProxy.start(LOOPBACK, port)
    monkeypatch.setattr(asyncio, "open_connection", open_connection_held)
    client_reader, client_writer = await real_open_connection(LOOPBACK, proxy.port)
    try:
        await asyncio.wait_for(connecting.wait(), 10)  # The proxy's handler is connecting.
        await proxy.close()
        go_on.set()
        # The proxy ended the client's connection; a bound, not a timing: it never ended.
        assert await asyncio.wait_for(_ended(client_reader), 10)
        assert all(writer.is_closing() for writer in upstream), "upstream left open"
    finally:
        client_writer.close()
        for writer in upstream:
            writer.close()
        target.close()
        await target.wait_closed()
