"""Group 1 — crashes and durability: F1 (writer killed), F2 (bookie killed mid-stream,
ensemble change), F3 (Qa bookies killed right after acks with unsynced writes dropped), F4
(whole-cluster power failure), and the F3 mutation check (a build that acks before fsync)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from bkaio.testing.bookie import InjectedParts
from tests.faults.harness.child import WriterChild
from tests.faults.harness.final import assert_safe, finish
from tests.faults.harness.workload import PASSWORD, Writer, close_writer
from tests.faults.scenarios.conftest import ClusterFactory

LAZY_DISK = InjectedParts(disk="lazy")


async def test_f1_writer_killed_then_recovered(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(3)
    child = await WriterChild.start(cluster.history, cluster.metadata_uri, 3, 3, 2, seed)
    try:
        await child.wait_acked(rng.randrange(50, 400))
        await asyncio.sleep(rng.uniform(0, 0.2))
    finally:
        await child.kill()
    result, report = await finish(
        cluster, [child.ledger_id], tmp_path, name="F1", schedule="kill -9 writer"
    )
    assert_safe(result, report, seed=seed)
    assert report.sealed[child.ledger_id] >= 0


async def test_f2_bookie_killed_mid_stream_ensemble_change(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(4)
    bk = await cluster.client("w0", add_timeout=2.0)
    handle = await bk.create_ledger(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
    )
    writer = Writer(cluster.history, handle, "w0", rng=rng)
    task = asyncio.ensure_future(writer.run(count=3000, pace=0.0005))
    await writer.wait_acked(300)
    victim = cluster.bookie_ids.index(handle.metadata.ensembles[0][1][rng.randrange(3)])
    cluster.bookies.kill9(victim)
    schedule = f"kill -9 bookie {victim} after {writer.acked} acks"
    await writer.wait_acked(writer.acked + 500)
    await cluster.bookies.start(victim)
    await task
    await writer.drain(30)
    assert writer.failed is None, f"BKAIO_SEED={seed}: adds failed: {writer.failed!r}"
    await close_writer(cluster.history, handle, "w0")
    assert len(handle.metadata.ensembles) >= 2, "no ensemble change after the kill"
    result, report = await finish(
        cluster, [handle.ledger_id], tmp_path, name="F2", schedule=schedule
    )
    assert_safe(result, report, seed=seed)


async def _kill_after_acks(
    make_cluster: ClusterFactory,
    tmp_path: Path,
    seed: int,
    *,
    injected: InjectedParts,
    victims: int,
    name: str,
    rounds: int = 3,
) -> tuple[object, object]:
    """E=3 Qw=2 Qa=2 on 3 bookies with the lazy disk; kill `victims` bookies at once right
    after acks, restart them on the same disks, recover and read."""
    rng = random.Random(seed)
    cluster = await make_cluster(3, injected=injected)
    ledgers: list[int] = []
    schedule: list[str] = []
    for round_number in range(rounds):
        # No explicit-LAC writes: they would be journaled and sync the previous group.
        bk = await cluster.client(f"w{round_number}", add_timeout=2.0, explicit_lac_interval=0.0)
        handle = await bk.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        ledgers.append(handle.ledger_id)
        writer = Writer(cluster.history, handle, f"w{round_number}", rng=rng, window=32)
        task = asyncio.ensure_future(writer.run())
        await writer.wait_acked(rng.randrange(100, 400))
        writer.stop()
        await task
        await writer.drain(10)  # Every ack is in: kill right after the last one.
        chosen = rng.sample(range(3), victims)
        cluster.kill9_together(chosen)
        schedule.append(f"round {round_number}: kill -9 {chosen} after {writer.acked} acks")
        await cluster.close_client(bk)
        # Together, as the cluster first started them: each start waits out its killed
        # predecessor's registration lease, and the waits need not add up.
        await asyncio.gather(*(cluster.bookies.start(index) for index in chosen))
    result, report = await finish(
        cluster, ledgers, tmp_path, name=name, schedule="; ".join(schedule)
    )
    return result, report


async def test_f3_qa_bookies_killed_after_acks_lazy_disk(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    result, report = await _kill_after_acks(
        make_cluster, tmp_path, seed, injected=LAZY_DISK, victims=2, name="F3"
    )
    assert_safe(result, report, seed=seed)  # type: ignore[arg-type]


async def test_f3_mutation_ack_before_fsync_is_caught(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    """The harness must catch a bookie that acknowledges before its fsync."""
    mutant = InjectedParts(disk="lazy", mutation="ack_before_fsync")
    result, report = await _kill_after_acks(
        make_cluster, tmp_path, seed, injected=mutant, victims=2, name="F3-mutant"
    )
    caught = not result.valid or bool(report.errors) or bool(report.unrecovered)  # type: ignore[attr-defined]
    assert caught, f"BKAIO_SEED={seed}: ack-before-fsync went unnoticed"


@pytest.mark.soak
async def test_f4_power_failure_of_every_bookie(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    result, report = await _kill_after_acks(
        make_cluster, tmp_path, seed, injected=LAZY_DISK, victims=3, name="F4"
    )
    assert_safe(result, report, seed=seed)  # type: ignore[arg-type]
