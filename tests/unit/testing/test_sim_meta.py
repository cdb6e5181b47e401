"""The in-memory metadata driver's simulated faults (the contract itself runs in
tests/integration/meta/test_store_contract.py against every driver)."""

from __future__ import annotations

import asyncio
import random

import pytest

from bkaio.meta.errors import LeaseExpiredError, MetadataOutcomeUnknownError, WatchCompactedError
from bkaio.meta.store import EventKind
from bkaio.testing.sim.guards import sealed
from bkaio.testing.sim.loop import SimLoop
from bkaio.testing.sim.meta import MemoryMetadataServer, StoreFaults


def test_a_lost_answer_leaves_the_write_applied() -> None:
    async def main() -> tuple[bool, bytes | None, float]:
        server = MemoryMetadataServer()
        faults = StoreFaults(random.Random(1), latency=(0.01, 0.01), lost_answer=1.0)
        store = server.connect(faults)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await store.compare_and_swap("/k", b"v", expected_version=0)
        except MetadataOutcomeUnknownError:
            unknown = True
        else:
            unknown = False
        kv = await server.connect().get("/k")
        return unknown, None if kv is None else kv.value, loop.time() - started

    loop = SimLoop(random.Random(0))
    with sealed():
        unknown, value, elapsed = loop.run_until_complete(main())
    loop.close()
    assert unknown and value == b"v"
    assert elapsed == pytest.approx(0.02, abs=0.001)  # There and (the lost answer) back.


def test_leases_expire_on_virtual_time_and_watches_see_the_delete() -> None:
    async def main() -> list[tuple[EventKind, str]]:
        server = MemoryMetadataServer()
        store = server.connect()
        start = await store.current_revision() + 1
        lease = await store.grant_lease(10)
        await store.put("/bookies/b1", b"x", lease=lease)
        await asyncio.sleep(11)  # No keep-alive: gone after the TTL.
        assert await store.get("/bookies/b1") is None
        seen = []
        async for event in store.watch_prefix("/bookies/", start_revision=start):
            seen.append((event.kind, event.key))
            if len(seen) == 2:
                break
        return seen

    loop = SimLoop(random.Random(0))
    with sealed():
        seen = loop.run_until_complete(main())
    loop.close()
    assert seen == [(EventKind.PUT, "/bookies/b1"), (EventKind.DELETE, "/bookies/b1")]


def test_a_grant_answered_late_counts_its_ttl_from_the_request() -> None:
    """The server grants a 1 s lease 1.5 s after the request and the answer takes 1.5 s more:
    the server drops the lease before the holder has it, so the holder must find it in doubt
    at once (as with the real drivers), not certain for a TTL after the answer came."""

    async def main() -> tuple[bool, bool, bool]:
        server = MemoryMetadataServer()
        store = server.connect(StoreFaults(random.Random(1), latency=(1.5, 1.5)))
        lease = await store.grant_lease(1.0)
        in_doubt, lost = lease.in_doubt, lease.lost
        try:
            await lease.keep_alive()
        except LeaseExpiredError:
            return in_doubt, lost, True
        return in_doubt, lost, False

    loop = SimLoop(random.Random(0))
    with sealed():
        in_doubt, lost, gone_in_the_store = loop.run_until_complete(main())
    loop.close()
    assert gone_in_the_store
    assert in_doubt and not lost


async def test_a_watch_from_a_compacted_revision_fails() -> None:
    server = MemoryMetadataServer(changes_kept=3)
    store = server.connect()
    first = await store.put("/a", b"1")
    for value in (b"2", b"3", b"4", b"5"):
        await store.put("/a", value)
    with pytest.raises(WatchCompactedError):
        async for _ in store.watch_prefix("/", start_revision=first):
            break
