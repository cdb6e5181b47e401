"""Spark fixtures: one `SparkSession` (local[2]) and one real bookie cluster per test session.

Both are expensive (a JVM start, three bookie processes), so every Spark test shares them and
keeps its data apart by namespace. Tests are synchronous (Spark's API is); they reach the
cluster through the connector's own runtime loop (`Cluster.run`, tests/spark/cluster.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.fixtures.bookies import BookieCluster, running_on_own_loop
from tests.spark.cluster import Cluster
from tests.spark.session import local_session, worker_environment

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def bk_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("spark-cluster")
    uri = f"sqlite://{base / 'meta.db'}"
    bookies = BookieCluster(uri, base, count=3, shards=1)
    with running_on_own_loop(bookies):
        try:
            yield Cluster(uri, bookies)
        finally:
            from bkaio.spark.runtime import shutdown

            shutdown()  # Before the bookies close.


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java 17+")
    os.environ.update(worker_environment())
    session = local_session(
        "local[2]",
        shuffle_partitions=2,
        config={
            "spark.app.name": "bkaio-spark-tests",
            "spark.default.parallelism": "2",
            "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
        },
    )
    try:
        yield session
    finally:
        session.stop()
