"""Spark 3.5: the batch read through `DataFrame.mapInArrow` when there is no Python Data Source.

Plans on the driver with the same planner as `format("bkaio")`, makes a DataFrame of one row
per partition plan (one Spark partition each), and reads each plan in an executor Python worker
with the data source's own reader (`reading.read_partition`), which yields the same Arrow record
batches in the same schema (SCHEMA_DDL): no Python row objects on either side. `mapInArrow`
exists from Spark 3.3 on, so the helper also works on 4.x.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from bkaio.spark import catalog
from bkaio.spark.options import ReadOptions, parse_read_options
from bkaio.spark.planner import ReadRange
from bkaio.spark.reading import SCHEMA_DDL, read_partition
from bkaio.spark.runtime import get_runtime

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import DataFrame, SparkSession


def plan(options: ReadOptions) -> list[tuple[ReadRange, ...]]:
    """The partitions `format("bkaio")` would read, planned in this process."""
    runtime = get_runtime()

    async def run() -> list[tuple[ReadRange, ...]]:
        async with runtime.client(options.metadata, options.client) as bk:
            return await catalog.plan_batch(bk, options)

    return runtime.run(run())


def read_plans(
    options: ReadOptions, plans: Iterator[pyarrow.RecordBatch]
) -> Iterator[pyarrow.RecordBatch]:
    """The rows of the partition plans in `plans` (runs in executor Python workers)."""
    for batch in plans:
        for plan_bytes in batch.column(0).to_pylist():
            ranges: tuple[ReadRange, ...] = pickle.loads(plan_bytes)  # Written by the driver.
            yield from read_partition(options, ranges)


def read_dataframe(spark: SparkSession, **raw: Any) -> DataFrame:
    """`spark.read.format("bkaio").options(**raw).load()`, through `mapInArrow`."""
    options = parse_read_options({k: str(v) for k, v in raw.items()}, streaming=False)
    plans = [(pickle.dumps(p),) for p in plan(options)] or [(pickle.dumps(()),)]
    rows = spark.sparkContext.parallelize(plans, len(plans))
    source = spark.createDataFrame(rows, "plan binary")
    return source.mapInArrow(partial(read_plans, options), SCHEMA_DDL)
