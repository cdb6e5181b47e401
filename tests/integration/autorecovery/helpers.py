"""Helpers of the autorecovery integration tests: config, writing ledgers, raw verification."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bkaio.ledger_client import BookKeeper
from bkaio.ledger_client.quorum import write_set
from bkaio.meta import LedgerMetadata, Metadata
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.messages import (
    Flag,
    ListEntriesRequest,
    ListEntriesResponse,
    ReadEntryRequest,
    ReadEntryResponse,
)
from bkaio.protocol.status import Status
from tests.fixtures.bookies import BookieCluster
from tests.integration.bookie.raw_client import RawClient

PASSWORD = b"autorecovery-test"

# Fast everything: no lost-bookie delay, short leases and grace periods.
AUTORECOVERY_CONFIG: dict[str, dict[str, Any]] = {
    "autorecovery": {
        "lost_bookie_delay_seconds": 0.0,
        "auditor_lease_ttl_seconds": 2.0,
        "worker_lease_ttl_seconds": 2.0,
        "open_ledger_grace_seconds": 3.0,
        "retry_backoff_seconds": 0.5,
        "poll_interval_seconds": 0.5,
        "audit_interval_seconds": 5.0,
    },
    "gc": {"interval_seconds": 3600.0, "grace_seconds": 0.0, "overreplicated_grace_seconds": 0.0},
    "storage": {"entry_log_max_bytes": 1 << 20, "compaction_threshold": 0.9},
}


def autorecovery_config(**autorecovery: Any) -> dict[str, dict[str, Any]]:
    """AUTORECOVERY_CONFIG with some of its [autorecovery] settings changed."""
    return {
        **AUTORECOVERY_CONFIG,
        "autorecovery": {**AUTORECOVERY_CONFIG["autorecovery"], **autorecovery},
    }


async def write_ledgers(
    uri: str, count: int, entries: int, payload_bytes: int, *, close: bool = True
) -> dict[int, list[bytes]]:
    """`count` E3/Qw3/Qa2 ledgers of `entries` entries each, a few written concurrently.

    A generous add timeout: the test machine's 2 cores are shared by every bookie process."""
    limit = asyncio.Semaphore(4)
    async with BookKeeper.connect(uri, add_timeout=30.0) as bk:

        async def one(index: int) -> tuple[int, list[bytes]]:
            async with limit:
                return await write_one(index)

        async def write_one(index: int) -> tuple[int, list[bytes]]:
            handle = await bk.create_ledger(3, 3, 2, password=PASSWORD)
            payloads = [(b"%d-%d-" % (index, i)).ljust(payload_bytes, b"x") for i in range(entries)]
            await asyncio.gather(*(handle.append(p) for p in payloads))
            if close:
                await handle.close()
            return handle.ledger_id, payloads

        written = await asyncio.gather(*(one(i) for i in range(count)))
    return dict(written)


async def write_short_on(
    cluster: BookieCluster, uri: str, index: int, payloads: list[bytes]
) -> int:
    """A closed E3/Qw3/Qa2 ledger on a three-bookie cluster whose second half of `payloads` was
    written while bookie `index` was killed: no bookie could replace it, so the writer went on
    at Qa and that bookie's fragment is short. Its id; the bookie is left down."""
    half = len(payloads) // 2
    async with BookKeeper.connect(uri, add_timeout=30.0) as bk:
        handle = await bk.create_ledger(3, 3, 2, password=PASSWORD)
        await asyncio.gather(*(handle.append(p) for p in payloads[:half]))
        cluster.kill9(index)
        await asyncio.gather(*(handle.append(p) for p in payloads[half:]))
        await handle.close()
    return handle.ledger_id


async def wait_for(
    condition: Callable[[], Awaitable[bool]], timeout_seconds: float, what: str
) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_seconds} s: {what}")
        await asyncio.sleep(0.2)


async def ledgers_naming(meta: Metadata, bookie_id: str) -> list[int]:
    named = []
    async for ledger_id in meta.ledgers.list_ids():
        md = await meta.ledgers.get(ledger_id)
        if any(bookie_id in ensemble for _, ensemble in md.ensembles):
            named.append(ledger_id)
    return named


def _address(cluster: BookieCluster, bookie_id: str) -> tuple[str, int]:
    host, port = bookie_id.rsplit(":", 1)
    return host, int(port)


async def verify_full_replication(
    cluster: BookieCluster, md: LedgerMetadata, payloads: list[bytes]
) -> int:
    """Read every entry from every bookie of its write set with the raw protocol and check
    payload and digest; the number of copies checked."""
    assert md.is_closed and md.last_entry_id == len(payloads) - 1, md
    by_bookie: dict[str, list[int]] = {}
    segments = list(md.ensembles)
    for position, (first, ensemble) in enumerate(segments):
        end = segments[position + 1][0] - 1 if position + 1 < len(segments) else md.last_entry_id
        for entry_id in range(first, end + 1):
            for index in write_set(entry_id, md.ensemble_size, md.write_quorum):
                by_bookie.setdefault(ensemble[index], []).append(entry_id)
    checked = 0
    for bookie_id, entry_ids in by_bookie.items():
        client = await RawClient.connect(*_address(cluster, bookie_id))
        try:
            requests = [
                ReadEntryRequest(client.next_id(), md.ledger_id, entry_id, Flag.NONE, None)
                for entry_id in entry_ids
            ]
            responses = await client.pipeline(requests)
        finally:
            await client.close()
        for request in requests:
            response = responses[request.request_id]
            assert isinstance(response, ReadEntryResponse)
            assert response.status is Status.OK, (
                bookie_id,
                md.ledger_id,
                request.entry_id,
                response.status,
                sum(r.status is not Status.OK for r in responses.values()),  # Of this bookie's.
            )
            entry = response.entry
            assert entry is not None and entry.payload == payloads[request.entry_id]
            assert entry.digest == entry_digest(
                md.ledger_id, request.entry_id, entry.lac, entry.length, entry.payload
            )
            checked += 1
    return checked


async def entries_held(cluster: BookieCluster, bookie_id: str, ledger_id: int) -> int:
    """How many entries of the ledger the bookie holds (LIST_ENTRIES)."""
    client = await RawClient.connect(*_address(cluster, bookie_id))
    try:
        response = await client.request(ListEntriesRequest(client.next_id(), ledger_id))
    finally:
        await client.close()
    assert isinstance(response, ListEntriesResponse)
    if response.status is Status.NO_SUCH_LEDGER:
        return 0
    assert response.status is Status.OK, response
    return sum(last - first + 1 for first, last in response.ranges)


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def bookie_metrics(admin_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The bookie's /metrics as {(sample name, sorted labels): value}."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    def fetch() -> str:
        with urllib.request.urlopen(f"{admin_url}/metrics", timeout=10.0) as response:
            return str(response.read().decode())

    text = await asyncio.to_thread(fetch)
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric_sum(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    """Sum of a metric over all its label sets (0 when absent)."""
    return sum(value for (sample, _), value in samples.items() if sample == name)


BKAIO_COMMAND = str(Path(sys.executable).parent / "bkaio")


async def bkaio_cli(*args: str, timeout_seconds: float = 180.0) -> subprocess.CompletedProcess[str]:
    """`bkaio ARGS...` in a subprocess (off the event loop); stdout, stderr and exit code."""
    return await asyncio.to_thread(
        subprocess.run,
        [BKAIO_COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=timeout_seconds,
        check=False,
    )
