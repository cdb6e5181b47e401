"""Recovering an open ledger no live bookie holds the master key of: a retryable error, never a
fence with a made-up key (refused by bookies that check keys against the metadata, and
recorded for good by bookies that take the first key they see)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from bkaio.autorecovery.cluster import ClusterView, MasterKeys
from bkaio.autorecovery.fragments import ReplicationError
from bkaio.autorecovery.metrics import AutorecoveryMetrics
from bkaio.autorecovery.replicator import Replicator
from bkaio.meta import Metadata
from bkaio.meta.ledger_metadata import LedgerMetadata
from bkaio.testing.sim.meta import MemoryMetadataServer, MemoryMetadataStore


class FakeMasterKeysNobodyHolds(MasterKeys):
    """MasterKeys whose every live bookie answered that it holds no key for the ledger."""

    async def master_key(self, metadata: LedgerMetadata) -> bytes | None:
        return None


async def test_an_open_ledger_whose_key_no_live_bookie_holds_is_retried_not_fenced() -> None:
    store = MemoryMetadataStore(MemoryMetadataServer())
    view = ClusterView(Metadata(store, "test-instance", id_block_size=10))
    replicator = Replicator(
        view, FakeMasterKeysNobodyHolds(view, "token"), AutorecoveryMetrics(CollectorRegistry())
    )
    metadata = LedgerMetadata(
        ledger_id=7,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        ensembles=((0, ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")),),
    )
    try:
        with pytest.raises(ReplicationError, match="no live bookie of the ledger holds") as raised:
            await replicator.recover_open_ledger(metadata)
        assert raised.value.retriable and raised.value.ledger_id == 7
    finally:
        await view.close()
