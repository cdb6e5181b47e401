"""A replicated key-value store: every replica applies one bkaio stream, in order.

    python examples/replicated_state_machine.py --metadata etcd://127.0.0.1:2379/bkaio

The leader turns each update into a record on the stream `kv/<name>` and acknowledges it to
its caller once the stream acknowledged it (an ack quorum of bookies has it on disk). Every
replica, the leader included, tails the stream and applies records in sequence order, so all
replicas pass through the same states. To fail over, a follower *promotes* itself: opening
the stream's writer fences the old leader's ledger (its next write fails with
LedgerFencedError, so a paused or partitioned old leader cannot fork the history), seals the
stream's end, and the new leader catches up to that end before it serves writes. No
acknowledged update is lost: it was in the sealed segment the new leader read.

The demo runs three replicas in one process against a running cluster (`bkaio standalone`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from typing import Any

from bkaio.ledger_client import BookKeeper
from bkaio.stream import Namespace, StreamPosition, StreamReader, StreamWriter, open_namespace

NAMESPACE = "kv"


def encode_update(key: str, value: str | None) -> bytes:
    """One update as a record: set `key` to `value`, or delete it when `value` is None."""
    return json.dumps({"key": key, "value": value}, sort_keys=True).encode()


def apply_update(state: dict[str, str], payload: bytes) -> None:
    update = json.loads(payload)
    if update["value"] is None:
        state.pop(update["key"], None)
    else:
        state[update["key"]] = update["value"]


class Replica:
    """One copy of the store: follows the stream; becomes the leader with `promote`."""

    def __init__(self, name: str, namespace: Namespace, stream: str) -> None:
        self.name = name
        self.state: dict[str, str] = {}
        self.applied: StreamPosition | None = None
        self._namespace = namespace
        self._stream = stream
        self._reader: StreamReader | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._applied_seq = -1
        self._progress = asyncio.Condition()
        self.writer: StreamWriter | None = None

    @classmethod
    async def start(cls, name: str, bk: BookKeeper, stream: str) -> Replica:
        namespace = await open_namespace(bk, NAMESPACE, create=True, ensemble_size=3)
        await namespace.create_stream(stream)
        replica = cls(name, namespace, stream)
        replica._reader = await namespace.open_reader(stream, start="earliest")
        replica._follow_task = asyncio.get_running_loop().create_task(replica._follow())
        return replica

    async def _follow(self) -> None:
        assert self._reader is not None
        async for record in self._reader:
            apply_update(self.state, record.payload)
            self.applied = record.position
            async with self._progress:
                self._applied_seq = record.position.seq
                self._progress.notify_all()

    async def wait_applied(self, seq: int) -> None:
        """Until every record up to `seq` is applied here."""
        async with self._progress:
            await self._progress.wait_for(lambda: self._applied_seq >= seq)

    @property
    def is_leader(self) -> bool:
        return self.writer is not None

    async def promote(self) -> None:
        """Become the leader: fence the old one, then catch up to the stream's sealed end."""
        self.writer = await self._namespace.open_writer(self._stream, roll_bytes=64 << 10)
        end = self.writer.segment.first_seq  # Everything before is sealed and agreed.
        await self.wait_applied(end - 1)

    async def set(self, key: str, value: str | None) -> StreamPosition:
        """Replicate an update; returns once it is acknowledged (durable on a quorum)."""
        if self.writer is None:
            raise RuntimeError(f"replica {self.name} is not the leader")
        return await self.writer.write(encode_update(key, value))

    async def stop(self) -> None:
        if self._follow_task is not None:
            self._follow_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follow_task
        if self._reader is not None:
            await self._reader.close()


async def demo(metadata_uri: str) -> dict[str, Any]:
    clients = [await BookKeeper.connect(metadata_uri, client_id=f"replica-{i}") for i in range(3)]
    try:
        replicas = [await Replica.start(f"r{i}", bk, "demo") for i, bk in enumerate(clients)]
        old_leader, follower = replicas[0], replicas[1]
        await old_leader.promote()
        acknowledged = [await old_leader.set(f"key-{i}", f"v{i}") for i in range(100)]
        await follower.promote()  # The old leader "hangs"; a follower takes over.
        try:
            await old_leader.set("stale", "write")
            fenced = False
        except Exception as error:  # LedgerFencedError: the old leader cannot write again.
            fenced = type(error).__name__ == "LedgerFencedError"
        await follower.set("after-failover", "yes")
        last = await follower.set("key-0", "v0-updated")
        for replica in replicas:
            await replica.wait_applied(last.seq)
        states = {replica.name: dict(replica.state) for replica in replicas}
        for replica in replicas:
            await replica.stop()
        if follower.writer is not None:
            await follower.writer.close()
        return {
            "acknowledged": len(acknowledged),
            "old_leader_fenced": fenced,
            "replicas_agree": len({json.dumps(s, sort_keys=True) for s in states.values()}) == 1,
            "keys": len(states["r1"]),
        }
    finally:
        for bk in clients:
            await bk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metadata", required=True, help="metadata URI of a running cluster")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(demo(args.metadata)), indent=2))


if __name__ == "__main__":
    main()
