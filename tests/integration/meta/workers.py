"""Child processes for the multi-process metadata tests and the benchmark.

python -m tests.integration.meta.workers register URI BOOKIE_ID TTL_SECONDS
    registers a bookie, prints "registered", then sleeps until killed
python -m tests.integration.meta.workers allocate URI COUNT BLOCK_SIZE
    creates COUNT ledgers and prints their ids as one JSON list
python -m tests.integration.meta.workers open-fresh DIRECTORY COUNT START_AT
    opens and closes the SQLite stores DIRECTORY/0.db .. COUNT-1.db, the i-th at wall-clock
    START_AT + i * OPEN_SPACING_SECONDS, so that sibling processes open each new file together
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from bkaio.logs import configure_logging
from bkaio.meta import BookieInfo, LedgerMetadata, initialise_cluster_at, open_metadata


def sample_metadata() -> LedgerMetadata:
    return LedgerMetadata(
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles=((0, ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")),),
        password_hash=b"\x01" * 20,
    )


async def register(uri: str, bookie_id: str, ttl_seconds: float) -> None:
    host, port = bookie_id.rsplit(":", 1)
    async with await open_metadata(uri) as meta:
        info = BookieInfo(bookie_id=bookie_id, host=host, port=int(port))
        await meta.bookies.register(info, ttl_seconds=ttl_seconds)
        print("registered", flush=True)
        await asyncio.Event().wait()


async def allocate(uri: str, count: int, block_size: int) -> None:
    async with await open_metadata(uri, id_block_size=block_size) as meta:
        template = sample_metadata()
        ids = [(await meta.ledgers.create(template)).ledger_id for _ in range(count)]
    print(json.dumps(ids), flush=True)


OPEN_SPACING_SECONDS = 0.15


async def open_fresh(directory: str, count: int, start_at: float) -> None:
    for index in range(count):
        await asyncio.sleep(max(0.0, start_at + index * OPEN_SPACING_SECONDS - time.time()))
        # What every bookie of a new standalone cluster does at once: initialise, then open.
        uri = f"sqlite://{Path(directory) / f'{index}.db'}"
        await initialise_cluster_at(uri, exist_ok=True)
        async with await open_metadata(uri):
            pass
    print("opened", count, flush=True)


def main(argv: list[str]) -> None:
    configure_logging(level="warning")  # Logs to stderr; stdout carries the results.
    command, uri, *rest = argv
    if command == "register":
        asyncio.run(register(uri, rest[0], float(rest[1])))
    elif command == "allocate":
        asyncio.run(allocate(uri, int(rest[0]), int(rest[1])))
    elif command == "open-fresh":
        asyncio.run(open_fresh(uri, int(rest[0]), float(rest[1])))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
