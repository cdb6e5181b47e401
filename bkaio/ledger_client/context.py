"""What every handle of one `BookKeeper` client shares: bookie ops, metadata, placement, config.

Imports no transport code; the concrete pieces are chosen by `BookKeeper` (or by a test).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bkaio.ledger_client.placement import BookieCandidate, PlacementPolicy
from bkaio.ledger_client.types import BookieOps, ClientConfig
from bkaio.meta.ledger_metadata import LedgerMetadata


class LedgerStore(Protocol):
    """The part of `bkaio.meta.LedgerManager` the client uses (docs/internal-apis.md)."""

    async def next_id(self) -> int:
        """A fresh ledger id: the master key depends on it, so it is taken before `create`."""
        ...

    async def create(self, metadata: LedgerMetadata) -> LedgerMetadata: ...

    async def get(self, ledger_id: int) -> LedgerMetadata: ...

    async def update(self, metadata: LedgerMetadata) -> LedgerMetadata: ...

    async def delete(self, ledger_id: int) -> None: ...

    def list_ids(self) -> AsyncIterator[int]: ...


@dataclass(slots=True)
class ClientContext:
    """Shared by the handles of one client."""

    ops: BookieOps
    ledgers: LedgerStore
    placement: PlacementPolicy
    bookies: Callable[[], Sequence[BookieCandidate]]  # Registered bookies, current view.
    config: ClientConfig
    # Jitter of retry delays (ensemble changes): seeded with the placement's in simulations.
    rng: random.Random = field(default_factory=random.Random)
