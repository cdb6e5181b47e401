"""A writer dying mid-roll, and writers opening at once: seqs stay dense, one writer wins."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bkaio.errors import LedgerFencedError
from bkaio.ledger_client import ReadHandle
from bkaio.stream import open_namespace
from bkaio.stream.model import StreamMeta
from bkaio.stream.reader import StreamReader
from bkaio.stream.writer import StreamWriter
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_streams import take


async def test_crash_after_a_roll_leaves_an_empty_open_segment_and_seqs_go_on(
    make_client: ClientFactory,
) -> None:
    first_client, second_client = await make_client(), await make_client()
    ns = await open_namespace(first_client, "tenant", create=True)
    crashed = await ns.open_writer("s", roll_bytes=10)
    await ns.create_stream("s")
    reader = await ns.open_reader("s", long_poll_seconds=0.2)
    acked = [await crashed.write(b"0123456789")]  # Reaches roll_bytes: rolls.
    await crashed.wait_for_capacity()  # The roll is done: the new segment is open and empty.
    meta = await ns.stream_metadata("s")
    assert meta.open_segment is not None and meta.open_segment.ledger_id != acked[0].ledger_id
    ns2 = await open_namespace(second_client, "tenant")
    new = await ns2.open_writer("s")
    later = await new.write(b"after")
    assert later.seq == 1
    records = await take(reader, 2)
    assert [r.position for r in records] == [acked[0], later]
    await new.close()
    await reader.close()


async def test_crash_between_sealing_and_recording_a_roll(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_client, second_client = await make_client(), await make_client()
    ns = await open_namespace(first_client, "tenant", create=True)
    crashed = await ns.open_writer("s", roll_bytes=25)
    reader = await ns.open_reader("s", long_poll_seconds=0.2)
    reached, never = asyncio.Event(), asyncio.Event()

    async def stuck(self: StreamWriter, *args: object) -> None:
        reached.set()
        await never.wait()  # The writer dies here: ledger sealed, next created, no CAS.

    monkeypatch.setattr(StreamWriter, "_cas_segments", stuck)
    acked = [await crashed.write(b"%010d" % i) for i in range(3)]  # The third starts the roll.
    held = crashed.write(b"held, never sent")
    # The roll runs as a job of its own: the second writer opens once it sealed the ledger and
    # created the next (had it opened first, its recovery would fence the roll's seal).
    await reached.wait()
    new = await (await open_namespace(second_client, "tenant")).open_writer("s")
    later = await new.write(b"after")
    assert later.seq == 3
    records = await take(reader, 4)
    assert [r.position for r in records] == [*acked, later]
    assert not held.done()
    held.cancel()
    monkeypatch.undo()
    await new.close()
    await reader.close()


async def test_two_writers_opening_at_once_leave_one_owner_and_dense_seqs(
    make_client: ClientFactory,
) -> None:
    clients = [await make_client() for _ in range(3)]
    spaces = [await open_namespace(c, "tenant", create=True) for c in clients]
    first = await spaces[0].open_writer("s")
    await first.write(b"first")
    writers = await asyncio.gather(*(ns.open_writer("s") for ns in spaces[1:]))
    results = await asyncio.gather(*(w.write(b"w") for w in writers), return_exceptions=True)
    won = [w for w, r in zip(writers, results, strict=True) if not isinstance(r, BaseException)]
    assert len(won) == 1, results
    assert [type(r) for r in results if isinstance(r, BaseException)] == [LedgerFencedError]
    await won[0].close()
    async with await spaces[0].open_reader("s") as reader:
        records = await take(reader, 2)
    assert [r.position.seq for r in records] == [0, 1]


async def test_a_reader_opening_the_open_ledger_as_a_new_writer_seals_it_carries_on(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader picks the open segment from its view of the record and opens its ledger;
    meanwhile a new writer recovers (seals) that ledger, records the next segment, and the
    watch brings that change. The reader then finds the ledger sealed and waits for a change
    of the record: it waited for the change after that one, which never came."""
    reader_client, first_client, second_client = [await make_client() for _ in range(3)]
    await (await open_namespace(first_client, "tenant", create=True)).open_writer("s")
    ns = await open_namespace(reader_client, "tenant")
    reader = await ns.open_reader("s", long_poll_seconds=0.2)
    opening, opened = asyncio.Event(), asyncio.Event()
    real_open = reader_client.open_ledger

    async def open_after_the_change(ledger_id: int, **options: Any) -> ReadHandle:
        opening.set()
        await opened.wait()
        return await real_open(ledger_id, **options)

    monkeypatch.setattr(reader_client, "open_ledger", open_after_the_change)
    real_seen = StreamReader._seen
    seen_new_writer = asyncio.Event()

    def seen(self: StreamReader, meta: StreamMeta | None) -> None:
        real_seen(self, meta)
        if meta is not None and meta.epoch == 2:
            seen_new_writer.set()

    monkeypatch.setattr(StreamReader, "_seen", seen)
    reading = asyncio.create_task(take(reader, 1))
    await opening.wait()  # The reader's view: the first writer's segment, open.
    new = await (await open_namespace(second_client, "tenant")).open_writer("s")
    written = await new.write(b"after")
    await seen_new_writer.wait()  # The watch brought the sealed segment and the next.
    opened.set()
    [record] = await reading
    assert (record.position, record.payload) == (written, b"after")
    monkeypatch.undo()
    await new.close()
    await reader.close()
