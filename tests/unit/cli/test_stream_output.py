"""What `bkaio stream write` and `bkaio stream tail` print (bkaio/cli/stream_cmd.py): the same
lines as ever, in order, written off the event loop so a slow reader of stdout does not stop it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable

import pytest

from bkaio.cli.output import StdoutClosed
from bkaio.cli.stream_cmd import _show_records, _write_pipelined
from bkaio.stream import Namespace, open_namespace
from tests.unit.stream.conftest import ClientFactory

GUARD_SECONDS = 20.0  # Only a write that blocks the loop waits this long.


async def namespace_with(make_client: ClientFactory, payloads: list[bytes]) -> Namespace:
    ns = await open_namespace(await make_client(), "tenant", create=True)
    writer = await ns.open_writer("s")
    await asyncio.gather(*(writer.write(payload) for payload in payloads))
    await writer.close()
    return ns


async def given(records: list[bytes]) -> AsyncIterator[bytes]:
    for record in records:
        yield record


class SlowPipe(io.StringIO):
    """A stdout whose reader is slow: a write returns once the event loop has run the test's
    "drain" (a write on the loop's thread blocks the loop, so it waits out GUARD_SECONDS)."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.drained = threading.Event()
        self.blocked_the_loop = False

    def write(self, text: str) -> int:
        self.writing.set()
        if not self.drained.wait(GUARD_SECONDS):
            self.blocked_the_loop = True
        return super().write(text)


async def print_through_a_slow_pipe(out: SlowPipe, printing: Awaitable[None]) -> None:
    task = asyncio.ensure_future(printing)
    # Resumes only if the loop runs while the write waits on the pipe.
    assert await asyncio.to_thread(out.writing.wait, GUARD_SECONDS)
    out.drained.set()
    await task
    assert not out.blocked_the_loop, "a write to stdout blocked the event loop"


async def test_tail_prints_each_record_once_in_order(
    make_client: ClientFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = await namespace_with(make_client, [b"r%d" % i for i in range(2500)])
    async with await ns.open_reader("s") as reader:
        await _show_records(
            reader, end=2500, max_count=None, ack=False, as_hex=False, as_json=False
        )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[1] for line in lines] == [f"r{i}" for i in range(2500)]
    assert all(line.split("\t")[0].endswith(f"@{i}") for i, line in enumerate(lines))


async def test_tail_stops_at_its_count_in_hex_json_and_acks_what_it_printed(
    make_client: ClientFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = await namespace_with(make_client, [b"one", b"two", b"three"])
    async with await ns.open_reader("s", cursor="c1") as reader:
        await _show_records(reader, end=None, max_count=2, ack=True, as_hex=True, as_json=True)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["seq"], line["payload"]) for line in lines] == [
        (0, "hex:6f6e65"),
        (1, "hex:74776f"),
    ]
    async with await ns.open_reader("s", cursor="c1") as reader:  # Resumes after the ack.
        await _show_records(reader, end=3, max_count=None, ack=True, as_hex=False, as_json=False)
    assert capsys.readouterr().out.endswith("@2\tthree\n")


async def test_write_prints_each_position_once_in_order(
    make_client: ClientFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = await open_namespace(await make_client(), "tenant", create=True)
    writer = await ns.open_writer("s")
    await _write_pipelined(writer, given([b"r%d" % i for i in range(1500)]), 100, False)
    await _write_pipelined(writer, given([b"last"]), 100, True)
    await writer.close()
    *text, last = capsys.readouterr().out.splitlines()
    assert [line.rpartition("@")[2] for line in text] == [str(i) for i in range(1500)]
    assert json.loads(last)["seq"] == 1500 and json.loads(last)["position"].endswith("@1500")


async def test_write_with_a_window_wider_than_the_ledgers_bound_waits_for_room(
    make_client: ClientFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # A window of 100 against a handle (and a roll's hold) taking 2 + 3 at once: a write was
    # refused with TooManyRequestsError, failing the command as if its input were bad.
    client = await make_client(max_outstanding_adds=2, max_queued_adds=3)
    ns = await open_namespace(client, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=64)  # Rolls hold the writes that come.
    await _write_pipelined(writer, given([b"r%d" % i for i in range(50)]), 100, False)
    await writer.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.rpartition("@")[2] for line in lines] == [str(i) for i in range(50)]


async def test_a_slow_stdout_does_not_block_the_loop_while_tail_prints(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = await namespace_with(make_client, [b"one", b"two"])
    out = SlowPipe()
    monkeypatch.setattr(sys, "stdout", out)
    async with await ns.open_reader("s") as reader:
        printing = _show_records(
            reader, end=2, max_count=None, ack=False, as_hex=False, as_json=False
        )
        await print_through_a_slow_pipe(out, printing)
    assert [line.split("\t")[1] for line in out.getvalue().splitlines()] == ["one", "two"]


async def test_a_slow_stdout_does_not_block_the_loop_while_write_prints(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = await open_namespace(await make_client(), "tenant", create=True)
    writer = await ns.open_writer("s")
    out = SlowPipe()
    monkeypatch.setattr(sys, "stdout", out)
    await print_through_a_slow_pipe(out, _write_pipelined(writer, given([b"a", b"b"]), 10, False))
    await writer.close()
    assert [line.rpartition("@")[2] for line in out.getvalue().splitlines()] == ["0", "1"]


async def test_tail_into_a_closed_stdout_stops_with_stdout_closed_and_acks_nothing(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `bkaio stream tail NS/S --cursor C | head`: the command stopped with a silent exit 1 (click's
    # answer to any BrokenPipeError); StdoutClosed makes it exit 141 quietly (bkaio/cli/main.py).
    ns = await namespace_with(make_client, [b"one", b"two"])
    read_end, write_end = os.pipe()
    os.close(read_end)
    out = os.fdopen(write_end, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    try:
        async with await ns.open_reader("s", cursor="c1") as reader:
            with pytest.raises(StdoutClosed):
                await _show_records(
                    reader, end=2, max_count=None, ack=True, as_hex=False, as_json=False
                )
    finally:
        monkeypatch.undo()
        with contextlib.suppress(BrokenPipeError):  # What was buffered for the closed pipe.
            out.close()
    async with await ns.open_reader("s", cursor="c1") as reader:  # Nothing shown, nothing acked.
        assert reader.next_seq == 0
