"""Spark 3.5: the batch read as an RDD (`mapPartitions`) when there is no Python Data Source API.

Plans on the driver with the same planner as `format("bkaio")` and reads each `ReadRange` in
an executor Python worker, yielding the same rows in the same schema (SCHEMA_DDL).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from bkaio.spark import catalog
from bkaio.spark.options import ReadOptions, parse_read_options
from bkaio.spark.planner import ReadRange
from bkaio.spark.reading import SCHEMA_DDL, read_entries, to_rows
from bkaio.spark.runtime import get_runtime

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def plan(options: ReadOptions) -> list[ReadRange]:
    """The partitions `format("bkaio")` would read, planned in this process."""
    runtime = get_runtime()

    async def run() -> list[ReadRange]:
        bk = await runtime.client(options.metadata, options.client)
        return await catalog.plan_batch(bk, options)

    return runtime.run(run())


def read_rows(options: ReadOptions, ranges: Iterable[ReadRange]) -> Iterator[tuple[Any, ...]]:
    """Rows of the given ranges (runs in executor Python workers)."""
    runtime = get_runtime()
    for item in ranges:

        async def chunks(item: ReadRange = item) -> Any:
            bk = await runtime.client(options.metadata, options.client)
            async for entries in read_entries(
                bk, item, options.batch_entries, options.fail_on_data_loss
            ):
                yield to_rows(item, entries)

        for rows in runtime.iterate(chunks()):
            yield from rows


def read_dataframe(spark: SparkSession, **raw: Any) -> DataFrame:
    """`spark.read.format("bkaio").options(**raw).load()`, through `mapPartitions`."""
    options = parse_read_options({k: str(v) for k, v in raw.items()}, streaming=False)
    ranges = plan(options)
    rdd = spark.sparkContext.parallelize(ranges, max(1, len(ranges)))
    return spark.createDataFrame(rdd.mapPartitions(partial(read_rows, options)), SCHEMA_DDL)
