"""Quick start: append to a ledger, seal it, read it back.

Run `bkaio standalone` in one terminal, then in another:
    BKAIO_METADATA=sqlite:///$PWD/.standalone/meta.db python examples/quickstart.py
"""

from __future__ import annotations

import asyncio
import os

import bkaio


async def main() -> None:
    uri = os.environ.get("BKAIO_METADATA", "sqlite:///.standalone/meta.db")
    async with bkaio.BookKeeper.connect(uri) as bk:
        writer = await bk.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw"
        )
        # Appends are pipelined: each is sent at once; the futures resolve in entry order.
        ids = await asyncio.gather(*(writer.append(f"event {i}".encode()) for i in range(100)))
        await writer.close()  # Seals the ledger: its last entry is now fixed for every reader.

        reader = await bk.open_ledger(writer.ledger_id, password=b"pw", recovery=False)
        first = await reader.read(0, 2)
        print(f"ledger {writer.ledger_id}: wrote entries {ids[0]}..{ids[-1]}")
        print("first entries:", [entry.payload.decode() for entry in first])
        await bk.delete_ledger(writer.ledger_id)


if __name__ == "__main__":
    asyncio.run(main())
