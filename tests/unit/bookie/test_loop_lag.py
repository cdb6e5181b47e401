"""The loop-lag watcher records how late its timer ran and warns about a stall."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from bkaio.bookie.loop_lag import watch_loop_lag


class RecordingLog:
    """Collects warnings the way a structlog logger is called."""

    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []
        self.warned = asyncio.Event()

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))
        self.warned.set()


def _block_the_loop() -> None:
    time.sleep(0.12)  # A long callback: nothing else on the loop runs meanwhile.


async def test_a_blocked_loop_shows_as_lag_and_a_warning() -> None:
    samples: list[float] = []
    log = RecordingLog()
    watcher = asyncio.create_task(
        watch_loop_lag(samples.append, log, interval=0.01, warn_after=0.05)
    )
    try:
        await asyncio.sleep(0.05)
        asyncio.get_running_loop().call_soon(_block_the_loop)
        await asyncio.wait_for(log.warned.wait(), timeout=10)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert max(samples) >= 0.05
    assert min(samples) >= 0.0
    event, fields = log.warnings[0]
    assert event == "event_loop_stalled" and fields["lag_ms"] >= 50
