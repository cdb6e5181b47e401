"""Small async helpers shared by the metadata integration tests."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    timeout_seconds: float = 10.0,
    poll_seconds: float = 0.02,
) -> bool:
    """Poll `condition` until it holds (True) or `timeout_seconds` pass (False)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(poll_seconds)
