"""A bookie whose task failed for good says so at once: state, `/health` 503, systemd STATUS=,
and a stop request (the process then exits 3; tests/faults/test_storage_faults.py runs it)."""

from __future__ import annotations

import socket
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from bkaio.bookie.admin import build_admin_app
from bkaio.bookie.parent import BookieParent
from bkaio.bookie.sdnotify import SystemdNotifier
from bkaio.config import load_bookie_config


def _parent(tmp_path: Path) -> BookieParent:
    path = tmp_path / "bookie.toml"
    path.write_text(
        '[bookie]\nport = 3999\nhost = "127.0.0.1"\nshards = 1\n'
        f'[metadata]\nuri = "sqlite://{tmp_path / "meta.db"}"\n'
        f'[storage]\njournal_dirs = ["{tmp_path / "j"}"]\nledger_dirs = ["{tmp_path / "l"}"]\n'
    )
    return BookieParent(load_bookie_config(path, env={}))


async def test_a_fatal_failure_makes_the_bookie_unhealthy_everywhere(tmp_path: Path) -> None:
    parent = _parent(tmp_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(tmp_path / "notify"))
        parent.notifier = SystemdNotifier(env={"NOTIFY_SOCKET": str(tmp_path / "notify")})
        async with TestClient(TestServer(build_admin_app(parent))) as http:
            healthy = await http.get("/health")
            assert healthy.status == 200 and (await healthy.json())["healthy"] is True

            parent.mark_unhealthy("shard 0: journal: EIO")

            status = systemd.recv(1024).decode()
            assert status.startswith("STATUS=unhealthy: shard 0: journal: EIO")
            answer = await http.get("/health")
            assert answer.status == 503
            assert await answer.json() == {"healthy": False, "reason": "shard 0: journal: EIO"}
            state = await (await http.get("/status")).json()
            assert state["healthy"] is False and "journal" in state["unhealthy_reason"]
    assert parent._stop.is_set()  # The bookie stops (and exits EXIT_TASK_FAILED).
    await parent.supervisor.stop()
