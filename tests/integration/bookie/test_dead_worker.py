"""A bookie whose shard worker dies says it is unhealthy while it stops: `/health` 503 with the
reason, systemd STATUS=, `bookie_unhealthy` at ERROR (the registration goes, then exit 1).

Before, the parent logged `shard_worker_died` and stopped, reporting itself healthy all the
while its other shards drained (up to `server.drain_timeout_seconds`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

from tests.fixtures.bookies import BookieClusterFactory

EXIT_BOUND_SECONDS = 30.0  # Liveness: far above the few seconds it takes.


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()]


async def test_a_dead_shard_worker_makes_the_bookie_unhealthy(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(shards=2)
    bookie = cluster[0]
    workers = _children(bookie.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    assert bookie.process is not None
    try:
        code = await asyncio.to_thread(bookie.process.wait, EXIT_BOUND_SECONDS)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running:\n{bookie.log_tail()}") from None
    assert code == 1, bookie.log_tail()  # EXIT_WORKER_DIED.
    events = []
    for line in bookie.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    unhealthy = [e for e in events if e.get("event") == "bookie_unhealthy"]
    assert unhealthy, bookie.log_tail()
    assert unhealthy[0]["level"] == "error"
    assert "shard 1" in unhealthy[0]["reason"] and "died" in unhealthy[0]["reason"]
