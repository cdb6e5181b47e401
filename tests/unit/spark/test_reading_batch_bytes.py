"""A partition's Arrow record batches hold at most about the client's read_batch_bytes of payload
(one larger entry alone), whatever the entries' size: batchEntries (4096) entries of 1 MiB made
a 4 GiB batch, which pyarrow cannot hold in one binary column (it returns a ChunkedArray, and
building the RecordBatch fails) and an executor may not hold in memory at all.

The partition is read through `read_partition` on a connector runtime whose client runs over
fake bookies (SQLite metadata): a sealed segment (its size known when planning) and an open
one (unknown until read)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta import initialise_cluster_at, open_metadata
from bkaio.spark import catalog, reading
from bkaio.spark.options import parse_read_options
from bkaio.spark.runtime import Runtime
from bkaio.stream import StreamWriter, open_namespace
from tests.unit.ledger_client.fakes import FakeBookie, FakeBookieOps
from tests.unit.stream.conftest import BOOKIE_IDS

BOUND = 4000
PAYLOADS = [bytes([i]) * 1000 for i in range(20)]


async def fake_client(uri: str) -> BookKeeper:
    metadata = await open_metadata(uri)
    fakes = FakeBookieOps([FakeBookie(bookie_id) for bookie_id in BOOKIE_IDS])
    config = ClientConfig(add_timeout=0.5, read_timeout=0.5, explicit_lac_interval=0.005)
    client = BookKeeper(ledgers=metadata.ledgers, ops=fakes, config=config, metadata=metadata)
    client.set_bookies([fakes.info(bookie_id) for bookie_id in BOOKIE_IDS])
    return client


async def write(bk: BookKeeper) -> StreamWriter:
    """tenant/sealed (closed) and tenant/live (its writer left open), PAYLOADS each."""
    ns = await open_namespace(bk, "tenant", create=True)
    for name in ("sealed", "live"):
        writer = await ns.open_writer(name)
        for payload in PAYLOADS:
            await writer.write(payload)
        if name == "sealed":
            await writer.close()
    return writer


def test_record_batches_hold_at_most_about_read_batch_bytes(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    asyncio.run(initialise_cluster_at(uri))
    bk = runtime.run(fake_client(uri))

    @contextlib.asynccontextmanager
    async def the_fake_client(metadata_uri: str, options: object) -> AsyncIterator[BookKeeper]:
        yield bk

    monkeypatch.setattr(runtime, "client", the_fake_client)
    monkeypatch.setattr(reading, "get_runtime", lambda: runtime)
    writer = runtime.run(write(bk))
    options = parse_read_options(
        {
            "metadata": uri,
            "streams": "tenant/sealed,tenant/live",
            "bkaio.client.read_batch_bytes": str(BOUND),
        },
        streaming=False,
    )
    partitions = runtime.run(catalog.plan_batch(bk, options))
    batches = [batch for p in partitions for batch in reading.read_partition(options, p)]
    sizes = [sum(map(len, batch.column("payload").to_pylist())) for batch in batches]
    assert max(sizes) <= BOUND, sizes  # Was 20,000 (every entry of a stream in one batch).
    rows = [row for batch in batches for row in batch.to_pylist()]
    assert [(r["stream"], r["seq"], r["payload"]) for r in rows] == [
        (stream, seq, payload)
        for stream in ("tenant/live", "tenant/sealed")
        for seq, payload in enumerate(PAYLOADS)
    ]
    runtime.run(writer.close())
    runtime.run(bk.close())
