"""A real bookie's /metrics: process_* of the parent and of every shard worker, and the journal's
fsync latency histogram, after real adds."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieClusterFactory


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


async def test_metrics_cover_every_process_and_journal_fsync_latency(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(count=1, shards=2)
    async with BookKeeper.connect(cluster.metadata_uri) as bk:
        for _ in range(2):  # Two ledgers: both shards journal something.
            handle = await bk.create_ledger(1, 1, 1)
            await asyncio.gather(*(handle.append(b"x" * 100) for _ in range(50)))
            await handle.close()
    text = await asyncio.to_thread(_scrape, cluster[0].admin_url + "/metrics")
    families = {family.name: family for family in text_string_to_metric_families(text)}

    cpu = families["process_cpu_seconds"]
    by_process = {sample.labels["process"]: sample.value for sample in cpu.samples}
    assert set(by_process) == {"parent", "shard-0", "shard-1"}
    assert all(value > 0 for value in by_process.values())
    memory = families["process_resident_memory_bytes"]
    assert {s.labels["process"] for s in memory.samples} == {"parent", "shard-0", "shard-1"}

    latency = families["bkaio_journal_sync_latency_seconds"]
    count = next(s.value for s in latency.samples if s.name.endswith("_count"))
    infinite = next(
        s.value for s in latency.samples if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"
    )
    assert count > 0 and infinite == count
    syncs = next(s.value for s in families["bkaio_journal_syncs"].samples)
    assert count >= syncs > 0
