"""`lines_of`: stdin lines as they arrive, for `bkaio stream write`."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys

import click
import pytest

from bkaio.cli.stdin_lines import LineTooLongError, lines_of
from bkaio.cli.stream_cmd import _records


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


class FailingInput:
    """An input that gives `chunks`, then raises `error` (not an OSError: a bug of the input)."""

    def __init__(self, chunks: list[bytes], error: Exception) -> None:
        self.chunks = chunks
        self.error = error

    def read1(self, size: int = -1, /) -> bytes:
        if self.chunks:
            return self.chunks.pop(0)
        raise self.error


async def test_any_failure_of_the_reading_thread_fails_the_lines_not_a_wait_for_ever() -> None:
    lines = lines_of(FailingInput([b"one\ntw"], ValueError("bad input")), max_line_bytes=100)
    async with asyncio.timeout(10):  # Before the fix: the thread ended and this waited for ever.
        assert await anext(lines) == b"one"
        with pytest.raises(ValueError, match="bad input"):
            await anext(lines)


async def test_an_oserror_of_the_reading_thread_fails_the_lines() -> None:
    lines = lines_of(FailingInput([], OSError(5, "Input/output error")), max_line_bytes=100)
    async with asyncio.timeout(10):
        with pytest.raises(OSError, match="Input/output error"):
            await anext(lines)


@pytest.mark.parametrize("as_hex", [False, True])
async def test_stream_write_refuses_a_long_line_as_it_refuses_a_bad_hex_one(as_hex: bool) -> None:
    """Both are a usage error (exit 2) naming the line, after the records before it: the
    long line was a LineTooLongError (exit 1) while docs/streams.md said exit 2."""
    source = io.BytesIO(b"6f6b\n" + b"x" * 50 + b"\n")
    records = _records(lines_of(source, max_line_bytes=10), as_hex)
    assert await anext(records) == (b"ok" if as_hex else b"6f6b")
    with pytest.raises(click.BadParameter) as refused:
        await anext(records)
    assert refused.value.format_message() == (
        "Invalid value: line 2 is longer than 10 bytes; the records before it were written"
    )


CHILD = """
import asyncio
from bkaio.cli.stdin_lines import lines_of, stdin_input

async def main() -> None:
    lines = lines_of(stdin_input(), max_line_bytes=100)
    print((await anext(lines)).decode(), flush=True)
    await asyncio.sleep(0.2)  # The reader thread is back in its read of the open pipe.

asyncio.run(main())
"""


def test_a_command_can_end_while_its_stdin_stays_open() -> None:
    """The reader thread read sys.stdin.buffer: blocked in read1 on a pipe still open, it held
    the BufferedReader's lock, and the interpreter's shutdown died on it (SIGABRT, "Fatal
    Python error: _enter_buffered_busy") when a command ended before its input did, as
    `tail -f log | bkaio stream write` does on Ctrl-C."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"first\n")  # The write end stays open: no EOF.
        child = subprocess.run(
            [sys.executable, "-c", CHILD],
            stdin=read_end,
            capture_output=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            check=False,
        )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert (child.returncode, child.stdout) == (0, b"first\n"), child.stderr.decode()
