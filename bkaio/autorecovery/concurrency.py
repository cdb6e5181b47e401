"""`first_failure`: run coroutines together; the first error cancels the rest and is raised
alone (not wrapped in an ExceptionGroup, as asyncio.TaskGroup would), so callers catch the
typed errors they expect."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any


async def first_failure(coroutines: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Await every coroutine; on the first exception cancel the others, wait for them, raise it."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task in done and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
