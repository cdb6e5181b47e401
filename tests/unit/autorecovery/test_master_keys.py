"""`MasterKeys` remembers a bounded number of ledgers' keys."""

from __future__ import annotations

from bkaio.autorecovery.cluster import _KEY_CACHE_SIZE, ClusterView, MasterKeys
from bkaio.meta import BookieInfo, LedgerMetadata, Metadata

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182")


class MasterKeysOverFakeHttp(MasterKeys):
    """Every bookie answers the admin HTTP request with a key made from the ledger id."""

    def __init__(self, view: ClusterView) -> None:
        super().__init__(view, "token")
        self.asked: list[int] = []

    async def _ask(self, bookie_id: str, ledger_id: int) -> bytes | None:
        self.asked.append(ledger_id)
        return b"key-%d" % ledger_id


async def test_the_key_cache_is_bounded_and_keeps_the_latest(meta: Metadata) -> None:
    """Every key learned was kept for the life of the service (a worker replicating millions
    of ledgers over months): at most _KEY_CACHE_SIZE now, the oldest forgotten first."""
    view = ClusterView(meta)
    view.set_bookies([BookieInfo.for_address("127.0.0.1", int(b[-4:])) for b in BOOKIES])
    keys = MasterKeysOverFakeHttp(view)
    try:
        ledgers = _KEY_CACHE_SIZE + 10
        for ledger_id in range(ledgers):
            md = LedgerMetadata(
                ledger_id=ledger_id,
                ensemble_size=2,
                write_quorum=2,
                ack_quorum=2,
                ensembles=((0, BOOKIES),),
            )
            assert await keys.master_key(md) == b"key-%d" % ledger_id
        assert len(keys._cache) == _KEY_CACHE_SIZE
        asked = len(keys.asked)
        latest = LedgerMetadata(
            ledger_id=ledgers - 1, ensemble_size=2, write_quorum=2, ack_quorum=2,
            ensembles=((0, BOOKIES),),
        )  # fmt: skip
        assert await keys.master_key(latest) == b"key-%d" % (ledgers - 1)
        assert len(keys.asked) == asked  # Remembered: not asked again.
    finally:
        await keys.close()
        await view.close()
