"""systemd readiness and watchdog notifications (sd_notify(3)) without a dependency.

A datagram to the AF_UNIX socket named by NOTIFY_SOCKET; a leading '@' means the abstract
namespace. Without NOTIFY_SOCKET (not under systemd) every call does nothing. The watchdog is
pinged from an asyncio task, so a stuck event loop stops the pings and systemd restarts us.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping

import structlog

log = structlog.get_logger(__name__)


class SystemdNotifier:
    """Sends `READY=1`, `STATUS=...`, `WATCHDOG=1`, `STOPPING=1` to systemd when it listens."""

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]
        self._address = address
        self._watchdog_seconds = _watchdog_seconds(env)

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    @property
    def watchdog_seconds(self) -> float | None:
        """The watchdog timeout systemd asked for (WatchdogSec), or None when off."""
        return self._watchdog_seconds

    def notify(self, *lines: str) -> bool:
        """Send `lines` as one datagram; False when not under systemd or when the send failed."""
        if not self._address:
            return False
        message = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(message, self._address)
        except OSError as error:
            log.warning("sd_notify_failed", error=str(error))
            return False
        return True

    async def run_watchdog(self) -> None:
        """Ping `WATCHDOG=1` at half the watchdog timeout until cancelled (no-op when off)."""
        if self._watchdog_seconds is None or not self._address:
            return
        interval = self._watchdog_seconds / 2
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(interval)


def _watchdog_seconds(env: Mapping[str, str]) -> float | None:
    usec = env.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    pid = env.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None  # Meant for another process of the unit.
    return int(usec) / 1_000_000
