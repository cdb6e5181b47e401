"""Metadata's background tasks run under the loop's supervisor: a bug is reported, not silent."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from bkaio.meta.store import Lease
from bkaio.supervision import Supervisor


class FlakyLease(Lease):
    """A lease whose first refresh hits a bug; later refreshes work."""

    def __init__(self) -> None:
        super().__init__(lease_id=42, ttl_seconds=0.3)
        self.refreshes = 0
        self.refreshed = asyncio.Event()

    async def keep_alive(self) -> None:
        self.refreshes += 1
        if self.refreshes == 1:
            raise RuntimeError("bug in a refresh")
        self.refreshed.set()

    async def _revoke(self) -> None:
        pass


async def test_a_keep_alive_that_raises_is_reported_and_goes_on() -> None:
    registry = CollectorRegistry()
    supervisor = Supervisor("bookie", registry=registry)
    supervisor.adopt_loop()
    lease = FlakyLease()
    try:
        with capture_logs() as logs:
            lease.start_keep_alive(interval_seconds=0.01)
            await asyncio.wait_for(lease.refreshed.wait(), 5)
        assert not lease.lost  # The bug did not end the keep-alive (nor make the lease look lost).
    finally:
        await lease.revoke()
        await supervisor.stop()
    (failed,) = [e for e in logs if e["event"] == "task_failed"]
    assert failed["task"] == "lease_keep_alive[42]" and failed["log_level"] == "error"
    assert registry.get_sample_value("bkaio_task_failures_total", {"task": "lease_keep_alive"}) == 1
