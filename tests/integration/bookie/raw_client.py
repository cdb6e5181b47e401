"""A raw protocol v1 client for bookie tests: frames in and out, nothing hidden.

Built on the sans-IO codec (bkaio.protocol) over asyncio streams; it can pipeline thousands of
requests, send arbitrary bytes, and tell whether the bookie closed the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence
from typing import Any

from bkaio.protocol.digest import entry_digest, master_key
from bkaio.protocol.frames import FrameDecoder, encode_frame
from bkaio.protocol.messages import (
    PROTOCOL_VERSION,
    AddEntryRequest,
    Flag,
    HelloRequest,
    HelloResponse,
    Request,
    Response,
    decode_response,
)
from bkaio.protocol.status import Status

# The bookies of these tests run with server.ledger_key_check = "first_sight" (no metadata for
# the ledgers they use), so one key for every ledger is fine.
MASTER_KEY = master_key(b"password", 0)
# Bookie config for tests that add to ledgers without metadata (the key of a ledger's first
# request is recorded as is, BookKeeper's rule; the default checks it against metadata).
FIRST_SIGHT: dict[str, dict[str, Any]] = {"server": {"ledger_key_check": "first_sight"}}


def add_request(
    request_id: int,
    ledger_id: int,
    entry_id: int,
    payload: bytes,
    *,
    lac: int = -1,
    length: int | None = None,
    key: bytes = MASTER_KEY,
    flags: Flag = Flag.NONE,
    digest: int | None = None,
) -> AddEntryRequest:
    length = len(payload) * (entry_id + 1) if length is None else length
    if digest is None:
        digest = entry_digest(ledger_id, entry_id, lac, length, payload)
    return AddEntryRequest(
        request_id, ledger_id, entry_id, flags, key, lac, length, digest, payload
    )


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(64 * 1024 * 1024)
        self.pending: list[Response] = []
        self.request_ids = itertools.count(1)

    @classmethod
    async def connect(cls, host: str, port: int, *, hello: bool = True) -> RawClient:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 24)
        client = cls(reader, writer)
        if hello:
            response = await client.hello()
            assert isinstance(response, HelloResponse), response
            assert response.status is Status.OK, response
        return client

    def next_id(self) -> int:
        return next(self.request_ids)

    async def hello(self, version: int = PROTOCOL_VERSION, token: str | None = None) -> Response:
        return await self.request(HelloRequest(self.next_id(), version, "raw-test", token))

    def send(self, request: Request | list[Any]) -> None:
        body = request if isinstance(request, list) else request.to_body()
        self.writer.write(encode_frame(body))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def read_response(self, timeout_seconds: float = 10.0) -> Response:
        async with asyncio.timeout(timeout_seconds):
            while not self.pending:
                data = await self.reader.read(1 << 20)
                if not data:
                    raise ConnectionError("bookie closed the connection")
                self.pending.extend(decode_response(b) for b in self.decoder.feed(data))
        return self.pending.pop(0)

    async def request(
        self, request: Request | list[Any], timeout_seconds: float = 10.0
    ) -> Response:
        self.send(request)
        await self.writer.drain()
        return await self.read_response(timeout_seconds)

    async def pipeline(
        self, requests: Sequence[Request], timeout_seconds: float = 60.0
    ) -> dict[int, Response]:
        """Send every request at once, then collect one response per request id."""
        for request in requests:
            self.send(request)
        await self.writer.drain()
        responses: dict[int, Response] = {}
        while len(responses) < len(requests):
            response = await self.read_response(timeout_seconds)
            responses[response.request_id] = response
        return responses

    async def closed_by_peer(self, timeout_seconds: float = 10.0) -> bool:
        """True once the bookie closes the connection (responses before that are kept)."""
        try:
            async with asyncio.timeout(timeout_seconds):
                while True:
                    data = await self.reader.read(1 << 16)
                    if not data:
                        return True
                    self.pending.extend(decode_response(b) for b in self.decoder.feed(data))
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
