"""Child of test_cli: writes a closed 10-entry ledger with password "pw" and prints its id."""

from __future__ import annotations

import asyncio
import os

import bkaio


async def main() -> None:
    async with bkaio.BookKeeper.connect(os.environ["BKAIO_METADATA"]) as bk:
        handle = await bk.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw"
        )
        await asyncio.gather(*(handle.append(f"entry {i}".encode()) for i in range(10)))
        await handle.close()
        print(handle.ledger_id)


if __name__ == "__main__":
    asyncio.run(main())
