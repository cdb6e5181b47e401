"""How late the shard worker's event loop runs a timer: the stall every request waits behind.

A loop that is busy (a long callback, the GIL held by another thread, the process not scheduled)
answers nothing meanwhile; from outside it looks like a slow disk or network. Sampling the
lateness of a periodic timer shows it directly: `bkaio_bookie_event_loop_lag_seconds`, and a
warning when one sample is very late, so a latency spike can be matched to its cause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

LAG_SAMPLE_SECONDS = 0.1  # Ten wake-ups a second: nothing next to the add path.
STALL_WARNING_SECONDS = 0.05


async def watch_loop_lag(
    observe: Callable[[float], None],
    log: Any,
    *,
    interval: float = LAG_SAMPLE_SECONDS,
    warn_after: float = STALL_WARNING_SECONDS,
) -> None:
    """Forever: sleep `interval`, record how much later than asked the loop woke us."""
    loop = asyncio.get_running_loop()
    while True:
        asked_at = loop.time()
        await asyncio.sleep(interval)
        lag = max(0.0, loop.time() - asked_at - interval)
        observe(lag)
        if lag >= warn_after:
            log.warning("event_loop_stalled", lag_ms=round(lag * 1000, 1))
