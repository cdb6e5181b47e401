"""Helpers of the autorecovery integration tests: config, writing ledgers, raw verification."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bkaio.entrylog.reading import entry_ranges
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
    """`count` E3/Qw3/Qa3 ledgers of `entries` entries each, a few written concurrently.

    Qa = Qw: an entry is acknowledged once every bookie of its write set holds it, so when this
    returns each bookie holds every entry of its fragments, which the full-replication checks
    (`verify_full_replication`) ask of it. A Qa2 writer closes a ledger once two bookies hold
    each entry, and whatever the slowest one had not read yet is dropped when the client
    closes: on a loaded machine a bookie held none of a late ledger, and the check after
    re-replication failed on it at entry 0 (NO_SUCH_LEDGER for all 1000 reads, on a bookie of
    the ledger's first ensemble, not a copy's destination).

    A generous add timeout: the test machine's 2 cores are shared by every bookie process."""
    limit = asyncio.Semaphore(4)
    async with BookKeeper.connect(uri, add_timeout=30.0) as bk:

        async def one(index: int) -> tuple[int, list[bytes]]:
            async with limit:
                return await write_one(index)

        async def write_one(index: int) -> tuple[int, list[bytes]]:
            handle = await bk.create_ledger(3, 3, 3, password=PASSWORD)
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
    cluster: BookieCluster,
    md: LedgerMetadata,
    payloads: list[bytes],
    *,
    before: LedgerMetadata | None = None,
) -> int:
    """Read every entry from every bookie of its write set with the raw protocol and check
    payload and digest; the number of copies checked. A bookie that answers any read other
    than OK fails it with a report (`_refused_reads_report`: statuses, the metadata now and
    `before`, who holds which entries, every bookie's log lines about the ledger)."""
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
        answered_at = datetime.now(UTC)
        refused: dict[int, Status] = {}
        for request in requests:
            response = responses[request.request_id]
            assert isinstance(response, ReadEntryResponse)
            if response.status is not Status.OK:
                refused[request.entry_id] = response.status
        if refused:
            report = await _refused_reads_report(
                cluster, md, before, bookie_id, len(requests), refused, answered_at
            )
            raise AssertionError(report)
        for request in requests:
            response = responses[request.request_id]
            assert isinstance(response, ReadEntryResponse)
            entry = response.entry
            assert entry is not None and entry.payload == payloads[request.entry_id]
            assert entry.digest == entry_digest(
                md.ledger_id, request.entry_id, entry.lac, entry.length, entry.payload
            )
            checked += 1
    return checked


def _metadata_line(md: LedgerMetadata) -> str:
    segments = ", ".join(f"{first}: {list(ensemble)}" for first, ensemble in md.ensembles)
    return (
        f"{md.state.name} last entry {md.last_entry_id} version {md.version} "
        f"E{md.ensemble_size}/Qw{md.write_quorum}/Qa{md.ack_quorum} segments {{{segments}}}"
    )


async def _refused_reads_report(
    cluster: BookieCluster,
    md: LedgerMetadata,
    before: LedgerMetadata | None,
    bookie_id: str,
    asked: int,
    refused: dict[int, Status],
    answered_at: datetime,
) -> str:
    """Everything needed to tell a copy that is missing (NO_SUCH_ENTRY/NO_SUCH_LEDGER: a real
    re-replication bug) from a bookie refusing reads, and how the ledger got there."""
    ledger_id = md.ledger_id
    first = min(refused)
    statuses = Counter(status.name for status in refused.values())
    lines = [
        f"ledger {ledger_id}: {len(refused)} of {asked} READ_ENTRY to {bookie_id} answered other "
        f"than OK at {answered_at.isoformat()}: {dict(statuses)}; entry {first} "
        f"{refused[first].name}; entries refused {entry_ranges(sorted(refused))}",
        f"metadata now: {_metadata_line(md)}",
    ]
    if before is not None:
        lines.append(f"metadata before the kill: {_metadata_line(before)}")
    lines.append(await _cluster_state(cluster))
    lines.append(f"entries of ledger {ledger_id} each running bookie holds (LIST_ENTRIES):")
    for bookie in cluster.bookies:
        if bookie.running:
            lines.append(
                f"  {bookie.bookie_id}: {await _entry_list(cluster, bookie.bookie_id, md)}"
            )
    pattern = re.compile(rf'"ledger_id": {ledger_id}\b|ledger {ledger_id}\b')
    for bookie in cluster.bookies:
        state = "running" if bookie.running else f"exited {bookie.exit_codes}"
        try:
            text = bookie.log_path.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        named = [line for line in text.splitlines() if pattern.search(line)]
        lines.append(
            f"bookie-{bookie.index} {bookie.bookie_id} ({state}): {len(named)} log lines name "
            f"ledger {ledger_id}" + (", the last 60:" if len(named) > 60 else ":")
        )
        lines.extend(f"  {line}" for line in named[-60:])
        if bookie.bookie_id == bookie_id:
            lines.append(f"the last 40 lines of {bookie_id}'s log:")
            lines.extend(f"  {line}" for line in text.splitlines()[-40:])
    return "\n".join(lines)


async def _cluster_state(cluster: BookieCluster) -> str:
    """Registered bookies, the auditor, marks and locks now (or why they could not be read)."""
    try:
        meta = await cluster.metadata()
        registered = sorted(await meta.bookies.ids())
        auditor = await meta.auditor.who_is_auditor()
        marks = [record.to_dict() async for record in meta.underreplication.list()]
        locked = sorted(await meta.underreplication.locked())
    except Exception as error:  # A report must not hide the failure it reports.
        return f"cluster state unreadable: {error!r}"
    return f"registered {registered}; auditor {auditor}; marks {marks}; locked {locked}"


async def _entry_list(cluster: BookieCluster, bookie_id: str, md: LedgerMetadata) -> str:
    """The bookie's LIST_ENTRIES answer for the ledger, and whether the metadata names it."""
    named = [first for first, ensemble in md.ensembles if bookie_id in ensemble]
    where = f"named in segments {named}" if named else "not named"
    try:
        client = await RawClient.connect(*_address(cluster, bookie_id))
        try:
            response = await client.request(ListEntriesRequest(client.next_id(), md.ledger_id))
        finally:
            await client.close()
    except Exception as error:  # Down, say: said so, not raised.
        return f"{where}; LIST_ENTRIES failed: {error!r}"
    assert isinstance(response, ListEntriesResponse)
    if response.status is not Status.OK:
        return f"{where}; {response.status.name}"
    return f"{where}; {list(response.ranges)}"


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
