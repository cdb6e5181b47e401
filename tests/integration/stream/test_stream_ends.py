"""Streams read exactly what was acknowledged: "latest", `tail --no-follow`, `write` from a pipe.

Real bookies; the writers run with explicit LAC off, so the bookies' LAC lags every
acknowledged record that went out in a burst: a reader or a tail that trusted it would
re-deliver old records or stop early. The CLI runs as a real `bkaio` process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator

import pytest

from bkaio import BookKeeper  # The facade: ledgers and namespaces.
from bkaio.stream import open_namespace
from tests.fixtures.bookies import BookieCluster, running_on_own_loop

_GUARD_SECONDS = 120.0  # Hang guard only.


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieCluster]:
    """Three bookies started once for the module, on an event loop of its own (the tests'
    loops are per test): each test writes a namespace of its own and none stops a bookie."""
    base = tmp_path_factory.mktemp("stream-ends")
    bookies = BookieCluster(f"sqlite://{base / 'meta.db'}", base, count=3)
    with running_on_own_loop(bookies):
        yield bookies


async def _bkaio(uri: str, *args: str, stdin: int | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bkaio.cli",
        *args,
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "BKAIO_METADATA": uri},
    )


async def test_a_reader_at_latest_delivers_none_of_the_records_acknowledged_before(
    cluster: BookieCluster,
) -> None:
    uri = cluster.metadata_uri
    async with (
        BookKeeper.connect(uri, explicit_lac_interval=0) as writer_bk,
        BookKeeper.connect(uri) as reader_bk,
    ):
        ns = await writer_bk.namespace("tenant-latest", create=True)
        writer = await ns.open_writer("s")
        old = await asyncio.gather(*(writer.write(b"old-%d" % i) for i in range(10)))
        assert [p.seq for p in old] == list(range(10))
        reader_ns = await open_namespace(reader_bk, "tenant-latest")
        async with await reader_ns.open_reader("s", start="latest") as reader:
            assert reader.next_seq == 10
            for i in range(5):  # One by one: each carries the LAC of the one before.
                await writer.write(b"new-%d" % i)
            async with asyncio.timeout(_GUARD_SECONDS):
                records = [await reader.__anext__() for _ in range(4)]
            assert [r.payload for r in records] == [b"new-%d" % i for i in range(4)]
            assert [r.position.seq for r in records] == [10, 11, 12, 13]
        await writer.close()


async def test_tail_no_follow_prints_every_acknowledged_record_then_names_a_lost_segment(
    cluster: BookieCluster,
) -> None:
    uri = cluster.metadata_uri
    payloads = [b"record-%05d" % i for i in range(20_000)]
    async with BookKeeper.connect(uri, explicit_lac_interval=0) as bk:
        ns = await bk.namespace("tenant-tail", create=True)
        # Several sealed segments and an open one whose end the bookies' LAC does not show.
        writer = await ns.open_writer("s", roll_bytes=60_000)
        positions = await asyncio.gather(*(writer.write(p) for p in payloads))
        assert positions[-1].seq == 19_999
        meta = await ns.stream_metadata("s")
        assert len(meta.segments) >= 3 and meta.open_segment is not None

        tail = await _bkaio(uri, "stream", "tail", "tenant-tail/s", "--no-follow")
        async with asyncio.timeout(_GUARD_SECONDS):
            stdout, stderr = await tail.communicate()
        assert tail.returncode == 0, stderr.decode()
        printed = [line.split("\t", 1)[1].encode() for line in stdout.decode().splitlines()]
        assert len(printed) == 20_000 and printed == payloads

        lost = meta.segments[1]
        await bk.delete_ledger(lost.ledger_id)
        tail = await _bkaio(uri, "stream", "tail", "tenant-tail/s", "--no-follow")
        async with asyncio.timeout(_GUARD_SECONDS):
            stdout, stderr = await tail.communicate()
        assert tail.returncode == 1
        error = stderr.decode()
        assert (
            f"segment ledger {lost.ledger_id} (records {lost.first_seq}..{lost.last_seq})" in error
        )
        assert "cannot be read" in error and error.count("\n") == 1  # One line, no traceback.
        assert len(stdout.decode().splitlines()) == lost.first_seq  # Everything before it.
        await writer.close()


async def test_stream_write_sends_lines_as_they_arrive_and_closes_at_eof(
    cluster: BookieCluster,
) -> None:
    uri = cluster.metadata_uri
    async with BookKeeper.connect(uri) as bk:
        ns = await bk.namespace("tenant-write", create=True)
        await ns.create_stream("s")
        write = await _bkaio(
            uri, "stream", "write", "tenant-write/s", stdin=asyncio.subprocess.PIPE
        )
        assert write.stdin is not None and write.stdout is not None
        write.stdin.write(b"first\nsecond\r\nthird\n")
        await write.stdin.drain()  # The pipe stays open: no EOF yet.
        async with asyncio.timeout(_GUARD_SECONDS):
            shown = [await write.stdout.readline() for _ in range(3)]
            reader = await ns.open_reader("s", start="earliest")
            records = [await reader.__anext__() for _ in range(3)]
        assert [r.payload for r in records] == [b"first", b"second", b"third"]
        assert [line.decode().strip() for line in shown] == [str(r.position) for r in records]
        assert write.returncode is None  # Still running, waiting for more lines.
        write.stdin.write(b"last")  # A last line without a line end counts too.
        write.stdin.close()
        async with asyncio.timeout(_GUARD_SECONDS):
            rest, stderr = await write.communicate()
            assert write.returncode == 0, stderr.decode()
            assert (await reader.__anext__()).payload == b"last"
        assert len(rest.decode().splitlines()) == 1
        meta = await ns.stream_metadata("s")
        assert meta.open_segment is None  # EOF flushed and closed (sealed) the writer.

        # Bad input: a line that is not hex stops the command with its number; the records
        # before it were written and are kept.
        bad = await _bkaio(
            uri, "stream", "write", "tenant-write/s", "--hex", stdin=asyncio.subprocess.PIPE
        )
        async with asyncio.timeout(_GUARD_SECONDS):
            out, stderr = await bad.communicate(b"aa\nzz\nbb\n")
        assert bad.returncode == 2 and "record 2 is not hex" in stderr.decode()
        assert len(out.decode().splitlines()) == 1
        async with asyncio.timeout(_GUARD_SECONDS):
            assert (await reader.__anext__()).payload == b"\xaa"
        assert (await ns.stream_metadata("s")).open_segment is None
        await reader.close()
