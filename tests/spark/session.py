"""A local SparkSession with the bkaio data source registered, as every Spark test starts one:
the shared session fixture in this process, and a streaming query a test runs (and kills) in a
child process, which imports this module too (its PYTHONPATH holds the checkout's root).

Imports no pytest: the child process has nothing to do with it.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]
_START_ATTEMPTS = 3


def worker_environment() -> dict[str, str]:
    """Environment for Spark's Python workers: this venv's interpreter, importing this checkout
    first (the bookie and connector code under test, not an installed copy)."""
    others = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    return {"PYSPARK_PYTHON": sys.executable, "PYTHONPATH": os.pathsep.join([str(ROOT), *others])}


def local_session(
    master: str, *, shuffle_partitions: int, config: Mapping[str, str] | None = None
) -> SparkSession:
    """A session on `master` bound to loopback, with no UI, logging errors only, `bkaio` registered;
    `config` adds settings."""
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    from bkaio.spark import register

    builder = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    )
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    # The JVM is started by a fork of this process, which also runs gRPC threads (the etcd
    # client); once in a CI run, spark-submit exited at once, silently. A second start works.
    for attempt in range(_START_ATTEMPTS):
        try:
            session = builder.getOrCreate()
            break
        except PySparkRuntimeError as error:
            if attempt == _START_ATTEMPTS - 1 or "JAVA_GATEWAY_EXITED" not in str(error):
                raise
            # PySpark leaves the failed gateway's stdin pipe open; finalised later, its
            # ResourceWarning surfaced as an unraisable exception in whatever test ran then
            # (CI on c589dd3). Finalise it here, where its warning is expected.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                error.__traceback__ = None  # Its frames may hold the pipe's process object.
                del error
                gc.collect()
            time.sleep(1.0)
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
