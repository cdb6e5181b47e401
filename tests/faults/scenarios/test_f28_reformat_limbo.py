"""F28 — a reformatted bookie must never make an acknowledged entry disappear (limbo).

E3 Qw3 Qa2 on b0, b1, b2. The first entries reach all three; the last ones reach b1 and b2
only (the writer's adds to b0 are dropped by its proxy), so they are acknowledged by b1 and b2.
The writer stops without closing. b2 is reformatted (`bkaio bookie format --force`, refused
while it runs), b1 is killed, and b2 restarts with the same id: it comes back in limbo for the
ledger. Recovery now has b0's "no such entry" and b2's "data unknown" for the last entries:
it must fail retryably (the ledger stays unsealed), never seal at b0's end. Once b1 is back it
seals at the true last acknowledged entry; b2 copies its fragments back and leaves limbo; every
entry is then readable from all three bookies; the history checker agrees. Its mutation
check: a recoverer that trusts b2's answer seals short, and the checker must say so.
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bkaio.ledger_client import BookKeeper
from bkaio.meta.ledger_metadata import LedgerState
from bkaio.protocol.messages import Flag, Op, ReadEntryRequest, ReadEntryResponse
from bkaio.protocol.status import Status
from bkaio.testing.mutations import LIMBO_TRUSTING_RECOVERY_READS
from tests.faults.harness.cluster import FaultCluster
from tests.faults.harness.final import assert_safe, finish
from tests.faults.harness.proxy import Direction, FrameRule
from tests.faults.harness.workload import PASSWORD, Writer, recover
from tests.faults.scenarios.conftest import ClusterFactory
from tests.integration.autorecovery.helpers import bkaio_cli, verify_full_replication
from tests.integration.bookie.raw_client import RawClient

# Autorecovery on, but b1's absence is never long enough for its ledgers to be re-replicated:
# b2's own limbo repair copies its fragments back; the ledger check fills in b0, which missed
# the tail (recovery re-writes the tail until Qa bookies have it, not all of Qw).
CONFIG: dict[str, dict[str, Any]] = {
    "autorecovery": {
        "lost_bookie_delay_seconds": 3600.0,
        "ledger_check_interval_seconds": 2.0,
        "retry_backoff_seconds": 0.5,
        "poll_interval_seconds": 0.5,
        "worker_lease_ttl_seconds": 3.0,
        "auditor_lease_ttl_seconds": 3.0,
    }
}


def _admin_info(admin_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{admin_url}/api/v1/bookie/info", timeout=10.0) as response:
        body: dict[str, Any] = json.loads(response.read())
    return body


async def _limbo_ledgers(admin_url: str) -> int:
    info = await asyncio.to_thread(_admin_info, admin_url)
    return int(info["limbo"]["ledgers"])


async def _raw_read(host_port: str, ledger_id: int, entry_id: int) -> ReadEntryResponse:
    host, port = host_port.rsplit(":", 1)
    client = await RawClient.connect(host, int(port))
    try:
        response = await client.request(
            ReadEntryRequest(client.next_id(), ledger_id, entry_id, Flag.NONE, None)
        )
    finally:
        await client.close()
    assert isinstance(response, ReadEntryResponse)
    return response


@dataclass
class _Reformatted:
    """The F28 cluster once b2 is back in limbo and b1 is down."""

    cluster: FaultCluster
    ledger_id: int
    last_acked: int
    tail: int
    b1_index: int
    b2_index: int
    schedule: str


async def _reformat_with_b1_down(make_cluster: ClusterFactory, seed: int) -> _Reformatted:
    rng = random.Random(seed)
    cluster = await make_cluster(3, config=CONFIG)
    writer_bk = await cluster.client("w", add_timeout=30.0)
    handle = await writer_bk.create_ledger(3, 3, 2, password=PASSWORD)
    ledger_id = handle.ledger_id
    b0, b1, b2 = handle.metadata.ensembles[0][1]
    i1, i2 = cluster.bookie_ids.index(b1), cluster.bookie_ids.index(b2)
    everywhere = rng.randrange(20, 60)
    tail = rng.randrange(3, 10)
    writer = Writer(cluster.history, handle, "w", rng=rng, window=8)
    await writer.run(count=everywhere)
    await writer.wait_acked(everywhere)
    cluster.link("w", b0).rules.append(FrameRule(Direction.UP, op=Op.ADD_ENTRY, action="drop"))
    for seq in range(everywhere, everywhere + tail):
        writer.append_one(seq)
    await writer.wait_acked(everywhere + tail)  # Acknowledged by b1 and b2 alone.
    last_acked = everywhere + tail - 1
    await cluster.close_client(writer_bk)  # The writer stops; the ledger stays open.

    # b2's disks are wiped and formatted: refused while it runs, then done.
    config_path = str(cluster.bookies[i2].config_path)
    refused = await bkaio_cli("bookie", "format", "--config", config_path, "--force")
    assert refused.returncode == 1 and "registered and alive" in refused.stderr, refused
    await cluster.bookies.stop(i2)
    await cluster.bookies.wait_until_deregistered(i2)
    formatted = await bkaio_cli("bookie", "format", "--config", config_path, "--force")
    assert formatted.returncode == 0, formatted.stderr
    cluster.bookies.kill9(i1)  # Before b2 is back: its own repair cannot finish without b1.
    await cluster.bookies.start(i2)
    assert await _limbo_ledgers(cluster.bookies[i2].admin_url) == 1
    offline = json.loads(
        (await bkaio_cli("bookie", "info", "--config", config_path, "--json")).stdout
    )
    assert offline["limbo"]["ledgers"] == 1

    # In limbo b2 answers DATA_UNKNOWN for what it lacks, never NO_SUCH_ENTRY.
    answer = await _raw_read(b2, ledger_id, last_acked)
    assert answer.status is Status.DATA_UNKNOWN, answer
    assert (await _raw_read(b0, ledger_id, last_acked)).status is Status.NO_SUCH_ENTRY
    schedule = (
        f"{everywhere} entries on all, {tail} on {b1},{b2} only; {b2} reformatted, {b1} killed"
    )
    return _Reformatted(cluster, ledger_id, last_acked, tail, i1, i2, schedule)


async def test_f28_reformatted_bookie_in_limbo_never_seals_short(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    f28 = await _reformat_with_b1_down(make_cluster, seed)
    cluster, ledger_id, last_acked = f28.cluster, f28.ledger_id, f28.last_acked
    recoverer = await cluster.client("r", read_timeout=5.0, add_timeout=5.0)
    for _ in range(2):
        sealed = await recover(cluster.history, recoverer, ledger_id, "r", seconds=30.0)
        assert sealed is None, f"BKAIO_SEED={seed}: sealed at {sealed} with b1 down"
    md = await recoverer.get_ledger_metadata(ledger_id)
    assert md.state is LedgerState.IN_RECOVERY, md

    await cluster.bookies.start(f28.b1_index)
    sealed = await recover(cluster.history, recoverer, ledger_id, "r", seconds=60.0)
    assert sealed == last_acked, f"BKAIO_SEED={seed}: sealed at {sealed}, acked {last_acked}"

    admin = cluster.bookies[f28.b2_index].admin_url
    for _ in range(1800):  # Its repair retries as soon as b1 registers again.
        if await _limbo_ledgers(admin) == 0:
            break
        await asyncio.sleep(0.1)
    info = await asyncio.to_thread(_admin_info, admin)
    assert info["limbo"]["ledgers"] == 0, info["limbo"]
    assert info["limbo"]["entries_copied"] >= last_acked + 1 - f28.tail, info["limbo"]

    direct = await BookKeeper.connect(cluster.metadata_uri)
    try:
        reader = await direct.open_ledger(ledger_id, password=PASSWORD, recovery=False)
        payloads = [entry.payload for entry in await reader.read(0, last_acked)]
    finally:
        await direct.close()
    final_md = await recoverer.get_ledger_metadata(ledger_id)
    for attempt in range(120):  # Until the ledger check found b0's gap and it was filled.
        try:
            copies = await verify_full_replication(cluster.bookies, final_md, payloads)
            break
        except AssertionError:
            if attempt == 119:
                raise
            await asyncio.sleep(1.0)
    assert copies == 3 * len(payloads)
    schedule = f"{f28.schedule}; recovery refused twice; b1 back; sealed {sealed}"
    result, report = await finish(cluster, [ledger_id], tmp_path, name="F28", schedule=schedule)
    assert_safe(result, report, seed=seed)


async def test_f28_mutation_trusting_a_reformatted_bookie_is_caught(
    make_cluster: ClusterFactory, tmp_path: Path, seed: int
) -> None:
    """The same schedule with a recoverer that takes b2's DATA_UNKNOWN for "no such entry":
    with b0's "no" that makes two, the ledger is sealed before b1's entries, and the checker
    must report the acknowledged entries lost."""
    f28 = await _reformat_with_b1_down(make_cluster, seed)
    cluster = f28.cluster
    recoverer = await cluster.client(
        "r", read_timeout=5.0, add_timeout=5.0, recovery_reads=LIMBO_TRUSTING_RECOVERY_READS
    )
    sealed = await recover(cluster.history, recoverer, f28.ledger_id, "r", seconds=30.0)
    await cluster.bookies.start(f28.b1_index)
    schedule = f"{f28.schedule}; MUTANT recoverer trusted limbo; sealed {sealed}"
    result, _report = await finish(
        cluster, [f28.ledger_id], tmp_path, name="F28-mutant", schedule=schedule
    )
    assert "lost-acked-write" in result.kinds(), result.summary()
