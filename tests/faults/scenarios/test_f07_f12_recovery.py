"""Group 2 — fencing and recovery races on real processes: F7 zombie writer, F8 lost fence +
late add (BookKeeper 2614, scripted with frame rules on the proxies) and its mutation check,
F9 two concurrent recoverers, F10 empty current fragment (2615), F11 partial availability and
a hanging bookie, F12 fence durability across kill -9."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

from bkaio.ledger_client.recovery import FENCED_RECOVERY_READS, RecoveryReadPolicy
from bkaio.protocol.messages import Flag, Op
from bkaio.testing.mutations import UNFENCED_RECOVERY_READS
from tests.faults.harness.child import WriterChild
from tests.faults.harness.final import assert_safe, finish
from tests.faults.harness.proxy import Direction, FrameRule
from tests.faults.harness.workload import PASSWORD, Writer, recover
from tests.faults.scenarios.conftest import ClusterFactory


async def test_f7_zombie_writer_paused_then_resumed(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(3)
    child = await WriterChild.start(cluster.history, cluster.metadata_uri, 3, 3, 2, seed)
    try:
        await child.wait_acked(rng.randrange(50, 300))
        child.signal(signal.SIGSTOP)
        await child.quiesce()  # Every line written before the pause is in the history now.
        recoverer = await cluster.client("r", proxied=False)
        sealed = await recover(cluster.history, recoverer, child.ledger_id, "recoverer")
        assert sealed is not None, f"BKAIO_SEED={seed}: recovery failed"
        child.signal(signal.SIGCONT)
        await asyncio.sleep(1.5)  # The zombie keeps appending: every add must be fenced.
    finally:
        await child.kill()
    result, report = await finish(
        cluster, [child.ledger_id], tmp_path, name="F7", schedule="SIGSTOP writer, recover, SIGCONT"
    )
    assert_safe(result, report, seed=seed)
    assert result.stats["failed"] > 0, "the resumed zombie never saw a fenced add"


async def _f8_schedule(  # type: ignore[no-untyped-def]
    cluster_factory: ClusterFactory,
    tmp_path: Path,
    seed: int,
    name: str,
    recovery_reads: RecoveryReadPolicy = FENCED_RECOVERY_READS,
):
    """Writer's add of e0 reaches b2 only (held to b1, b3); the recoverer's fence to b3 is
    dropped and its read from b2 is late, so b1 and b3 answer NO_SUCH_ENTRY; then the held
    add is released to b3. `recovery_reads`: the recoverer's policy (the mutation check's)."""
    cluster = await cluster_factory(3)
    writer_bk = await cluster.client("w", add_timeout=30.0)
    handle = await writer_bk.create_ledger(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
    )
    b1, b2, b3 = handle.metadata.ensembles[0][1]
    for bookie in (b1, b3):
        cluster.link("w", bookie).rules.append(FrameRule(Direction.UP, op=Op.ADD_ENTRY))
    writer = Writer(cluster.history, handle, "w", rng=random.Random(seed), window=1)
    add = writer.append_one(0)
    assert add is not None
    await asyncio.sleep(0.5)
    assert cluster.link("w", b1).held_count == 1 and cluster.link("w", b3).held_count == 1
    recoverer = await cluster.client("r", read_timeout=10.0, recovery_reads=recovery_reads)
    cluster.link("r", b3).rules.append(
        FrameRule(Direction.UP, op=Op.READ_LAC, flags=Flag.FENCE, action="drop")
    )
    cluster.link("r", b2).rules.append(
        FrameRule(Direction.UP, op=Op.READ_ENTRY, action="delay", delay=3.0)
    )
    sealed = await recover(cluster.history, recoverer, handle.ledger_id, "recoverer")
    cluster.link("w", b3).release()
    await asyncio.sleep(1.0)  # b3 answers first; b1 (fenced by READ_LAC) answers FENCED later.
    cluster.link("w", b1).release()
    await writer.drain(10)
    schedule = f"e0 held to {b1},{b3}; fence to {b3} dropped; read from {b2} late; sealed {sealed}"
    return await finish(cluster, [handle.ledger_id], tmp_path, name=name, schedule=schedule)


async def test_f8_lost_fence_and_late_add(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    result, report = await _f8_schedule(make_cluster, tmp_path, seed, "F8")
    assert_safe(result, report, seed=seed)


async def test_f8_mutation_unfenced_recovery_reads_is_caught(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    result, _report = await _f8_schedule(
        make_cluster, tmp_path, seed, "F8-mutant", UNFENCED_RECOVERY_READS
    )
    assert "lost-acked-write" in result.kinds(), result.summary()


async def test_f9_two_concurrent_recoverers(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(3)
    writer_bk = await cluster.client("w", add_timeout=2.0)
    handle = await writer_bk.create_ledger(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
    )
    writer = Writer(cluster.history, handle, "w", rng=rng)
    task = asyncio.ensure_future(writer.run())
    await writer.wait_acked(rng.randrange(100, 500))
    one = await cluster.client("r1")
    two = await cluster.client("r2")
    for link in cluster.links("r2"):
        link.delay = (0.0, 0.05)  # One recoverer is slower: it may see more or fewer entries.
    ends = await asyncio.gather(
        recover(cluster.history, one, handle.ledger_id, "r1"),
        recover(cluster.history, two, handle.ledger_id, "r2"),
    )
    writer.stop()
    await task
    await writer.drain(10)
    await cluster.close_client(writer_bk)
    assert ends[0] is not None and ends[0] == ends[1], f"BKAIO_SEED={seed}: ends {ends}"
    result, report = await finish(
        cluster, [handle.ledger_id], tmp_path, name="F9", schedule="two recoverers, one slowed"
    )
    assert_safe(result, report, seed=seed)


async def test_f10_empty_current_fragment(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(4)
    writer_bk = await cluster.client("w", add_timeout=20.0)
    handle = await writer_bk.create_ledger(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
    )
    writer = Writer(cluster.history, handle, "w", rng=rng, window=16)
    await writer.run(count=rng.randrange(20, 100))
    await writer.drain(20)
    last_acked = handle.last_add_confirmed
    ensemble = handle.metadata.ensembles[0][1]
    victim = cluster.bookie_ids.index(ensemble[rng.randrange(3)])
    for link in cluster.links("w"):  # Nothing reaches the new fragment...
        link.rules.append(FrameRule(Direction.UP, op=Op.ADD_ENTRY, action="drop"))
    cluster.bookies.kill9(victim)  # ...but the ensemble change happens at once.
    writer.append_one(10_000)
    for _ in range(100):
        if len(handle.metadata.ensembles) > 1:
            break
        await asyncio.sleep(0.1)
    assert len(handle.metadata.ensembles) > 1, "no ensemble change"
    await cluster.close_client(writer_bk)  # The writer dies before any entry lands.
    recoverer = await cluster.client("r", proxied=False)
    sealed = await recover(cluster.history, recoverer, handle.ledger_id, "recoverer")
    assert sealed == last_acked, f"BKAIO_SEED={seed}: sealed {sealed}, last acked {last_acked}"
    result, report = await finish(
        cluster,
        [handle.ledger_id],
        tmp_path,
        name="F10",
        schedule=f"acked to {last_acked}, kill bookie {victim}, empty new fragment",
    )
    assert_safe(result, report, seed=seed)


async def test_f11_partial_availability_and_hanging_bookie(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(3)
    writer_bk = await cluster.client("w", add_timeout=2.0)
    ledgers = []
    for _ in range(2):
        handle = await writer_bk.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        writer = Writer(cluster.history, handle, "w", rng=rng, window=32)
        await writer.run(count=rng.randrange(50, 200))
        await writer.drain(10)
        ledgers.append(handle.ledger_id)
    await cluster.close_client(writer_bk)
    # Qw - Qa + 1 = 2 answer, the third hangs (SIGSTOP): recovery decides from the two.
    cluster.bookies.sigstop(2)
    recoverer = await cluster.client("r", proxied=False, read_timeout=3.0)
    sealed = await recover(cluster.history, recoverer, ledgers[0], "recoverer", seconds=60)
    assert sealed is not None, f"BKAIO_SEED={seed}: recovery with a hanging bookie failed"
    # Only Qw - Qa = 1 left: recovery must not seal.
    cluster.bookies.kill9(1)
    none = await recover(cluster.history, recoverer, ledgers[1], "recoverer", seconds=15)
    assert none is None, f"BKAIO_SEED={seed}: sealed at {none} with one bookie answering"
    result, report = await finish(
        cluster, ledgers, tmp_path, name="F11", schedule="SIGSTOP b2; recover; kill b1; recover"
    )
    assert_safe(result, report, seed=seed)


async def test_f12_fence_survives_kill9_of_every_bookie(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await make_cluster(3)
    writer_bk = await cluster.client("w", add_timeout=3.0)
    handle = await writer_bk.create_ledger(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
    )
    writer = Writer(cluster.history, handle, "w", rng=rng, window=8)
    await writer.run(count=20)
    await writer.drain(10)
    recoverer = await cluster.client("r", proxied=False)
    sealed = await recover(cluster.history, recoverer, handle.ledger_id, "recoverer")
    assert sealed is not None
    for index in range(3):  # Right after the fence answers: kill -9, restart on the same disks.
        cluster.bookies.kill9(index)
    await asyncio.gather(*(cluster.bookies.start(index) for index in range(3)))
    late = writer.append_one(1000)  # The old writer: every bookie must still say FENCED.
    if late is not None:
        await writer.drain(20)
    result, report = await finish(
        cluster, [handle.ledger_id], tmp_path, name="F12", schedule="fence, kill -9 all, add"
    )
    assert_safe(result, report, seed=seed)
