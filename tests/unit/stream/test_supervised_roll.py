"""A stream writer's roll runs under the loop's supervisor: a bug in it fails the writer loudly
instead of leaving its writes (and `close()`) waiting for a roll that never ends."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from bkaio.errors import BKError
from bkaio.stream import open_namespace
from bkaio.stream.writer import StreamWriter
from tests.unit.stream.conftest import ClientFactory


async def test_a_roll_that_raises_fails_the_writer(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("log", roll_bytes=10)

    async def broken(self: StreamWriter) -> None:
        raise RuntimeError("bug in a roll")

    monkeypatch.setattr(StreamWriter, "_roll", broken)
    with capture_logs() as logs:
        await writer.write(b"0123456789")  # Fills the segment: a roll starts.
        with pytest.raises(BKError, match="roll failed"):
            async with asyncio.timeout(5):
                await writer.write(b"held until the roll ends")
        async with asyncio.timeout(5):
            with pytest.raises(BKError):
                await writer.close()
    failed = [e for e in logs if e["event"] == "task_failed"]
    assert failed and failed[0]["kind"] == "stream_roll"
