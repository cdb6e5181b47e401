"""A lease whose refreshes go unconfirmed for a whole TTL counts as lost to its holder.

The store drops a lease a TTL after the last refresh it received; an auditor or a replication
worker cut off from the store must stop acting then, not when the store answers again (another
holder may have taken the role meanwhile).
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from structlog.testing import capture_logs

from bkaio.errors import MetadataError
from bkaio.meta.store import Lease


class FakeUnreachableLease(Lease):
    """Refreshes answer at first; then (once `cut`) fail at once or hang, as a store that
    refuses connections or one that is partitioned away does."""

    def __init__(self, ttl_seconds: float, *, hang: bool) -> None:
        super().__init__(lease_id=7, ttl_seconds=ttl_seconds)
        self.hang = hang
        self.cut = False
        self.refreshed = asyncio.Event()

    async def keep_alive(self) -> None:
        if not self.cut:
            self.refreshed.set()
            return
        if self.hang:
            await asyncio.Event().wait()
        raise MetadataError("etcd keep lease 7 alive: connection refused (fake)")

    async def _revoke(self) -> None:
        pass


async def _lost_once_cut(lease: FakeUnreachableLease) -> list[MutableMapping[str, Any]]:
    with capture_logs() as logs:
        lease.start_keep_alive(interval_seconds=0.05)
        await asyncio.wait_for(lease.refreshed.wait(), 10)
        lease.cut = True
        # Liveness bound only: the lease counts as lost about a TTL (0.5 s) after the last
        # refresh that answered; without that it would wait for the store for ever.
        await asyncio.wait_for(lease.wait_lost(), 10)
    await lease.stop_keep_alive()
    return logs


async def test_refreshes_failing_for_a_ttl_make_the_lease_lost() -> None:
    lease = FakeUnreachableLease(0.5, hang=False)
    logs = await _lost_once_cut(lease)
    assert lease.lost
    (lost,) = [entry for entry in logs if entry["event"] == "lease_lost"]
    assert lost["reason"] == "no refresh confirmed within the TTL"


async def test_a_refresh_that_hangs_past_the_ttl_makes_the_lease_lost() -> None:
    lease = FakeUnreachableLease(0.5, hang=True)
    await _lost_once_cut(lease)
    assert lease.lost


async def test_refreshes_that_answer_keep_the_lease() -> None:
    lease = FakeUnreachableLease(0.2, hang=False)
    lease.start_keep_alive(interval_seconds=0.02)
    for _ in range(30):  # Several TTLs of refreshes.
        lease.refreshed.clear()
        await asyncio.wait_for(lease.refreshed.wait(), 10)
    assert not lease.lost
    await lease.stop_keep_alive()
