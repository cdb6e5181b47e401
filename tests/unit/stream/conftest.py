"""Stream clients over in-process FakeBookies and a real SQLite metadata file in tmp_path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta import initialise_cluster_at, open_metadata
from tests.unit.ledger_client.fakes import FakeBookie, FakeBookieOps

BOOKIE_IDS = [f"127.0.0.1:{3181 + 10 * i}" for i in range(3)]

ClientFactory = Callable[..., Awaitable[BookKeeper]]


@pytest.fixture
def fake_bookies() -> FakeBookieOps:
    return FakeBookieOps([FakeBookie(bookie_id) for bookie_id in BOOKIE_IDS])


@pytest.fixture
async def make_client(tmp_path: Path, fake_bookies: FakeBookieOps) -> AsyncIterator[ClientFactory]:
    """Clients sharing the same fake bookies and metadata (a writer, a second writer, a reader)."""
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    await initialise_cluster_at(uri)
    clients: list[BookKeeper] = []

    async def make(**options: Any) -> BookKeeper:
        metadata = await open_metadata(uri)
        settings = {"add_timeout": 0.5, "read_timeout": 0.5, "explicit_lac_interval": 0.005}
        config = ClientConfig(**{**settings, **options})
        client = BookKeeper(
            ledgers=metadata.ledgers, ops=fake_bookies, config=config, metadata=metadata
        )
        client.set_bookies([fake_bookies.info(bookie_id) for bookie_id in BOOKIE_IDS])
        clients.append(client)
        return client

    try:
        yield make
    finally:
        for client in clients:
            await client.close()
