"""Storage and journal faults in a real bookie, injected through its Disk (the test entry point's
`--disk fault_file=...`, bkaio.testing.disk): what the bookie does and what its clients see.

Read-only cases (ENOSPC writing the entry logs, EIO syncing the checkpoint): the failed flush is
logged at ERROR with the task's name; the bookie re-registers as read-only and refuses adds
(READ_ONLY), so the client's next appends go to another bookie (an ensemble change); every
acknowledged entry stays readable, from this bookie too; once the fault clears, the next flush
works and the bookie is writable again.

Journal case (EIO on the journal's fsync): the bookie answers no add OK from then on, logs the
failure at ERROR, reports itself unhealthy, leaves the registry and exits 3 (EXIT_TASK_FAILED) so
that systemd restarts it; the client's appends go on with the other bookies, nothing
acknowledged is lost, and the bookie restarted on a healthy disk serves again.

EROFS from the index cannot be injected into a bookie process: LMDB writes through its own
memory map, not the Disk seam. tests/unit/entrylog/test_storage_write_failures.py covers it in
process, through the same flush path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from bkaio.errors import BKError
from bkaio.ledger_client import BookKeeper
from bkaio.ledger_client.ledger_handle import LedgerHandle
from bkaio.protocol.digest import master_key
from bkaio.protocol.messages import (
    AddEntryRequest,
    AddEntryResponse,
    Flag,
    ReadEntryRequest,
    ReadEntryResponse,
)
from bkaio.protocol.status import Status
from bkaio.supervision import EXIT_TASK_FAILED
from bkaio.testing.bookie import InjectedParts
from tests.fixtures.bookies import NOTHING_INJECTED, BookieCluster, BookieClusterFactory
from tests.integration.bookie.raw_client import RawClient, add_request

FAST_FLUSH = {"BKAIO_STORAGE_FLUSH_INTERVAL_SECONDS": "0.1"}
PASSWORD = b"storage-faults"
BOUND_SECONDS = 60.0  # For waits on the bookie: liveness bounds, not timing claims.


def _fault_file(cluster: BookieCluster) -> Path:
    return cluster[0].directory / "disk_fault"


async def _cluster_with_a_faulty_disk(factory: BookieClusterFactory) -> BookieCluster:
    """Four bookies; bookie 0 runs on a disk that fails while its fault file says so."""
    cluster = await factory(count=4, env=FAST_FLUSH)
    await cluster.stop(0)
    await cluster.start(0, injected=InjectedParts(disk=f"fault_file={_fault_file(cluster)}"))
    await cluster.wait_until_registered(0, read_only=False)
    return cluster


async def _ledger_on_bookie_0(bk: BookKeeper, cluster: BookieCluster) -> LedgerHandle:
    """A ledger whose ensemble holds bookie 0 (placement is random: create until one does)."""
    for _ in range(40):
        handle = await bk.create_ledger(3, 3, 2, password=PASSWORD)
        if cluster[0].bookie_id in handle.metadata.ensembles[-1][1]:
            return handle
        await handle.close()
    raise AssertionError("no ledger placed on bookie 0 in 40 tries")


async def _append(handle: LedgerHandle, count: int, acked: dict[int, bytes]) -> None:
    start = handle.last_add_pushed + 1
    payloads = [b"entry-%06d" % i for i in range(start, start + count)]
    entry_ids = await asyncio.gather(*(handle.append(p) for p in payloads))
    acked.update(zip(entry_ids, payloads, strict=True))


def _events(cluster: BookieCluster) -> list[dict[str, Any]]:
    """The bookie's JSON log lines (parent and shard worker)."""
    events = []
    for line in cluster[0].log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    return events


async def _wait_until_replaced(
    handle: LedgerHandle, cluster: BookieCluster, acked: dict[int, bytes]
) -> None:
    """Appends go on until the ledger's current ensemble no longer names bookie 0 (the change
    runs beside the appends, which two bookies of three acknowledge meanwhile)."""
    deadline = time.monotonic() + BOUND_SECONDS
    while cluster[0].bookie_id in handle.metadata.ensembles[-1][1]:
        assert time.monotonic() < deadline, f"bookie 0 still in {handle.metadata.ensembles}"
        await _append(handle, 5, acked)
        await asyncio.sleep(0.1)


async def _wait_for_event(cluster: BookieCluster, event: str, **fields: str) -> dict[str, Any]:
    """The first logged `event` whose fields start with `fields`' values."""
    deadline = time.monotonic() + BOUND_SECONDS
    while True:
        for logged in await asyncio.to_thread(_events, cluster):
            if logged.get("event") == event and all(
                str(logged.get(name, "")).startswith(value) for name, value in fields.items()
            ):
                return logged
        assert time.monotonic() < deadline, f"no {event} {fields}:\n{cluster[0].log_tail()}"
        await asyncio.sleep(0.1)


def _raw_add(ledger_id: int, entry_id: int, payload: bytes, request_id: int) -> AddEntryRequest:
    return add_request(
        request_id, ledger_id, entry_id, payload, key=master_key(PASSWORD, ledger_id)
    )


async def _read_all(bk: BookKeeper, ledger_id: int, acked: dict[int, bytes]) -> None:
    """Every acknowledged entry readers can see (up to the LAC the bookies know, all of
    them once the ledger is closed) reads back with its bytes."""
    reader = await bk.open_ledger(ledger_id, PASSWORD, recovery=False)
    try:
        last = min(max(acked), reader.last_entry_id)
        assert last >= 0, "nothing readable"
        entries = await reader.read(0, last)
    finally:
        await reader.close()
    read = {entry.entry_id: entry.payload for entry in entries}
    expected = {e: payload for e, payload in acked.items() if e <= last}
    assert {e: read.get(e) for e in expected} == expected, "acknowledged entries lost or changed"


async def _read_from_bookie_0(cluster: BookieCluster, ledger_id: int, entry_id: int) -> bytes:
    client = await RawClient.connect(cluster[0].host, cluster[0].port)
    try:
        request = ReadEntryRequest(client.next_id(), ledger_id, entry_id, Flag.NONE, None)
        response = await client.request(request)
    finally:
        await client.close()
    assert isinstance(response, ReadEntryResponse) and response.status is Status.OK, response
    assert response.entry is not None
    return bytes(response.entry.payload)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [("ENOSPC .log", "ENOSPC"), ("EIO lastMark.tmp sync", "EIO")],
    ids=["entry_log_enospc", "checkpoint_eio"],
)
async def test_a_storage_fault_makes_the_bookie_read_only_until_it_clears(
    bookie_cluster_factory: BookieClusterFactory, fault: str, expected: str
) -> None:
    cluster = await _cluster_with_a_faulty_disk(bookie_cluster_factory)
    acked: dict[int, bytes] = {}
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        handle = await _ledger_on_bookie_0(bk, cluster)
        await _append(handle, 50, acked)

        other = await _ledger_on_bookie_0(bk, cluster)  # Written to raw, below.
        await asyncio.to_thread(_fault_file(cluster).write_text, fault + "\n")
        await _append(handle, 20, acked)  # The next flush on bookie 0 fails.
        failed = await _wait_for_event(cluster, "task_failed", task="storage_flush")
        assert failed["level"] == "error" and expected in failed["error"], failed
        assert "Traceback" in str(failed.get("exception", "")), failed
        await cluster.wait_until_registered(0, read_only=True, timeout_seconds=BOUND_SECONDS)
        raw = await RawClient.connect(cluster[0].host, cluster[0].port)
        try:  # New adds are refused: the bookie cannot promise to store them.
            response = await raw.request(_raw_add(other.ledger_id, 0, b"refused", raw.next_id()))
        finally:
            await raw.close()
        assert isinstance(response, AddEntryResponse) and response.status is Status.READ_ONLY

        await _append(handle, 50, acked)  # Goes on: bookie 0 is replaced in the ensemble.
        await _wait_until_replaced(handle, cluster, acked)
        assert await _read_from_bookie_0(cluster, handle.ledger_id, 0) == acked[0]
        await _read_all(bk, handle.ledger_id, acked)

        await asyncio.to_thread(_fault_file(cluster).unlink)
        await cluster.wait_until_registered(0, read_only=False, timeout_seconds=BOUND_SECONDS)
        await _wait_for_event(cluster, "storage_flush_recovered")
        await handle.close()
        await other.close()
        await _read_all(bk, handle.ledger_id, acked)


async def test_a_journal_fsync_failure_stops_acks_and_ends_the_bookie(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await _cluster_with_a_faulty_disk(bookie_cluster_factory)
    acked: dict[int, bytes] = {}
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        handle = await _ledger_on_bookie_0(bk, cluster)
        await _append(handle, 50, acked)

        other = await _ledger_on_bookie_0(bk, cluster)  # Written to raw, below.
        await asyncio.to_thread(_fault_file(cluster).write_text, "EIO .jnl sync\n")
        raw = await RawClient.connect(cluster[0].host, cluster[0].port)
        answers: list[Status] = []
        try:  # Straight to bookie 0: none of these may be answered OK.
            for entry_id in range(10):
                response = await raw.request(
                    _raw_add(other.ledger_id, entry_id, b"after the failure", raw.next_id())
                )
                assert isinstance(response, AddEntryResponse), response
                answers.append(response.status)
        except (ConnectionError, OSError, TimeoutError):
            pass  # The bookie went away meanwhile: nothing more was answered.
        finally:
            await raw.close()
        assert Status.OK not in answers, answers

        await _append(handle, 50, acked)  # The other bookies take over.
        await _wait_until_replaced(handle, cluster, acked)
        process = cluster[0].process
        assert process is not None
        code = await asyncio.to_thread(process.wait, BOUND_SECONDS)
        assert code == EXIT_TASK_FAILED, cluster[0].log_tail()
        failed = await _wait_for_event(cluster, "task_failed", task="journal")
        assert failed["level"] == "error" and "EIO" in failed["error"], failed
        unhealthy = await _wait_for_event(cluster, "bookie_unhealthy")
        assert "journal" in unhealthy["reason"], unhealthy
        assert cluster[0].bookie_id not in await cluster.registered()
        await _read_all(bk, handle.ledger_id, acked)

        await asyncio.to_thread(_fault_file(cluster).unlink)
        cluster.bookies[0].process = None
        await cluster.start(0, injected=NOTHING_INJECTED)  # Restarted on a healthy disk.
        await cluster.wait_until_registered(0, read_only=False)
        assert await _read_from_bookie_0(cluster, handle.ledger_id, 0) == acked[0]
        await handle.close()
        await _read_all(bk, handle.ledger_id, acked)
        with contextlib.suppress(BKError):  # Nothing of it was acknowledged.
            await other.close()
