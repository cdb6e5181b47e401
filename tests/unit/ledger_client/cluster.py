"""A client wired to FakeBookies and a FakeLedgerStore, for the ledger client's unit tests."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.ledger_client.types import ClientConfig
from tests.unit.ledger_client.fakes import FakeBookie, FakeBookieOps, FakeLedgerStore


@dataclass
class FakeCluster:
    client: BookKeeper
    ops: FakeBookieOps
    store: FakeLedgerStore

    def bookie(self, bookie_id: str) -> FakeBookie:
        return self.ops.bookies[bookie_id]

    def second_client(self, **options: Any) -> BookKeeper:
        """Another client of the same bookies and metadata (a recoverer, a reader)."""
        config = ClientConfig(**{"add_timeout": 0.2, "read_timeout": 0.2, **options})
        other = BookKeeper(ledgers=self.store, ops=self.ops, config=config, rng=random.Random(2))
        other.set_bookies(self.client.bookies)
        return other


def fake_cluster(bookies: int = 3, racks: list[str] | None = None, **options: Any) -> FakeCluster:
    ids = [f"127.0.0.1:{3181 + 10 * i}" for i in range(bookies)]
    ops = FakeBookieOps([FakeBookie(bookie_id) for bookie_id in ids])
    store = FakeLedgerStore()
    config = ClientConfig(**{"add_timeout": 0.2, "read_timeout": 0.2, **options})
    client = BookKeeper(ledgers=store, ops=ops, config=config, rng=random.Random(1))
    client.set_bookies(
        [ops.info(b, racks[i] if racks else "/default-rack") for i, b in enumerate(ids)]
    )
    return FakeCluster(client, ops, store)
