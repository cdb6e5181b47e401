"""PySpark connector: `format("bkaio")` for batch and streaming reads and writes (docs/spark.md).

    from bkaio.spark import register; register(spark)
    df = spark.read.format("bkaio").option("metadata", uri).option("stream", "ns/orders").load()

Needs the `spark` extra (pyspark[sql] >= 4.0). `read_dataframe(spark, **options)` plans the
same partitions and reads them through an RDD, for Spark 3.5 (no Python Data Source API).
The pure parts (options.py, planner.py) import no pyspark; this module imports it lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bkaio.spark.errors import DataLossError, SparkOptionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["DataLossError", "SparkOptionError", "read_dataframe", "register"]


def register(spark: SparkSession) -> None:
    """Register the `bkaio` data source with this session."""
    from bkaio.spark.source import BkaioDataSource

    spark.dataSource.register(BkaioDataSource)


def read_dataframe(spark: SparkSession, **options: Any) -> DataFrame:
    """A batch read with the data source's options and schema, without the Data Source API."""
    from bkaio.spark.compat import read_dataframe as read

    return read(spark, **options)
