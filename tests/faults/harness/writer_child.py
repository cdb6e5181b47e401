"""A writer in its own process (F1, F7): creates a ledger and appends until killed.

    python -m tests.faults.harness.writer_child URI E QW QA SEED
prints, flushed, one line per event: `LEDGER <id>`, `INVOKE <seq> <value>` before each append,
`OK <seq> <entry>`, `FAIL <seq> <ErrorName>`; the parent turns them into history ops.
"""

from __future__ import annotations

import asyncio
import random
import sys

from bkaio.ledger_client import BookKeeper
from tests.faults.harness.workload import PASSWORD


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(uri: str, ensemble: int, write_quorum: int, ack_quorum: int, seed: int) -> None:
    rng = random.Random(seed)
    async with BookKeeper.connect(uri, add_timeout=3.0, client_id="writer-child") as bk:
        handle = await bk.create_ledger(
            ensemble_size=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            password=PASSWORD,
        )
        _say(f"LEDGER {handle.ledger_id}")
        inflight: set[asyncio.Future[int]] = set()
        seq = 0
        while True:
            while len(inflight) >= 64:
                await asyncio.wait(set(inflight), return_when=asyncio.FIRST_COMPLETED)
            value = f"child-{handle.ledger_id}-{seq}-{rng.getrandbits(32):08x}"
            _say(f"INVOKE {seq} {value}")
            try:
                future = handle.append(value.encode())
            except Exception as error:
                _say(f"FAIL {seq} {type(error).__name__}")
                await asyncio.sleep(0.05)
                seq += 1
                continue

            def done(f: asyncio.Future[int], seq: int = seq) -> None:
                inflight.discard(f)
                error = f.exception()
                _say(f"FAIL {seq} {type(error).__name__}" if error else f"OK {seq} {f.result()}")

            future.add_done_callback(done)
            inflight.add(future)
            seq += 1
            await asyncio.sleep(0.001)


if __name__ == "__main__":
    uri, e, qw, qa, seed = sys.argv[1:6]
    asyncio.run(main(uri, int(e), int(qw), int(qa), int(seed)))
