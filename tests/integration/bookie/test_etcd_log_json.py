"""A bookie on etcd metadata writes only JSON lines to its stderr (its log), from its start to its
stop. uvloop runs Python's at-fork hooks around each shard worker's fork+exec, so gRPC's fork
handlers (the etcd client's) ran at every spawn and, with the client's threads busy, printed
`fork_posix.cc:71] Other threads are currently calling into gRPC, skipping fork() handlers`
there, one non-JSON line per shard (bkaio/bookie/parent_workers.py disable_grpc_fork_handlers)."""

from __future__ import annotations

import json

from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer


def _not_json(line: str) -> bool:
    try:
        return not isinstance(json.loads(line), dict)
    except ValueError:
        return True


async def test_every_line_a_bookie_on_etcd_logs_is_json(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    cluster = await bookie_cluster_factory(metadata_uri=etcd_server.uri, shards=2)
    assert await cluster.stop(0) == 0
    lines = cluster[0].log_path.read_text(encoding="utf-8").splitlines()
    assert any('"bookie_stopped"' in line for line in lines), lines[-5:]
    assert [line for line in lines if _not_json(line)] == []
