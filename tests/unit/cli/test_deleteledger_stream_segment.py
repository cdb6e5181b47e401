"""`bkaio shell deleteledger L` refuses (exit 1, naming the stream) a ledger a stream's record
names as a segment, unless --force: it deleted it, and the stream then failed every read from
that segment on (StreamSegmentUnreadableError at seq 0), its records lost. A stream's ledger no
record names (an orphan) and a plain ledger are deleted as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bkaio.cli.main import main
from bkaio.errors import NoSuchLedgerError
from bkaio.stream import open_namespace
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_orphans import crash_between_create_and_cas


async def test_a_stream_segment_needs_force(
    make_client: ClientFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bk = await make_client()
    namespace = await open_namespace(bk, "tenant", create=True)
    writer = await namespace.open_writer("orders")
    await asyncio.gather(*(writer.write(b"r%d" % i) for i in range(3)))
    await writer.close()
    [segment] = (await namespace.stream_metadata("orders")).segments
    orphan = await crash_between_create_and_cas(bk, "orders", 2)
    plain = await bk.create_ledger(1, 1, 1, password=b"")
    await plain.close()
    base = ["shell", "deleteledger", "--metadata", f"sqlite://{tmp_path / 'meta.db'}"]

    def bkaio(*args: str) -> int:
        return main([*base, *args])

    assert await asyncio.to_thread(bkaio, str(segment.ledger_id)) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith(
        f"bkaio: LedgerNamedByStreamError: ledger {segment.ledger_id} is a segment of stream "
        "tenant/orders (seq 0..2): deleting it loses its records"
    ), captured.err
    await bk.get_ledger_metadata(segment.ledger_id)  # Still there.

    for ledger_id in (orphan, plain.ledger_id):
        assert await asyncio.to_thread(bkaio, str(ledger_id)) == 0
    assert await asyncio.to_thread(bkaio, str(segment.ledger_id), "--force") == 0
    for ledger_id in (segment.ledger_id, orphan, plain.ledger_id):
        with pytest.raises(NoSuchLedgerError):
            await bk.get_ledger_metadata(ledger_id)
