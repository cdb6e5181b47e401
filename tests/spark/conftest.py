"""Spark fixtures: one `SparkSession` (local[2]) and one real bookie cluster per test session.

Both are expensive (a JVM start, three bookie processes), so every Spark test shares them and
keeps its data apart by namespace. Tests are synchronous (Spark's API is); they reach the
cluster through the connector's own runtime loop (`Cluster.run`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import sys
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from tests.fixtures.bookies import BookieCluster

if TYPE_CHECKING:
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    from bkaio.ledger_client import BookKeeper

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
_namespaces = itertools.count()


@dataclass
class Cluster:
    """The shared bookie cluster, as tests use it."""

    uri: str
    bookies: BookieCluster

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the connector's runtime loop in this process."""
        from bkaio.spark.runtime import get_runtime

        return get_runtime().run(coroutine)

    async def client(self) -> BookKeeper:
        from bkaio.spark.runtime import get_runtime

        return await get_runtime().client(self.uri, {})

    def new_namespace(self) -> str:
        """A fresh namespace name (created by the first writer of a test)."""
        from bkaio.stream import open_namespace

        name = f"ns{next(_namespaces)}"

        async def create() -> None:
            await open_namespace(await self.client(), name, create=True)

        self.run(create())
        return name


@pytest.fixture(scope="session")
def bk_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("spark-cluster")
    uri = f"sqlite://{base / 'meta.db'}"
    loop = asyncio.new_event_loop()
    bookies = BookieCluster(uri, base, count=3, shards=1)
    try:
        loop.run_until_complete(bookies.__aenter__())
        yield Cluster(uri, bookies)
    finally:
        from bkaio.spark.runtime import shutdown

        shutdown()
        loop.run_until_complete(bookies.close())
        loop.close()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java 17+")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Workers run this venv's interpreter.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    from pyspark.sql import SparkSession

    from bkaio.spark import register

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bkaio-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
    )
    # The JVM is started by a fork of this process, which also runs gRPC threads (the etcd
    # client); once in a CI run, spark-submit exited at once, silently. A second start works.
    for attempt in range(3):
        try:
            session = builder.getOrCreate()
            break
        except PySparkRuntimeError as error:
            if attempt == 2 or "JAVA_GATEWAY_EXITED" not in str(error):
                raise
            time.sleep(1.0)
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


def write_stream(
    cluster: Cluster, namespace: str, stream: str, payloads: list[bytes], *, roll_bytes: int
) -> None:
    """Append `payloads` to `namespace/stream` through a StreamWriter (pipelined), then close."""
    from bkaio.stream import open_namespace

    async def write() -> None:
        ns = await open_namespace(await cluster.client(), namespace)
        writer = await ns.open_writer(stream, roll_bytes=roll_bytes)
        for first in range(0, len(payloads), 2000):
            await asyncio.gather(*(writer.write(p) for p in payloads[first : first + 2000]))
        await writer.close()

    cluster.run(write())


def stream_segments(cluster: Cluster, namespace: str, stream: str) -> list[Any]:
    from bkaio.stream import open_namespace

    async def segments() -> list[Any]:
        ns = await open_namespace(await cluster.client(), namespace)
        return list((await ns.stream_metadata(stream)).segments)

    return cluster.run(segments())


def wait_readable(cluster: Cluster, namespace: str, stream: str, end_seq: int) -> None:
    """Wait until the bookies confirm every seq below `end_seq` (an open writer's last entries
    become readable once its explicit LAC goes out, within ~0.1 s)."""
    from bkaio.stream import open_namespace

    async def wait() -> None:
        ns = await open_namespace(await cluster.client(), namespace)
        for _ in range(600):  # 30 s: an explicit LAC goes out every 0.1 s.
            if await ns.end_seq(stream) >= end_seq:
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{namespace}/{stream}: seq {end_seq - 1} not readable after 30 s")

    cluster.run(wait())


def tagged_ledgers(cluster: Cluster) -> set[int]:
    """Ledgers a Spark sink task created (tagged with its job id)."""
    from bkaio.spark.sink import JOB_METADATA_KEY

    async def find() -> set[int]:
        bk = await cluster.client()
        found: set[int] = set()
        async for ledger_id in bk.list_ledgers():
            md = await bk.get_ledger_metadata(ledger_id)
            if JOB_METADATA_KEY in md.custom_metadata:
                found.add(ledger_id)
        return found

    return cluster.run(find())
