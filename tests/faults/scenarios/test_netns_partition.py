"""F18 with kernel partitions: every bookie and the writer in its own network namespace
(tests/faults/harness/netns.py), one bookie cut off by nftables mid-run, then healed.

Bookies listen on their namespace's address (config `bookie.host`, so that address is also
their bookie id); metadata is the SQLite store in the test's tmp dir, which every namespace
reaches because it is a file. The writer is `writer_child` (E3/Qw3/Qa2, 64 adds in flight)
started with `ip netns exec` in the `client` namespace; the final phase runs in this process on a
thread inside `client` as well. With three bookies there is no replacement for the isolated one:
adds go on with the two that remain (Qa = 2), the isolated bookie is left out of the ledger.
The seed picks the victim, silence (drop: adds time out) or TCP resets, and the timing.
Skipped without root, ip or nft (reference/faults.md B5).
"""

from __future__ import annotations

import asyncio
import os
import random
import tomllib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bkaio.meta import initialise_cluster_at
from tests.faults.harness.child import WriterChild
from tests.faults.harness.cluster import FaultCluster
from tests.faults.harness.final import assert_safe, finish
from tests.faults.harness.netns import NetnsNetwork, netns_available
from tests.fixtures.bookies import write_toml

SOAK = os.environ.get("BKAIO_SOAK") == "1"
BOOKIES = 3
WRITER_ADD_TIMEOUT_SECONDS = 3.0  # writer_child's add_timeout: a silent bookie fails after it.


def _bookie_host(index: int) -> str:
    return f"b{index}"


@pytest.fixture
def net() -> Iterator[NetnsNetwork]:
    available = netns_available()
    if not available:
        pytest.skip(available.reason)
    network = NetnsNetwork.create([*(_bookie_host(i) for i in range(BOOKIES)), "client"])
    try:
        yield network
    finally:
        network.close()  # After the cluster fixture stopped every bookie in it.


def _spawn_in_namespace(cluster: FaultCluster, net: NetnsNetwork, index: int) -> None:
    """Start bookie `index` inside its namespace, listening on (and known by) that address."""
    bookie = cluster.bookies[index]
    host = _bookie_host(index)
    bookie.host = net.address(host)  # The bookie id becomes "<namespace address>:<port>".
    sections = tomllib.loads(bookie.config_path.read_text())
    sections["bookie"]["host"] = bookie.host
    write_toml(bookie.config_path, sections)
    cluster.spawn_under(index, net.exec_prefix(host))


async def _reachable(net: NetnsNetwork, host: str, address: str, port: int) -> bool:
    """Does a TCP connect from `host` to address:port succeed (within a second)?"""

    async def connect() -> bool:
        try:
            _reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), 1.0)
        except (TimeoutError, OSError):
            return False
        writer.close()
        return True

    return await net.run_in(host, connect)


@pytest.fixture
async def netns_cluster(
    net: NetnsNetwork, tmp_path: Path, seed: int
) -> AsyncIterator[FaultCluster]:
    base = tmp_path / "cluster"
    base.mkdir()
    metadata_uri = f"sqlite://{base / 'meta.db'}"
    # The bookies are spawned one by one (inside namespaces), not by the cluster's __aenter__,
    # so the store they refuse to run without is created here.
    await initialise_cluster_at(metadata_uri, exist_ok=True)
    cluster = FaultCluster(base, metadata_uri, bookies=BOOKIES, seed=seed)
    try:
        for index in range(BOOKIES):
            _spawn_in_namespace(cluster, net, index)
        # Admin ports stay on each namespace's own loopback, out of our reach: readiness is
        # the registration, which lands in the shared SQLite file.
        for index in range(BOOKIES):
            await cluster.bookies.wait_until_registered(index)
        yield cluster
    finally:
        await cluster.close()


async def test_netns_one_bookie_isolated_by_nft(
    netns_cluster: FaultCluster, net: NetnsNetwork, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = netns_cluster
    victim = rng.randrange(BOOKIES)
    reset = rng.random() < 0.5
    # Longer than the writer's add timeout, so a silent bookie is given up on while cut off.
    partition_seconds = rng.uniform(1.0, 3.0) + WRITER_ADD_TIMEOUT_SECONDS + (20.0 if SOAK else 0)
    child = await WriterChild.start(
        cluster.history,
        cluster.metadata_uri,
        3,
        3,
        2,
        seed,
        prefix=tuple(net.exec_prefix("client")),
    )
    try:
        await child.wait_acked(rng.randrange(100, 400))
        before = child.acked
        await asyncio.to_thread(net.isolate, _bookie_host(victim), reset=reset)
        schedule = (
            f"isolate bookie {victim} ({net.address(_bookie_host(victim))}, "
            f"{'tcp reset' if reset else 'drop'}) after {before} acks for "
            f"{partition_seconds:.1f} s, heal"
        )
        await child.wait_acked(before + 200)  # Qa = 2: the other two bookies carry the adds.
        bookie = cluster.bookies[victim]
        assert not await _reachable(net, "client", bookie.host, bookie.port), "not partitioned"
        await asyncio.sleep(partition_seconds)
        await asyncio.to_thread(net.heal, _bookie_host(victim))
        await child.wait_acked(child.acked + (2000 if SOAK else 200))
    finally:
        await child.kill()
    # The final phase's client must reach the bookies: it runs inside `client` too. This
    # loop only waits meanwhile, so the history is still recorded from one loop at a time.
    result, report = await net.run_in(
        "client",
        lambda: finish(cluster, [child.ledger_id], tmp_path, name="F18-netns", schedule=schedule),
    )
    assert_safe(result, report, seed=seed)
