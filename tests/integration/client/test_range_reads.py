"""Range reads (READ_ENTRIES) against real bookie processes, for contiguous and striped
ledgers: the requests they make, and fail-over with a dead bookie, a stopped one (speculative
reads) and a copy corrupted on disk (digest mismatch: read from another replica)."""

from __future__ import annotations

import asyncio
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory, running_on_own_loop

SHAPES = [(3, 3, 2), (5, 2, 2)]  # (ensemble, write quorum, ack quorum)
COUNT = 3_000


@pytest.fixture(scope="module")
def shared_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, BookieCluster]]:
    """One cluster per ensemble size, started once for the tests that leave every bookie serving
    (the range-request count; the corrupt copy, which restarts one bookie and damages only its
    own ledger's entry). The tests that kill or SIGSTOP a bookie start their own. Each test
    writes and reads a ledger of its own. On an event loop of its own: the tests' loops are per
    test."""
    base = tmp_path_factory.mktemp("range-reads")
    clusters = {
        size: BookieCluster(f"sqlite://{base / f'meta-{size}.db'}", base / f"e{size}", count=size)
        for size in sorted({shape[0] for shape in SHAPES})
    }

    with running_on_own_loop(*clusters.values()):
        yield clusters


def payload(index: int) -> bytes:
    return b"entry-%06d-" % index + os.urandom(24)


async def write_ledger(
    cluster: BookieCluster, shape: tuple[int, int, int]
) -> tuple[int, list[bytes]]:
    payloads = [payload(i) for i in range(COUNT)]
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        lh = await bk.create_ledger(*shape, password=b"pw")
        await asyncio.gather(*(lh.append(p) for p in payloads))
        await lh.close()
    return lh.ledger_id, payloads


def request_count(cluster: BookieCluster, op: str) -> float:
    prefix = f'bkaio_bookie_request_seconds_count{{op="{op}",success="true"}} '
    total = 0.0
    for bookie in cluster.bookies:
        with urllib.request.urlopen(f"{bookie.admin_url}/metrics", timeout=10) as response:
            text = response.read().decode()
        total += sum(
            float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)
        )
    return total


@pytest.mark.parametrize("shape", SHAPES)
async def test_every_shape_is_read_with_range_requests(
    shared_clusters: dict[int, BookieCluster], shape: tuple[int, int, int]
) -> None:
    cluster = shared_clusters[shape[0]]
    ledger_id, payloads = await write_ledger(cluster, shape)
    async with BookKeeper.connect(cluster.metadata_uri, read_batch_entries=500) as bk:
        rh = await bk.open_ledger(ledger_id, password=b"pw", recovery=False)
        before = {op: request_count(cluster, op) for op in ("read_entries", "read_entry")}
        assert [e.payload for e in await rh.read(0, COUNT - 1)] == payloads
        streamed = [e.payload async for e in rh.read_iter(1000, 1999)]
        assert streamed == payloads[1000:2000]
    # 500 entries per request (per bookie): E3 pieces of 500, E5 pieces of 2500 in 5 strides.
    expected = 6 + 2 if shape[0] == shape[1] else 5 + 5 + 5
    assert request_count(cluster, "read_entries") - before["read_entries"] == expected
    assert request_count(cluster, "read_entry") == before["read_entry"]


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_dead_bookie_is_read_around(
    bookie_cluster_factory: BookieClusterFactory, shape: tuple[int, int, int]
) -> None:
    cluster = await bookie_cluster_factory(count=shape[0])
    ledger_id, payloads = await write_ledger(cluster, shape)
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        rh = await bk.open_ledger(ledger_id, password=b"pw", recovery=False)
        dead = cluster.bookie_ids.index(rh.metadata.ensembles[0][1][1])
        cluster.kill9(dead)
        assert [e.payload for e in await rh.read(0, COUNT - 1)] == payloads
        assert [e.payload async for e in rh.read_iter(7, 1500)] == payloads[7:1501]


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_stopped_bookie_is_raced_by_speculative_reads(
    bookie_cluster_factory: BookieClusterFactory, shape: tuple[int, int, int]
) -> None:
    cluster = await bookie_cluster_factory(count=shape[0])
    ledger_id, payloads = await write_ledger(cluster, shape)
    async with BookKeeper.connect(
        cluster.metadata_uri, read_timeout=120.0, speculative_read_timeout=0.05
    ) as bk:
        rh = await bk.open_ledger(ledger_id, password=b"pw", recovery=False)
        await rh.read(0, COUNT - 1)  # Every connection is up before the bookie stops.
        # The bookie asked first: the sticky one (E = Qw: ledger id % E), else entry 0's.
        first = ledger_id % shape[0] if shape[0] == shape[1] else 0
        slow = cluster.bookie_ids.index(rh.metadata.ensembles[0][1][first])
        cluster.sigstop(slow)
        try:
            # Without speculation every request to the stopped bookie would wait 120 s.
            async with asyncio.timeout(60):
                assert [e.payload for e in await rh.read(0, COUNT - 1)] == payloads
        finally:
            cluster.sigcont(slow)


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_copy_corrupt_on_disk_is_read_from_another_replica(
    shared_clusters: dict[int, BookieCluster], shape: tuple[int, int, int]
) -> None:
    cluster = shared_clusters[shape[0]]
    ledger_id, payloads = await write_ledger(cluster, shape)
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        md = await bk.get_ledger_metadata(ledger_id)
    # The bookie asked for entry 7 first: the sticky one (E = Qw: ledger id % E), else the
    # first of its write set.
    ensemble = md.ensembles[0][1]
    first = ledger_id % shape[0] if shape[0] == shape[1] else 7 % shape[0]
    index = cluster.bookie_ids.index(ensemble[first])
    await cluster.stop(index)  # Flushes: entry 7 is in an entry log, not in a cache.
    corrupt_on_disk(cluster.bookies[index].directory, payloads[7])
    await cluster.start(index)
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        rh = await bk.open_ledger(ledger_id, password=b"pw", recovery=False)
        with capture_logs() as logs:
            assert [e.payload for e in await rh.read(0, COUNT - 1)] == payloads
    flagged = [e for e in logs if e["event"] == "range_read_bad_records"]
    assert [e["corrupt"] for e in flagged] == [[7]]


def corrupt_on_disk(directory: Path, payload: bytes) -> None:
    """Flip the last byte of `payload` where it lies in the bookie's entry logs."""
    for log in (directory / "ledgers").rglob("*.log"):
        data = log.read_bytes()
        at = data.find(payload)
        if at >= 0:
            with log.open("r+b") as file:
                file.seek(at + len(payload) - 1)
                file.write(bytes([data[at + len(payload) - 1] ^ 0xFF]))
            return
    raise AssertionError(f"{payload!r} is in no entry log under {directory}")
