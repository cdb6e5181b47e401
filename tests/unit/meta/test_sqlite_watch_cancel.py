"""A cancelled SQLite watch always ends, whenever the cancellation lands."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from bkaio.meta import open_store


async def test_cancelling_a_watch_never_hangs(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'meta.db'}")
    rng = random.Random(7)
    try:

        async def consume() -> None:
            async for _event in store.watch_prefix("/watched/"):
                pass

        for round_number in range(40):
            watch = asyncio.create_task(consume())
            await store.put(f"/watched/{round_number}", b"v")
            # Land the cancellation at assorted moments: around writes and around poll expiry.
            await asyncio.sleep(rng.choice([0.0, 0.001, 0.02, 0.049, 0.05, 0.051]))
            if rng.random() < 0.5:
                await store.put(f"/watched/{round_number}b", b"v")
            watch.cancel()
            done, _ = await asyncio.wait((watch,), timeout=5.0)
            assert done, f"round {round_number}: the watch ignored its cancellation"
            assert watch.cancelled()
    finally:
        await store.close()
