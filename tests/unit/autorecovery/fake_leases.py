"""A lease whose doubt a test sets, for the holders that act under a lease (the replication
worker's and the drain's steps under a ledger's lock, the auditor's passes)."""

from __future__ import annotations

import asyncio

from bkaio.meta.store import Lease


class FakeLockLease(Lease):
    """`doubt` makes it in doubt (as after an event-loop stall past its TTL); a wait for its
    confirmation then gets the store's `verdict`: True confirms it (the doubt ends), False
    loses it. `waits` counts the waits that found it in doubt. Not in any store: for holders
    whose writes under it do not name it."""

    def __init__(self) -> None:
        super().__init__(lease_id=77, ttl_seconds=30.0)
        self.doubt = False
        self.verdict = True
        self.waits = 0

    @property
    def in_doubt(self) -> bool:
        return self.doubt or self.lost

    async def wait_confirmed(self) -> bool:
        if not self.in_doubt:
            return True
        self.waits += 1
        await asyncio.sleep(0)  # The late refresh's answer comes later.
        if not self.lost and self.verdict:
            self.doubt = False
            return True
        self._lost.set()
        return False

    async def keep_alive(self) -> None:
        pass

    async def _revoke(self) -> None:
        pass
