"""Operator tools that need bookies stopped, killed or configured apart: `updatecookie` after a
rename and a move, the background scrubber finding a damaged entry, and `simpletest` cleaning
up when a bookie dies under it. Real bookie processes, `bkaio` in a subprocess."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

from bkaio.entrylog.log_reader import iter_log_records
from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory, write_toml
from tests.fixtures.standalone import BKAIO, bkaio, bkaio_json


def rewrite_config(cluster: BookieCluster, index: int, **changes: dict[str, Any]) -> None:
    path = cluster[index].config_path
    sections = tomllib.loads(path.read_text())
    for section, values in changes.items():
        sections.setdefault(section, {}).update(values)
    write_toml(path, sections)


def start_fails(cluster: BookieCluster, index: int) -> str:
    """Start bookie `index`, expect it to refuse (exit 2); what it logged this time."""
    log = cluster[index].log_path
    before = log.stat().st_size if log.exists() else 0
    process = cluster.spawn(index).process
    assert process is not None
    assert process.wait(60) == 2
    cluster[index].process = None
    with open(log, "rb") as file:
        file.seek(before)
        return file.read().decode(errors="replace")


async def write_ledger(uri: str, entries: int = 20) -> int:
    async with BookKeeper.connect(uri) as bk:
        handle = await bk.create_ledger(1, 1, 1, password=b"pw")
        for i in range(entries):
            await handle.append(f"entry {i}".encode())
        await handle.close()
        return handle.ledger_id


async def read_ledger(uri: str, ledger_id: int) -> list[bytes]:
    async with BookKeeper.connect(uri) as bk:
        handle = await bk.open_ledger(ledger_id, password=b"pw", recovery=False)
        return [entry.payload for entry in await handle.read(0, handle.last_entry_id)]


async def test_updatecookie_after_a_rename_and_a_move(
    bookie_cluster_factory: BookieClusterFactory, tmp_path: Path
) -> None:
    cluster = await bookie_cluster_factory(count=1)
    uri = cluster.metadata_uri
    ledger_id = await write_ledger(uri)
    old_id = cluster[0].bookie_id
    config = str(cluster[0].config_path)
    running = await asyncio.to_thread(bkaio, "bookie", "updatecookie", "--directories",
                                      "--config", config)  # fmt: skip
    assert running.returncode == 1 and "BookieRunningError" in running.stderr
    await cluster.stop(0)

    rewrite_config(cluster, 0, bookie={"bookie_id": f"renamed:{cluster[0].port}"})
    assert "does not match" in await asyncio.to_thread(start_fails, cluster, 0)
    report = await asyncio.to_thread(
        bkaio_json, "bookie", "updatecookie", "--old-bookie-id", old_id, "--config", config
    )
    assert report["old_bookie_id"] == old_id and report["bookie_id"] == f"renamed:{cluster[0].port}"
    assert report["directories_stamped"] == 3 and report["ledgers_naming_old_id"] == 1
    await cluster.start(0)
    assert f"renamed:{cluster[0].port}" in await cluster.registered()
    await cluster.stop(0)

    moved = tmp_path / "moved"
    shutil.move(cluster[0].directory / "journal", moved / "journal")
    shutil.move(cluster[0].directory / "ledgers", moved / "ledgers")
    rewrite_config(
        cluster,
        0,
        storage={"journal_dirs": [str(moved / "journal")], "ledger_dirs": [str(moved / "ledgers")]},
    )
    assert "does not match" in await asyncio.to_thread(start_fails, cluster, 0)
    moved_report = await asyncio.to_thread(
        bkaio_json, "bookie", "updatecookie", "--directories", "--config", config
    )
    assert moved_report["directories_stamped"] == 3 and moved_report["metadata_updated"]
    await cluster.start(0)
    # Every entry is where the moved index says (the ledger's metadata still names the old id,
    # so a client would look for it there: that is autorecovery's to repair).
    check = await asyncio.to_thread(
        bkaio_json, "bookie", "localconsistencycheck", "--config", config
    )
    assert [row["ledger_id"] for row in check["ledgers"]] == [ledger_id] and check["ok"]


def _admin_get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read()
    return json.loads(body) if url.endswith(("info", "state")) else body.decode()


async def _scrub_status(cluster: BookieCluster) -> dict[str, Any]:
    info = await asyncio.to_thread(_admin_get, cluster[0].admin_url + "/api/v1/bookie/info")
    status: dict[str, Any] = info["shards"][0]["scrub"]
    return status


async def wait_for_scrub(cluster: BookieCluster, done: Any) -> dict[str, Any]:
    async with asyncio.timeout(60):
        while True:
            status = await _scrub_status(cluster)
            if done(status):
                return status
            await asyncio.sleep(0.2)


def damage(log: Path, ledger_id: int, entry_id: int) -> None:
    record = next(
        r
        for r in iter_log_records(log)
        if r.entry is not None and (r.entry.ledger_id, r.entry.entry_id) == (ledger_id, entry_id)
    )
    with open(log, "r+b") as file:
        file.seek(record.offset + record.size - 1)
        byte = file.read(1)
        file.seek(record.offset + record.size - 1)
        file.write(bytes([byte[0] ^ 0xFF]))


async def test_the_scrubber_finds_a_damaged_entry(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(
        count=1,
        config={
            "scrub": {"period_seconds": 0.3, "rate_entries_per_second": 10_000},
            "storage": {"flush_interval_seconds": 0.2},
        },
    )
    ledger_id = await write_ledger(cluster.metadata_uri)
    clean = await wait_for_scrub(cluster, lambda s: s["last_entries"] >= 20)
    assert clean["enabled"] and clean["last_problems"] == 0
    logs = sorted((cluster[0].directory / "ledgers").glob("shard-0/entrylog/logs/*.log"))
    await asyncio.to_thread(damage, logs[0], ledger_id, 5)
    found = await wait_for_scrub(cluster, lambda s: s["last_problems"] >= 1)
    assert found["last_ledgers_with_problems"] == [ledger_id]
    assert found["last_problem_samples"][0]["entry_id"] == 5
    metrics = await asyncio.to_thread(_admin_get, cluster[0].admin_url + "/metrics")
    found_total = re.search(r"^bkaio_bookie_scrub_problems_total (\S+)$", metrics, re.MULTILINE)
    assert found_total is not None and float(found_total.group(1)) >= 1  # Once per scrub.
    assert "bkaio_bookie_scrub_last_run_problems 1.0" in metrics


async def _ledger_ids(cluster: BookieCluster) -> list[int]:
    metadata = await cluster.metadata()
    return [ledger_id async for ledger_id in metadata.ledgers.list_ids()]


async def test_simpletest_deletes_its_ledger_when_a_bookie_dies_under_it(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(count=2)
    uri = cluster.metadata_uri
    test = await asyncio.create_subprocess_exec(
        BKAIO, "shell", "simpletest", "--entries", "1000000", "-e", "2", "-w", "2", "-a", "2",
        "--json", "--metadata", uri,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(60):
            # Until its ledger exists (or it failed by itself: a loaded box can time an append
            # out, and then the same cleanup must have run).
            while True:
                if test.returncode is not None or await _ledger_ids(cluster):
                    break
                await asyncio.sleep(0.05)
        if test.returncode is None:
            cluster.kill9(1)
        async with asyncio.timeout(240):  # The client's bounded give-up, then the cleanup.
            _, err_bytes = await test.communicate()
    finally:
        if test.returncode is None:
            test.kill()
            await test.communicate()
    err = err_bytes.decode()
    assert test.returncode == 1, err
    assert err.count("\n") == 1 and json.loads(err)["kind"]
    assert await _ledger_ids(cluster) == []
