"""Lines of a binary input as they arrive, for commands that stream stdin (`stream write`).

`for line in sys.stdin` in a coroutine would block the event loop, and reading everything
first means `tail -f log | bkaio stream write` never writes. A daemon thread reads whatever is
there (`read1` returns as soon as a pipe has data) and hands the chunks to the loop, a few at
a time, so a slow consumer slows the reading down instead of filling memory; the
thread is a daemon because a read of a pipe that never closes cannot be interrupted, and the
command must still be able to exit. Works for pipes, terminals and regular files alike.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import AsyncIterator
from typing import Protocol

from bkaio.errors import BKError

_CHUNK_BYTES = 1 << 16
_QUEUED_CHUNKS = 4


class ReadsChunks(Protocol):
    """A binary input (`sys.stdin.buffer`, an io.BytesIO): `read1` returns what is there."""

    def read1(self, size: int = ..., /) -> bytes: ...


class DescriptorInput:
    """Reads a file descriptor with os.read: the stdin `lines_of` reads. Not sys.stdin.buffer:
    its reader thread, blocked in BufferedReader.read1 on a pipe that stays open, holds the
    buffer's lock, and the interpreter's shutdown then dies on it ("Fatal Python error:
    _enter_buffered_busy: could not acquire lock for <_io.BufferedReader name='<stdin>'>",
    SIGABRT) when the command ends before its input does (Ctrl-C on `tail -f log | bkaio
    stream write`, a failed write)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read1(self, size: int = _CHUNK_BYTES, /) -> bytes:
        return os.read(self._fd, size if size > 0 else _CHUNK_BYTES)


def stdin_input() -> ReadsChunks:
    """This process's stdin, for `lines_of`."""
    return DescriptorInput(sys.stdin.fileno())


class LineTooLongError(BKError):
    """A line of input is longer than the largest record the command may send."""


async def lines_of(source: ReadsChunks, *, max_line_bytes: int) -> AsyncIterator[bytes]:
    """Each line of `source` without its line end ("\\n" or "\\r\\n"), as soon as it is complete;
    a last line without a line end too. LineTooLongError past `max_line_bytes`."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
    slots = threading.Semaphore(_QUEUED_CHUNKS)  # Chunks read and not yet taken, at most.

    def read_forever() -> None:
        while True:
            slots.acquire()  # Waits while the consumer is behind (or gone: a daemon waits).
            item: bytes | BaseException
            try:
                item = source.read1(_CHUNK_BYTES)
            except BaseException as error:  # Any: a thread that just ended would leave the
                item = error  # command waiting for ever; the command raises it instead.
            try:
                loop.call_soon_threadsafe(chunks.put_nowait, item)
            except RuntimeError:  # The loop is closed: the command ended.
                return
            if isinstance(item, BaseException) or not item:
                return

    threading.Thread(target=read_forever, name="stdin-reader", daemon=True).start()
    pending = bytearray()
    number = 0
    while True:
        chunk = await chunks.get()
        slots.release()
        if isinstance(chunk, BaseException):
            raise chunk  # What reading raised in the thread (an OSError, or any other failure).
        if not chunk:
            break
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            number += 1
            yield _check(bytes(pending[start:end]).removesuffix(b"\r"), number, max_line_bytes)
            start = end + 1
        del pending[:start]
        if len(pending) > max_line_bytes:
            raise LineTooLongError(f"line {number + 1} is longer than {max_line_bytes} bytes")
    if pending:
        yield _check(bytes(pending).removesuffix(b"\r"), number + 1, max_line_bytes)


def _check(line: bytes, number: int, max_line_bytes: int) -> bytes:
    if len(line) > max_line_bytes:
        raise LineTooLongError(f"line {number} is longer than {max_line_bytes} bytes")
    return line
