"""Crash points and disk faults: F5 (named crash points in the storage pipeline), F21 (disk
full on a size-limited tmpfs), F22 (fsync EIO via FakeDisk), F23 (journal tail truncated or
torn), F24 (bit flips before the journal tail), F25 (wiped ledger directory: cookie check)."""

from __future__ import annotations

import asyncio
import random
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from bkaio.ledger_client.ledger_handle import LedgerHandle
from bkaio.testing.bookie import InjectedParts
from tests.faults.harness.cluster import FaultCluster
from tests.faults.harness.final import assert_safe, finish
from tests.faults.harness.nemesis import (
    flip_journal_bits,
    tear_journal_tail,
    tmpfs,
    truncate_journal_tail,
)
from tests.faults.harness.workload import PASSWORD, Writer, close_writer
from tests.faults.scenarios.conftest import ClusterFactory
from tests.fixtures.bookies import NOTHING_INJECTED

# Flush and checkpoint often, so crash points in that path are reached within seconds.
FAST_FLUSH = {"BKAIO_STORAGE_FLUSH_INTERVAL_SECONDS": "0.2"}


async def _write_while(
    cluster: FaultCluster,
    seed: int,
    *,
    count: int,
    name: str = "w0",
    ensemble: tuple[int, int, int] = (3, 3, 2),
    payload_bytes: int = 64,
    before: Callable[[LedgerHandle], Awaitable[None]] | None = None,
) -> tuple[Writer, int]:
    """Create a ledger, run `before(handle)`, append `count` entries, close."""
    rng = random.Random(seed)
    bk = await cluster.client(name, add_timeout=2.0)
    handle = await bk.create_ledger(*ensemble, password=PASSWORD)
    if before is not None:
        await before(handle)
    writer = Writer(cluster.history, handle, name, rng=rng, payload_bytes=payload_bytes)
    await writer.run(count=count, pace=0.001)
    await writer.drain(30)
    await close_writer(cluster.history, handle, name)
    return writer, handle.ledger_id


@pytest.mark.parametrize(
    "point",
    [
        "journal.after_write_before_sync",
        pytest.param("journal.after_sync_before_ack", marks=pytest.mark.soak),
        pytest.param("checkpoint.before_rename", marks=pytest.mark.soak),
    ],
)
async def test_f5_crash_points(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int, point: str
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(4, env=FAST_FLUSH)
    passes = rng.randrange(5, 60)
    await cluster.start_bookie(0, InjectedParts(crash_point=f"{point}:{passes}"))
    _writer, ledger_id = await _write_while(cluster, seed, count=600)
    crashed = not cluster.bookies[0].running
    if crashed:
        cluster.bookies.kill9(0)  # Reap it (already gone).
    await cluster.start_bookie(0, NOTHING_INJECTED)  # No crash point: replay, then serve.
    result, report = await finish(
        cluster, [ledger_id], tmp_path, name="F5", schedule=f"{point}:{passes} crashed={crashed}"
    )
    assert_safe(result, report, seed=seed)


async def test_f21_disk_full_on_tmpfs(tmp_path: Path, etcd_server: object, seed: int) -> None:
    from tests.fixtures.etcd import EtcdServer

    assert isinstance(etcd_server, EtcdServer)
    env = {"BKAIO_JOURNAL_MAX_FILE_BYTES": str(512 * 1024), **FAST_FLUSH}
    cluster = FaultCluster(tmp_path / "c", etcd_server.uri, bookies=4, seed=seed, env=env)
    full = cluster.bookies[1].directory
    with tmpfs(full / "journal", 3 << 20), tmpfs(full / "ledgers", 3 << 20):
        async with cluster:
            writer, ledger_id = await _write_while(
                cluster, seed, count=4000, payload_bytes=2048, ensemble=(4, 4, 2)
            )
            assert writer.failed is None, f"BKAIO_SEED={seed}: {writer.failed!r}"
            log = await asyncio.to_thread(cluster.bookies[1].log_path.read_text)
            assert "read_only" in log or "No space" in log, "bookie 1 never ran out of space"
            result, report = await finish(
                cluster, [ledger_id], tmp_path, name="F21", schedule="bookie 1 on 3 MiB tmpfs"
            )
            assert_safe(result, report, seed=seed)


async def test_f22_fsync_eio_on_one_bookie(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(4)
    after = rng.randrange(5, 100)
    victim: list[int] = []

    async def break_one(handle: LedgerHandle) -> None:  # A bookie of the ledger's ensemble.
        index = cluster.bookie_ids.index(rng.choice(handle.metadata.ensembles[0][1]))
        victim.append(index)
        await cluster.start_bookie(index, InjectedParts(disk=f"lazy,eio_after_syncs={after}"))

    writer, ledger_id = await _write_while(cluster, seed, count=800, before=break_one)
    assert writer.failed is None, f"BKAIO_SEED={seed}: {writer.failed!r}"
    log = await asyncio.to_thread(cluster.bookies[victim[0]].log_path.read_text)
    assert "injected fsync failure" in log, "the EIO never happened"
    # A healthy disk: replay shows what was synced.
    await cluster.start_bookie(victim[0], NOTHING_INJECTED)
    result, report = await finish(
        cluster, [ledger_id], tmp_path, name="F22", schedule=f"EIO after {after} syncs"
    )
    assert_safe(result, report, seed=seed)


@pytest.mark.parametrize("damage", ["truncate", "tear"])
async def test_f23_journal_tail_damaged(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int, damage: str
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(3)
    _writer, ledger_id = await _write_while(cluster, seed, count=500)
    victim = rng.randrange(3)
    cluster.bookies.kill9(victim)
    bookie_dir = cluster.bookies[victim].directory
    hurt = truncate_journal_tail if damage == "truncate" else tear_journal_tail
    what = await asyncio.to_thread(hurt, bookie_dir, rng)
    refused = False
    try:  # A cut after the last sync is a torn tail: replay stops cleanly there and it starts.
        await cluster.bookies.start(victim, timeout_seconds=30)
    except RuntimeError as error:  # A cut below its checkpoint mark is damage, not a crash:
        refused = True  # refusing to start is the safe answer (it must not deny entries).
        print(f"bookie {victim} refused to start: {str(error)[-300:]}")
    result, report = await finish(
        cluster,
        [ledger_id],
        tmp_path,
        name="F23",
        schedule=f"bookie {victim}: {what}; refused={refused}",
        leave_down=frozenset({victim}) if refused else frozenset(),
    )
    assert_safe(result, report, seed=seed)


async def test_f24_bit_flip_before_the_journal_tail(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(3)
    _writer, ledger_id = await _write_while(cluster, seed, count=500, payload_bytes=512)
    victim = rng.randrange(3)
    cluster.bookies.kill9(victim)
    what = await asyncio.to_thread(flip_journal_bits, cluster.bookies[victim].directory, rng)
    refused = False
    try:
        await cluster.bookies.start(victim, timeout_seconds=30)
    except RuntimeError as error:  # Refusing to start on mid-file corruption is acceptable.
        refused = True
        print(f"bookie {victim} refused to start: {str(error)[:300]}")
    result, report = await finish(
        cluster,
        [ledger_id],
        tmp_path,
        name="F24",
        schedule=f"bookie {victim}: {what}; refused={refused}",
        leave_down=frozenset({victim}) if refused else frozenset(),
    )
    assert_safe(result, report, seed=seed)


async def test_f25_wiped_ledger_directory_refuses_to_start(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(3)
    _writer, ledger_id = await _write_while(cluster, seed, count=300)
    victim = rng.randrange(3)
    await cluster.bookies.stop(victim)
    directory = cluster.bookies[victim].directory
    wiped = rng.choice(["ledgers", "journal"])
    await asyncio.to_thread(shutil.rmtree, directory / wiped)
    with pytest.raises(RuntimeError) as refused:
        await cluster.bookies.start(victim, timeout_seconds=30)
    assert "cookie" in str(refused.value).lower(), str(refused.value)[-500:]
    result, report = await finish(
        cluster,
        [ledger_id],
        tmp_path,
        name="F25",
        schedule=f"bookie {victim}: rm -rf {wiped}",
        leave_down=frozenset({victim}),
    )
    assert_safe(result, report, seed=seed)
