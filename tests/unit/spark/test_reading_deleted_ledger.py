"""A ledger deleted after a partition opened it for reading is data loss like one deleted before
(DataLossError with failOnDataLoss=true, skipped with a warning with false): its bookies drop
its entries at their next GC and answer "no such entry", which reached the query as the
client's NoSuchEntryError, so failOnDataLoss=false did not skip it. An entry missing from a
ledger that still exists is not data loss of that kind: the client's error stays."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from bkaio.errors import NoSuchEntryError
from bkaio.ledger_client import ReadHandle
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.spark import reading
from bkaio.spark.errors import DataLossError
from bkaio.spark.planner import ReadRange
from bkaio.stream import open_namespace
from bkaio.stream.segments import STREAM_PASSWORD
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.ledger_client.fakes import FakeBookieOps
from tests.unit.stream.conftest import ClientFactory


async def sealed_range(bk: BookKeeper) -> ReadRange:
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("orders")
    for i in range(5):
        await writer.write(f"record {i}".encode())
    await writer.close()
    stream = await StreamStore(metadata_of(bk)).get_stream("tenant", "orders")
    (segment,) = stream.segments
    return ReadRange("tenant/orders", segment.ledger_id, 0, 4, 0, 40, STREAM_PASSWORD)


def lose_ledger_once_opened(
    bk: BookKeeper, fakes: FakeBookieOps, monkeypatch: pytest.MonkeyPatch, *, delete: bool
) -> None:
    """`bk.open_ledger` opens, then the bookies lose the ledger's entries (GC), its metadata
    deleted too when `delete`."""
    opened = bk.open_ledger

    async def open_then_lose(ledger_id: int, **kwargs: object) -> ReadHandle:
        handle = await opened(ledger_id, **kwargs)  # type: ignore[arg-type]
        if delete:
            await bk.delete_ledger(ledger_id)
        for bookie in fakes.bookies.values():
            bookie.ledgers.pop(ledger_id, None)
        return handle

    monkeypatch.setattr(bk, "open_ledger", open_then_lose)


async def read_all(bk: BookKeeper, item: ReadRange, fail_on_data_loss: bool) -> list[bytes]:
    return [
        entry.payload
        async for batch in reading.read_entries(bk, item, 2, fail_on_data_loss, batch_bytes=1000)
        for entry in batch
    ]


async def test_a_ledger_deleted_once_opened_is_data_loss(
    make_client: ClientFactory, fake_bookies: FakeBookieOps, monkeypatch: pytest.MonkeyPatch
) -> None:
    bk = await make_client()
    item = await sealed_range(bk)
    lose_ledger_once_opened(bk, fake_bookies, monkeypatch, delete=True)
    with pytest.raises(DataLossError, match=rf"ledger {item.ledger_id} .* while it was read"):
        await read_all(bk, item, True)


async def test_with_fail_on_data_loss_false_it_is_skipped_with_a_warning(
    make_client: ClientFactory, fake_bookies: FakeBookieOps, monkeypatch: pytest.MonkeyPatch
) -> None:
    bk = await make_client()
    item = await sealed_range(bk)
    lose_ledger_once_opened(bk, fake_bookies, monkeypatch, delete=True)
    with capture_logs() as logs:
        assert await read_all(bk, item, False) == []
    skipped = [e for e in logs if e["event"] == "spark_read_skips_deleted_ledger"]
    assert [(e["log_level"], e["ledger_id"]) for e in skipped] == [("warning", item.ledger_id)]


async def test_entries_missing_from_a_ledger_that_exists_keep_the_clients_error(
    make_client: ClientFactory, fake_bookies: FakeBookieOps, monkeypatch: pytest.MonkeyPatch
) -> None:
    bk = await make_client()
    item = await sealed_range(bk)
    lose_ledger_once_opened(bk, fake_bookies, monkeypatch, delete=False)
    with pytest.raises(NoSuchEntryError):
        await read_all(bk, item, False)
