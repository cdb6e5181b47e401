"""Recovery with a dead bookie replaces it, as BookKeeper's recovery add path does.

E3 Qw3 Qa2 with explicit LAC off: pipelined appends all carry LAC -1, so recovery must
re-write every entry. One bookie of the ensemble is killed first. The sealed metadata must not
name it, and every entry must be on every bookie of its write set in the final ensembles:
read from each of them directly, not through the quorum read path.
"""

from __future__ import annotations

import asyncio

from bkaio.ledger_client import BookKeeper
from bkaio.ledger_client.connections import BookiePool
from bkaio.ledger_client.quorum import bookies_for_entry
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta.ledger_metadata import LedgerState
from bkaio.protocol.digest import verify_entry_digest
from tests.fixtures.bookies import BookieClusterFactory


async def test_recovery_replaces_a_dead_bookie_and_every_entry_is_on_its_write_set(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(count=4)
    payloads = [b"entry-%d" % i for i in range(100)]
    async with (
        BookKeeper.connect(cluster.metadata_uri, explicit_lac_interval=0) as writer,
        BookKeeper.connect(cluster.metadata_uri, add_timeout=2.0) as recoverer,
    ):
        lh = await writer.create_ledger(3, 3, 2, password=b"pw")
        assert await asyncio.gather(*(lh.append(p) for p in payloads)) == list(range(100))
        ensemble = lh.metadata.ensembles[0][1]
        victim = ensemble[1]
        cluster.kill9(cluster.bookie_ids.index(victim))

        rh = await recoverer.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        md = await recoverer.get_ledger_metadata(lh.ledger_id)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 99
        assert all(victim not in bookies for _, bookies in md.ensembles), md.ensembles
        assert [e.payload for e in await rh.read(0, 99)] == payloads

        known = {info.bookie_id: info for info in recoverer.bookies}
        pool = BookiePool(ClientConfig(), known.get)
        try:
            for entry_id, payload in enumerate(payloads):
                holders = bookies_for_entry(md.ensembles, entry_id, md.write_quorum)
                assert len(holders) == 3
                for bookie_id in holders:
                    copy = await pool.read_entry(bookie_id, lh.ledger_id, entry_id)
                    assert copy.payload == payload, (entry_id, bookie_id)
                    assert verify_entry_digest(
                        lh.ledger_id, entry_id, copy.lac, copy.length, copy.payload, copy.digest
                    )
        finally:
            await pool.close()
