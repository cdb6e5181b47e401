"""Child process for tests/faults/test_stream_writer_crash.py: a stream writer that gets kill -9'ed.

    python -m tests.integration.stream.writer_child METADATA_URI NAMESPACE STREAM

Opens the stream's writer (rolling every 2 KiB), then writes `child-<n>` records forever with
20 in flight, printing `ACK <ledger_id> <entry_id> <seq>` (flushed) as each is acknowledged.
"""

from __future__ import annotations

import asyncio
import sys

from bkaio.ledger_client import BookKeeper
from bkaio.stream import StreamPosition, open_namespace


async def main(uri: str, namespace: str, stream: str) -> None:
    async with BookKeeper.connect(uri, client_id="doomed-stream-writer") as bk:
        ns = await open_namespace(bk, namespace, create=True)
        writer = await ns.open_writer(stream, roll_bytes=2048)
        print("OPEN", flush=True)
        in_flight: set[asyncio.Future[StreamPosition]] = set()
        sequence = 0
        while True:
            while len(in_flight) < 20:
                in_flight.add(writer.write(b"child-%d" % sequence))
                sequence += 1
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for position in sorted(future.result() for future in done):
                print(f"ACK {position.ledger_id} {position.entry_id} {position.seq}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
