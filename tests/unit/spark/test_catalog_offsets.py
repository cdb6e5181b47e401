"""JSON offsets against the streams a query reads (fake bookies, SQLite metadata): a name the
query does not read is refused when the query is planned, as Kafka's source does, rather than
left to read its stream from the default bound."""

from __future__ import annotations

import pytest

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.spark import catalog
from bkaio.spark.errors import SparkOptionError
from bkaio.spark.options import parse_read_options
from bkaio.spark.planner import ReadRange
from bkaio.stream import open_namespace
from tests.unit.stream.conftest import ClientFactory

URI = "sqlite:///unused"


async def two_streams(bk: BookKeeper) -> None:
    """tenant/orders and tenant/refunds, five records each."""
    ns = await open_namespace(bk, "tenant", create=True)
    for stream in ("orders", "refunds"):
        writer = await ns.open_writer(stream)
        for i in range(5):
            await writer.write(b"%s-%d" % (stream.encode(), i))
        await writer.close()


def seqs(partitions: list[tuple[ReadRange, ...]]) -> dict[str, tuple[int, int]]:
    """(first seq, last seq) read of each stream."""
    read: dict[str, tuple[int, int]] = {}
    for r in (r for p in partitions for r in p):
        assert r.stream is not None
        last = r.first_seq + r.last_entry_id - r.first_entry_id
        first, previous = read.get(r.stream, (r.first_seq, last))
        read[r.stream] = (min(first, r.first_seq), max(previous, last))
    return read


@pytest.mark.parametrize(
    ("source", "offsets", "unknown", "read"),
    [
        (
            {"stream": "tenant/orders"},
            {"startingOffsets": '{"tenant/order": 3}'},
            "tenant/order",
            "tenant/orders",
        ),
        (
            {"streams": "tenant/orders,tenant/refunds"},
            {"endingOffsets": '{"tenant/orders": 2, "tenant/x": 1, "other/y": 1}'},
            "other/y, tenant/x",
            "tenant/orders, tenant/refunds",
        ),
        (
            {"streamsPattern": "tenant/ref.*"},
            {"startingOffsets": '{"tenant/orders": 1}'},
            "tenant/orders",
            "tenant/refunds",
        ),
        ({"streamsPattern": "none/.*"}, {"startingOffsets": '{"none/x": 1}'}, "none/x", "none"),
    ],
)
async def test_batch_offsets_naming_a_stream_not_read_are_refused(
    make_client: ClientFactory,
    source: dict[str, str],
    offsets: dict[str, str],
    unknown: str,
    read: str,
) -> None:
    bk = await make_client()
    await two_streams(bk)
    options = parse_read_options({"metadata": URI, **source, **offsets}, streaming=False)
    with pytest.raises(SparkOptionError, match=f"stream\\(s\\) {unknown} that .* reads: {read}"):
        await catalog.plan_batch(bk, options)


async def test_streaming_starting_offsets_naming_a_stream_not_read_are_refused(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    await two_streams(bk)
    options = parse_read_options(
        {"metadata": URI, "streamsPattern": "tenant/.*", "startingOffsets": '{"tenant/order": 2}'},
        streaming=True,
    )
    with pytest.raises(SparkOptionError, match="startingOffsets names stream\\(s\\) tenant/order"):
        await catalog.initial_offsets(bk, options)


async def test_offsets_naming_streams_read_still_apply(make_client: ClientFactory) -> None:
    bk = await make_client()
    await two_streams(bk)
    options = parse_read_options(
        {
            "metadata": URI,
            "streamsPattern": "tenant/.*",
            "startingOffsets": '{"tenant/orders": 2}',  # refunds: earliest.
            "endingOffsets": '{"tenant/refunds": 4}',  # orders: latest.
        },
        streaming=False,
    )
    assert seqs(await catalog.plan_batch(bk, options)) == {
        "tenant/orders": (2, 4),
        "tenant/refunds": (0, 3),
    }
    streaming = parse_read_options(
        {"metadata": URI, "streamsPattern": "tenant/.*", "startingOffsets": '{"tenant/orders": 2}'},
        streaming=True,
    )
    assert await catalog.initial_offsets(bk, streaming) == {"tenant/orders": 2, "tenant/refunds": 0}
