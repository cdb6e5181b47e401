"""Entry-log disk faults in a real bookie process started by the test entry point
(`python -m bkaio.testing.bookie --disk ... --crash-point ...`): its shard worker's journal and
entry logs share one FakeDisk (bkaio.testing.disk).

- EIO on every entry-log fsync: each flush fails and says so in the log, the shard turns
  read-only (adds after the first failed flush are refused; those before it were acknowledged:
  the journal is healthy), reads are served from the write cache, and after a kill -9 and a
  restart on a healthy disk every acknowledged entry reads back byte for byte.
- A power failure right before an entry-log fsync (lazy disk + crash point): the flush's
  entry-log writes never reach the file; journal replay brings back every acknowledged entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from bkaio.protocol.messages import AddEntryResponse, Flag, ReadRangeRequest, ReadRangeResponse
from bkaio.protocol.status import Status
from bkaio.testing.bookie import InjectedParts
from tests.fixtures.bookies import (
    NOTHING_INJECTED,
    BookieCluster,
    BookieClusterFactory,
    BookieProcess,
)
from tests.integration.bookie.raw_client import FIRST_SIGHT, RawClient, add_request

LEDGER_ID = 21
BATCH = 50
FAST_FLUSH = {"BKAIO_STORAGE_FLUSH_INTERVAL_SECONDS": "0.1"}  # Flushes happen within a test.


def _payload(entry_id: int) -> bytes:
    rng = random.Random(f"{LEDGER_ID}:{entry_id}")
    return rng.randbytes(rng.randint(1, 900))


async def _add_batches(client: RawClient, batches: int, acked: set[int]) -> None:
    """Pipelined adds of `batches` x BATCH entries; `acked` grows as OK answers arrive, so it
    is right even when the bookie dies halfway (ConnectionError then)."""
    first = max(acked, default=-1) + 1
    for start in range(first, first + batches * BATCH, BATCH):
        requests = [
            add_request(client.next_id(), LEDGER_ID, e, _payload(e))
            for e in range(start, start + BATCH)
        ]
        entry_ids = {request.request_id: request.entry_id for request in requests}
        for request in requests:
            client.send(request)
        await client.writer.drain()
        for _ in requests:
            response = await client.read_response(timeout_seconds=30)
            assert isinstance(response, AddEntryResponse), response
            if response.status is Status.OK:
                acked.add(entry_ids[response.request_id])


async def _stored(bookie: BookieProcess) -> dict[int, bytes]:
    """Every entry of the ledger the bookie serves, from entry 0 up to the first gap."""
    client = await RawClient.connect(bookie.host, bookie.port)
    stored: dict[int, bytes] = {}
    try:
        while True:
            response = await client.request(
                ReadRangeRequest(
                    client.next_id(), LEDGER_ID, len(stored), 100_000, 4 << 20, Flag.NONE, None
                )
            )
            assert isinstance(response, ReadRangeResponse), response
            if response.status is not Status.OK or not response.entries:
                return stored
            stored.update((entry.entry_id, entry.payload) for entry in response.entries)
    finally:
        await client.close()


def _assert_all_acked_read_back(acked: set[int], stored: dict[int, bytes]) -> None:
    assert acked, "nothing was acknowledged"
    missing = sorted(acked - set(stored))
    assert not missing, f"{len(missing)} acknowledged entries lost, first {missing[:10]}"
    wrong = [e for e in sorted(acked) if stored[e] != _payload(e)]
    assert not wrong, f"acknowledged entries with other bytes: {wrong[:10]}"


async def _log_mentions(bookie: BookieProcess, *texts: str) -> bool:
    log = await asyncio.to_thread(bookie.log_path.read_text, errors="replace")
    return all(text in log for text in texts)


async def _restart_healthy(cluster: BookieCluster) -> None:
    """kill -9 whatever is left of bookie 0, then start it on the real disk, no crash point."""
    if cluster[0].process is not None:
        cluster.kill9(0)
    await cluster.start(0, injected=NOTHING_INJECTED)


async def test_entry_log_fsync_eio_in_a_bookie_loses_no_acknowledged_entry(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(
        config=FIRST_SIGHT,
        env=FAST_FLUSH,
        injected=InjectedParts(disk="lazy,eio_after_syncs=0,eio_file_suffix=.log"),
    )
    acked: set[int] = set()
    client = await RawClient.connect(cluster[0].host, cluster[0].port)
    try:
        await _add_batches(client, 4, acked)
    finally:
        await client.close()
    # Only the entry logs fail: the journal acknowledged every add until the first failed
    # flush made the shard read-only (READ_ONLY from then on).
    assert acked
    for _ in range(600):  # Bounded wait (~30 s) for a periodic flush to fail.
        if await _log_mentions(cluster[0], "storage_flush_failed", "injected fsync failure"):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"no failed flush in the log:\n{cluster[0].log_tail()}")
    _assert_all_acked_read_back(acked, await _stored(cluster[0]))  # From the write cache.

    await _restart_healthy(cluster)
    _assert_all_acked_read_back(acked, await _stored(cluster[0]))


async def test_power_failure_before_an_entry_log_sync_loses_no_acknowledged_entry(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    injected = InjectedParts(
        disk="lazy",  # Unsynced writes exist only in the dying process.
        crash_point="entrylog.after_write_before_sync:3",
    )
    cluster = await bookie_cluster_factory(config=FIRST_SIGHT, env=FAST_FLUSH, injected=injected)
    acked: set[int] = set()
    client = await RawClient.connect(cluster[0].host, cluster[0].port)
    try:
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            for _ in range(200):  # Until the third flush's entry-log sync kills the worker.
                await _add_batches(client, 1, acked)
                await asyncio.sleep(0.02)  # Let flushes take turns with the adds.
    finally:
        await client.close()
    process = cluster[0].process
    assert process is not None
    await asyncio.to_thread(process.wait, 30)  # The parent stops once its worker died.
    assert await _log_mentions(cluster[0], "shard_worker_died", "137"), cluster[0].log_tail()

    await _restart_healthy(cluster)
    _assert_all_acked_read_back(acked, await _stored(cluster[0]))
