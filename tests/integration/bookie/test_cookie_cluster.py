"""A real bookie process (SQLite metadata) refuses to start on directories of a cluster since
re-created (`bkaio shell metaformat --force`), and joins it once formatted; a directory it cannot
use stops its start with exit 2 and a JSON event naming the setting."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory, write_toml
from tests.fixtures.standalone import bkaio, bkaio_json


def start_fails(cluster: BookieCluster) -> list[dict[str, object]]:
    """Start bookie 0, expect it to refuse (exit 2); the JSON events it logged this time."""
    log = cluster[0].log_path
    before = log.stat().st_size if log.exists() else 0
    process = cluster.spawn(0).process
    assert process is not None
    assert process.wait(60) == 2, cluster[0].log_tail()
    cluster[0].process = None
    with open(log, "rb") as file:
        file.seek(before)
        lines = file.read().decode(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def start_error(events: list[dict[str, object]]) -> str:
    failed = [e for e in events if e["event"] == "bookie_start_failed"]
    assert len(failed) == 1, events
    assert failed[0]["level"] == "error"
    return str(failed[0]["error"])


async def write_ledger(uri: str) -> int:
    async with BookKeeper.connect(uri) as bk:
        handle = await bk.create_ledger(1, 1, 1, password=b"pw")
        for i in range(5):
            await handle.append(f"entry {i}".encode())
        await handle.close()
        return handle.ledger_id


async def test_a_bookie_does_not_join_a_recreated_cluster_with_its_old_data(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(count=1)
    uri = cluster.metadata_uri
    await write_ledger(uri)
    old = await asyncio.to_thread(bkaio_json, "shell", "clusterinfo", "--metadata", uri)
    await cluster.stop(0)
    new = await asyncio.to_thread(bkaio_json, "shell", "metaformat", "--force", "--metadata", uri)
    assert new["instance_id"] != old["instance_id"]

    error = start_error(await asyncio.to_thread(start_fails, cluster))
    assert old["instance_id"] in error and new["instance_id"] in error, error
    assert f"bkaio bookie format --force --config {cluster[0].config_path}" in error, error

    config = str(cluster[0].config_path)
    formatted = await asyncio.to_thread(bkaio, "bookie", "format", "--force", "--config", config)
    assert formatted.returncode == 0, formatted.stderr
    await cluster.start(0)
    assert cluster[0].bookie_id in await cluster.registered()
    assert await write_ledger(uri) >= 0  # The new cluster's ledger ids, on clean disks.


async def test_a_journal_dir_under_a_file_exits_2_naming_the_setting(
    bookie_cluster_factory: BookieClusterFactory, tmp_path: Path
) -> None:
    cluster = await bookie_cluster_factory(count=1)
    await cluster.stop(0)
    (tmp_path / "file").write_bytes(b"")
    journal = tmp_path / "file" / "journal"
    sections = tomllib.loads(cluster[0].config_path.read_text())
    sections["storage"]["journal_dirs"] = [str(journal)]
    write_toml(cluster[0].config_path, sections)
    error = start_error(await asyncio.to_thread(start_fails, cluster))
    assert error.startswith(f"storage.journal_dirs: cannot use {journal}/shard-0: "), error
