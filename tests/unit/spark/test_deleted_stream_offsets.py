"""A stream a running streaming query reads is deleted (fake bookies, SQLite metadata): the
next `latestOffset` fails with DataLossError when failOnDataLoss is true, as documented (the
records written after the last offset and before the deletion were never read), and goes on
without the stream when it is false, whether the query names its streams or matches them."""

from __future__ import annotations

import pytest

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.spark import catalog
from bkaio.spark.errors import DataLossError
from bkaio.spark.options import parse_read_options
from bkaio.stream import open_namespace
from tests.unit.stream.conftest import ClientFactory

URI = "sqlite:///unused"
SOURCES = [{"streams": "tenant/orders,tenant/refunds"}, {"streamsPattern": "tenant/.*"}]


async def two_streams(bk: BookKeeper) -> None:
    ns = await open_namespace(bk, "tenant", create=True)
    for stream in ("orders", "refunds"):
        writer = await ns.open_writer(stream)
        for i in range(3):
            await writer.write(b"%d" % i)
        await writer.close()


@pytest.mark.parametrize("source", SOURCES)
async def test_a_deleted_stream_fails_the_query_when_data_loss_fails_it(
    make_client: ClientFactory, source: dict[str, str]
) -> None:
    bk = await make_client()
    await two_streams(bk)
    options = parse_read_options({"metadata": URI, **source}, streaming=True)
    known = {"tenant/orders": 1, "tenant/refunds": 1}
    await (await open_namespace(bk, "tenant")).delete_stream("refunds")
    with pytest.raises(DataLossError, match="stream tenant/refunds was deleted"):
        await catalog.latest_offsets(bk, options, known)


@pytest.mark.parametrize("source", SOURCES)
async def test_a_deleted_stream_is_left_behind_when_data_loss_is_allowed(
    make_client: ClientFactory, source: dict[str, str]
) -> None:
    bk = await make_client()
    await two_streams(bk)
    options = parse_read_options(
        {"metadata": URI, "failOnDataLoss": "false", **source}, streaming=True
    )
    known = {"tenant/orders": 1, "tenant/refunds": 1}
    await (await open_namespace(bk, "tenant")).delete_stream("refunds")
    start, end, _ = await catalog.latest_offsets(bk, options, known)
    assert (start, end) == (known, {"tenant/orders": 3, "tenant/refunds": 1})


async def test_a_stream_deleted_between_listing_and_reading_it_is_not_a_key_error(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pattern's match found by the listing, deleted before its record is read: the query
    never knew it, so it just does not read it."""
    bk = await make_client()
    await two_streams(bk)
    options = parse_read_options({"metadata": URI, "streamsPattern": "tenant/.*"}, streaming=True)
    real = catalog.resolve_streams

    async def listed_then_deleted(bk: BookKeeper, options: object) -> list[str]:
        names = await real(bk, options)  # type: ignore[arg-type]
        await (await open_namespace(bk, "tenant")).delete_stream("refunds")
        return names

    monkeypatch.setattr(catalog, "resolve_streams", listed_then_deleted)
    start, end, _ = await catalog.latest_offsets(bk, options, {"tenant/orders": 1})
    assert (start, end) == ({"tenant/orders": 1}, {"tenant/orders": 3})


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
async def test_a_stream_deleted_and_created_again_behind_the_offset_is_data_loss(
    make_client: ClientFactory, fail_on_data_loss: str
) -> None:
    """Its seqs start again at 0: the records the new stream holds below the query's offset
    would never be read. Its end behind the offset (which no stream's end can move back
    from) says so."""
    bk = await make_client()
    await two_streams(bk)
    options = parse_read_options(
        {"metadata": URI, "stream": "tenant/orders", "failOnDataLoss": fail_on_data_loss},
        streaming=True,
    )
    ns = await open_namespace(bk, "tenant")
    await ns.delete_stream("orders")
    writer = await ns.open_writer("orders")
    await writer.write(b"new 0")
    await writer.close()
    if fail_on_data_loss == "true":
        with pytest.raises(DataLossError, match=r"tenant/orders ends at seq 1, before .* seq 3"):
            await catalog.latest_offsets(bk, options, {"tenant/orders": 3})
    else:
        start, end, _ = await catalog.latest_offsets(bk, options, {"tenant/orders": 3})
        assert (start, end) == ({"tenant/orders": 3}, {"tenant/orders": 3})
