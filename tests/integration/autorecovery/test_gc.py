"""Bookie garbage collection with real bookies: deleted ledgers leave the disks, others stay."""

from __future__ import annotations

import asyncio
import json
import urllib.request

from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory
from tests.fixtures.etcd import EtcdServer

from .helpers import (
    AUTORECOVERY_CONFIG,
    PASSWORD,
    directory_bytes,
    entries_held,
    wait_for,
    write_ledgers,
)


def _put_gc(cluster: BookieCluster, index: int) -> list[dict[str, object]]:
    bookie = cluster.bookies[index]
    request = urllib.request.Request(
        bookie.admin_url + "/api/v1/bookie/gc",
        method="PUT",
        headers={"Authorization": f"Bearer {cluster.admin_token}"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        shards: list[dict[str, object]] = json.loads(response.read())["shards"]
    return shards


async def test_gc_reclaims_deleted_ledgers_and_keeps_the_rest(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(
        count=3, metadata_uri=etcd_server.uri, config=AUTORECOVERY_CONFIG
    )
    written = await write_ledgers(etcd_server.uri, 20, 200, 4096)  # 16 MB per bookie.
    doomed = sorted(written)[:10]
    kept = sorted(written)[10:]
    payload_bytes = 20 * 200 * 4096

    async def flushed() -> bool:  # Entries reach the entry logs within a flush interval.
        sizes = [directory_bytes(b.directory / "ledgers") for b in cluster.bookies]
        return all(size >= payload_bytes for size in sizes)

    await wait_for(flushed, 30, "every bookie flushed its entries to entry logs")
    before = [directory_bytes(b.directory / "ledgers") for b in cluster.bookies]
    async with BookKeeper.connect(etcd_server.uri) as bk:
        for ledger_id in doomed:
            await bk.delete_ledger(ledger_id)
    deleted: set[int] = set()
    for _ in range(2):  # Collected only when absent from metadata in two scans.
        for index in range(3):
            for shard in await asyncio.to_thread(_put_gc, cluster, index):
                deleted.update(shard["deleted"])  # type: ignore[arg-type]
    assert deleted == set(doomed)
    after = [directory_bytes(b.directory / "ledgers") for b in cluster.bookies]
    for index in range(3):
        assert after[index] < before[index] * 0.7, (before, after)
        for ledger_id in doomed:
            assert await entries_held(cluster, cluster.bookie_ids[index], ledger_id) == 0
    async with BookKeeper.connect(etcd_server.uri) as bk:
        for ledger_id in kept:
            handle = await bk.open_ledger(ledger_id, password=PASSWORD, recovery=False)
            entries = await handle.read(0, handle.last_entry_id)
            assert [e.payload for e in entries] == written[ledger_id]
    print(f"\nledger dirs before GC {before} bytes, after {after}")


async def test_gc_drops_fragments_moved_away_by_decommission(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    from bkaio.autorecovery import decommission_bookie

    cluster = await bookie_cluster_factory(
        count=4, metadata_uri=etcd_server.uri, config=AUTORECOVERY_CONFIG
    )
    written = await write_ledgers(etcd_server.uri, 6, 100, 256)
    target = cluster.bookie_ids[2]
    report = await decommission_bookie(etcd_server.uri, target, admin_token=cluster.admin_token)
    assert report.complete
    for _ in range(2):
        await asyncio.to_thread(_put_gc, cluster, 2)
    for ledger_id in written:
        assert await entries_held(cluster, target, ledger_id) == 0


def _http(cluster: BookieCluster, method: str, path: str, body: bytes | None = None) -> object:
    request = urllib.request.Request(
        cluster.bookies[0].admin_url + path,
        method=method,
        data=body,
        headers={"Authorization": f"Bearer {cluster.admin_token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


async def test_autorecovery_rest_endpoints(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(
        count=1, metadata_uri=etcd_server.uri, config=AUTORECOVERY_CONFIG
    )
    get = "GET"
    path = "/api/v1/autorecovery"
    assert await asyncio.to_thread(_http, cluster, get, f"{path}/status") == {"enabled": True}
    assert await asyncio.to_thread(_http, cluster, "PUT", f"{path}/status?enabled=false") == {
        "enabled": False
    }
    assert await asyncio.to_thread(_http, cluster, get, f"{path}/status") == {"enabled": False}

    async def elected() -> bool:
        answer = await asyncio.to_thread(_http, cluster, get, f"{path}/who_is_auditor")
        return answer == {"auditor": cluster.bookie_ids[0]}

    await wait_for(elected, 30, "the only bookie is auditor")
    meta = await cluster.metadata()
    await meta.underreplication.mark(42, ["10.9.9.9:3181"])
    listed = await asyncio.to_thread(_http, cluster, get, f"{path}/list_under_replicated_ledger")
    assert isinstance(listed, list) and listed[0]["ledger_id"] == 42
    assert listed[0]["missing_bookies"] == ["10.9.9.9:3181"]
