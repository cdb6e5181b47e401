"""sd_notify without systemd: a datagram socket stands in for NOTIFY_SOCKET."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from bkaio.bookie.sdnotify import SystemdNotifier


def test_without_notify_socket_nothing_happens() -> None:
    notifier = SystemdNotifier(env={})
    assert not notifier.enabled and notifier.notify("READY=1") is False


def test_ready_goes_to_a_path_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        notifier = SystemdNotifier(env={"NOTIFY_SOCKET": str(path)})
        assert notifier.notify("READY=1", "STATUS=serving")
        assert server.recv(1024) == b"READY=1\nSTATUS=serving"


def test_abstract_socket_and_watchdog_pings() -> None:
    name = f"bkaio-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        server.setblocking(False)
        env = {
            "NOTIFY_SOCKET": "@" + name,
            "WATCHDOG_USEC": "100000",
            "WATCHDOG_PID": str(os.getpid()),
        }
        notifier = SystemdNotifier(env=env)
        assert notifier.watchdog_seconds == 0.1

        async def ping_a_while() -> None:
            task = asyncio.create_task(notifier.run_watchdog())
            await asyncio.sleep(0.12)
            task.cancel()

        asyncio.run(ping_a_while())
        pings = []
        while True:
            try:
                pings.append(server.recv(64))
            except BlockingIOError:
                break
        assert len(pings) >= 2 and set(pings) == {b"WATCHDOG=1"}


def test_watchdog_for_another_pid_is_ignored() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"}
    assert SystemdNotifier(env=env).watchdog_seconds is None
