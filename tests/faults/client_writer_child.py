"""Child process for tests/faults/test_client_faults.py: a writer that gets kill -9'ed.

    python -m tests.faults.client_writer_child METADATA_URI

Creates a ledger (E3/Qw2/Qa2, password b"pw"), prints `LEDGER <id>`, then appends
`child-<n>` payloads forever with 20 adds in flight, printing `ACK <entry id>` (flushed) as
each one is acknowledged. The parent kills it mid-stream and recovers the ledger.
"""

from __future__ import annotations

import asyncio
import sys

from bkaio.ledger_client import BookKeeper


async def main(uri: str) -> None:
    async with BookKeeper.connect(uri, client_id="doomed-writer") as bk:
        lh = await bk.create_ledger(3, 2, 2, password=b"pw")
        print(f"LEDGER {lh.ledger_id}", flush=True)
        in_flight: set[asyncio.Future[int]] = set()
        sequence = 0
        while True:
            while len(in_flight) < 20:
                in_flight.add(lh.append(b"child-%d" % sequence))
                sequence += 1
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: f.result()):
                print(f"ACK {future.result()}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
