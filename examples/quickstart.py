"""Quick start: append to a ledger, seal it, read it back, delete it.

Start a cluster in one terminal (`bkaio standalone`), then in another:
    BKAIO_METADATA=sqlite:///$PWD/.standalone/meta.db python examples/quickstart.py
"""

import asyncio
import os

import bkaio


async def main() -> None:
    async with bkaio.BookKeeper.connect(os.environ["BKAIO_METADATA"]) as bk:
        writer = await bk.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw"
        )
        # Appends are pipelined: each is sent at once; the futures resolve in entry order.
        ids = await asyncio.gather(*(writer.append(f"event {i}".encode()) for i in range(100)))
        await writer.close()  # Seals the ledger: its last entry is now fixed for every reader.

        reader = await bk.open_ledger(writer.ledger_id, password=b"pw", recovery=False)
        first = await reader.read(0, 2)  # An inclusive range: entries 0, 1 and 2.
        print(f"ledger {writer.ledger_id}: wrote entries {ids[0]}..{ids[-1]}")
        print("first entries:", [entry.payload.decode() for entry in first])
        await bk.delete_ledger(writer.ledger_id)


if __name__ == "__main__":
    asyncio.run(main())
