"""examples/replicated_state_machine.py against real bookies and etcd: fail-over loses nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bkaio.errors import LedgerFencedError
from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "replicated_state_machine.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("replicated_state_machine", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_promoted_follower_has_every_acknowledged_update_and_fences_the_old_leader(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    example = load_example()
    await bookie_cluster_factory(count=3, metadata_uri=etcd_server.uri)
    async with (
        BookKeeper.connect(etcd_server.uri, client_id="a") as client_a,
        BookKeeper.connect(etcd_server.uri, client_id="b") as client_b,
    ):
        leader = await example.Replica.start("a", client_a, "accounts")
        follower = await example.Replica.start("b", client_b, "accounts")
        try:
            await leader.promote()
            expected: dict[str, str] = {}
            for i in range(200):
                await leader.set(f"k{i % 50}", f"v{i}")  # Acknowledged from here on.
                expected[f"k{i % 50}"] = f"v{i}"
            await follower.promote()  # Fences the leader; catches up to the sealed end.
            assert follower.state == expected
            with pytest.raises(LedgerFencedError):
                await leader.set("k0", "lost?")
            last = await follower.set("k0", "after")
            # Each replica applies the stream by tailing it, the new leader its own write too.
            await leader.wait_applied(last.seq)
            await follower.wait_applied(last.seq)
            assert leader.state == follower.state == {**expected, "k0": "after"}
        finally:  # Followers stopped even when an assertion failed: no task outlives the test.
            await leader.stop()
            await follower.stop()
            if follower.writer is not None:
                await follower.writer.close()


async def test_demo_reports_a_clean_fail_over(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    example = load_example()
    await bookie_cluster_factory(count=3, metadata_uri=etcd_server.uri)
    outcome = await example.demo(etcd_server.uri)
    assert outcome == {
        "acknowledged": 100,
        "old_leader_fenced": True,
        "replicas_agree": True,
        "keys": 101,
    }
