"""The shared bookie cluster as Spark tests use it, and the plain client's side of each test:
writing streams and looking at what they hold, on the connector's own runtime loop.

Spark tests are synchronous (Spark's API is), so every helper here runs its coroutine through
`Cluster.run` and returns a plain value.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from bkaio.ledger_client import BookKeeper
from bkaio.spark.runtime import get_runtime
from bkaio.spark.sink import JOB_METADATA_KEY
from bkaio.stream import Namespace, StreamWriter, open_namespace
from bkaio.stream.model import Segment
from tests.fixtures.bookies import BookieCluster

T = TypeVar("T")
# Appends in flight at once while a helper writes a whole stream (a pipelined writer).
_WRITE_WINDOW = 2000
_namespaces = itertools.count()


@dataclass
class Cluster:
    """The shared bookie cluster, as tests use it."""

    uri: str
    bookies: BookieCluster

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the connector's runtime loop in this process."""
        return get_runtime().run(coroutine)

    async def client(self) -> BookKeeper:
        # Leased for good: the tests' one client stays open until the runtime shuts down.
        return (await get_runtime().lease(self.uri, {})).bk

    async def namespace(self, name: str, *, create: bool = False) -> Namespace:
        return await open_namespace(await self.client(), name, create=create)

    def new_namespace(self) -> str:
        """A fresh namespace name (created by the first writer of a test)."""
        name = f"ns{next(_namespaces)}"
        self.run(self.namespace(name, create=True))
        return name


def open_writer(cluster: Cluster, namespace: str, stream: str, *, roll_bytes: int) -> StreamWriter:
    """A writer on `namespace/stream` that stays open until the test closes it."""

    async def open_() -> StreamWriter:
        ns = await cluster.namespace(namespace)
        return await ns.open_writer(stream, roll_bytes=roll_bytes)

    return cluster.run(open_())


async def write_all(writer: StreamWriter, payloads: Sequence[bytes]) -> None:
    """Append `payloads` in order, pipelined (a window of appends in flight at once)."""
    for first in range(0, len(payloads), _WRITE_WINDOW):
        window = payloads[first : first + _WRITE_WINDOW]
        await asyncio.gather(*(writer.write(p) for p in window))


def write_stream(
    cluster: Cluster, namespace: str, stream: str, payloads: Sequence[bytes], *, roll_bytes: int
) -> None:
    """Append `payloads` to `namespace/stream` through a StreamWriter (pipelined), then close."""
    writer = open_writer(cluster, namespace, stream, roll_bytes=roll_bytes)

    async def write() -> None:
        await write_all(writer, payloads)
        await writer.close()

    cluster.run(write())


def stream_segments(cluster: Cluster, namespace: str, stream: str) -> list[Segment]:
    async def segments() -> list[Segment]:
        ns = await cluster.namespace(namespace)
        return list((await ns.stream_metadata(stream)).segments)

    return cluster.run(segments())


def wait_readable(cluster: Cluster, namespace: str, stream: str, end_seq: int) -> None:
    """Wait until the bookies confirm every seq below `end_seq` (an open writer's last entries
    become readable once its explicit LAC goes out, within ~0.1 s)."""

    async def wait() -> None:
        ns = await cluster.namespace(namespace)
        for _ in range(600):  # 30 s: an explicit LAC goes out every 0.1 s.
            if await ns.end_seq(stream) >= end_seq:
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{namespace}/{stream}: seq {end_seq - 1} not readable after 30 s")

    cluster.run(wait())


def tagged_ledgers(cluster: Cluster) -> set[int]:
    """Ledgers a Spark sink task created (tagged with its job id)."""

    async def find() -> set[int]:
        bk = await cluster.client()
        found: set[int] = set()
        async for ledger_id in bk.list_ledgers():
            md = await bk.get_ledger_metadata(ledger_id)
            if JOB_METADATA_KEY in md.custom_metadata:
                found.add(ledger_id)
        return found

    return cluster.run(find())


def job_tags(cluster: Cluster, ledger_ids: set[int]) -> dict[int, str]:
    """The sink job that created each of `ledger_ids` (what a failing test reports)."""

    async def find() -> dict[int, str]:
        bk = await cluster.client()
        tags: dict[int, str] = {}
        for ledger_id in sorted(ledger_ids):
            md = await bk.get_ledger_metadata(ledger_id)
            tags[ledger_id] = md.custom_metadata.get(JOB_METADATA_KEY, b"?").decode()
        return tags

    return cluster.run(find())
