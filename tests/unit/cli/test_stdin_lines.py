"""`lines_of`: stdin lines as they arrive, for `bkaio stream write`."""

from __future__ import annotations

import asyncio
import io
import os

import pytest

from bkaio.cli.stdin_lines import LineTooLongError, lines_of


async def test_lines_come_as_they_arrive_not_at_eof() -> None:
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as source:  # A pipe, as `tail -f log |` gives.
        lines = lines_of(source, max_line_bytes=100)
        os.write(write_end, b"one\r\ntwo\nthr")
        async with asyncio.timeout(10):
            assert await anext(lines) == b"one"
            assert await anext(lines) == b"two"
            os.write(write_end, b"ee\n")
            assert await anext(lines) == b"three"
            os.write(write_end, b"last without a line end")
            os.close(write_end)
            assert [line async for line in lines] == [b"last without a line end"]


async def test_a_line_longer_than_the_limit_is_refused_with_its_number() -> None:
    lines = lines_of(io.BytesIO(b"ok\n" + b"x" * 50 + b"\n"), max_line_bytes=10)
    assert await anext(lines) == b"ok"
    with pytest.raises(LineTooLongError, match="line 2 is longer than 10 bytes"):
        await anext(lines)
    endless = lines_of(io.BytesIO(b"y" * 200_000), max_line_bytes=1000)  # No line end at all.
    with pytest.raises(LineTooLongError, match="line 1"):
        await anext(endless)
