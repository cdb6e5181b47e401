"""A stream write above the client's entry limit (max_frame_bytes - 4096) is refused with
InvalidStreamArgumentError and the writer goes on, whether it would go to the ledger at once
or be held during a roll (the ledger handle's own refusal would fail the writer)."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.protocol.codes import FRAME_ENVELOPE_BYTES
from bkaio.stream import open_namespace
from bkaio.stream.errors import InvalidStreamArgumentError
from tests.unit.stream.conftest import ClientFactory

LIMIT = 100


async def test_an_oversized_write_is_refused_and_the_writer_goes_on(
    make_client: ClientFactory,
) -> None:
    bk = await make_client(max_frame_bytes=LIMIT + FRAME_ENVELOPE_BYTES)
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("log", roll_bytes=LIMIT)
    first = writer.write(b"a" * LIMIT)  # Fills the segment: a roll starts, later writes wait.
    for payload in (b"x" * (LIMIT + 1), memoryview(b"y" * (LIMIT + 1))):
        with pytest.raises(InvalidStreamArgumentError, match="above the entry limit of 100"):
            writer.write(payload)  # type: ignore[arg-type]
    async with asyncio.timeout(10):
        positions = [await first, await writer.write(b"b")]
        with pytest.raises(InvalidStreamArgumentError, match="above the entry limit"):
            writer.write(b"z" * (LIMIT + 1))  # Now with no roll running: the same.
        positions.append(await writer.write(b"c"))
    assert [p.seq for p in positions] == [0, 1, 2]
    await writer.close()
