"""The source's schema is fixed (SCHEMA_DDL): a schema the user sets with `.schema(...)` that
differs is refused when the query is planned, naming both, rather than left to fail each task
on the first record batch (or, with nothing to read, to return no rows under that schema)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from bkaio.spark.errors import SparkOptionError
from bkaio.spark.source import BkaioDataSource

OPTIONS = {"metadata": "sqlite:///unused", "stream": "tenant/s"}
FIXED = StructType(
    [
        StructField("stream", StringType()),
        StructField("ledger_id", LongType()),
        StructField("entry_id", LongType()),
        StructField("seq", LongType()),
        StructField("payload", BinaryType()),
    ]
)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_user_schema_other_than_the_sources_is_refused(streaming: bool) -> None:
    source = BkaioDataSource(OPTIONS)
    schema = StructType([StructField("payload", BinaryType())])
    reader = source.streamReader if streaming else source.reader
    with pytest.raises(
        SparkOptionError, match=r"fixed schema, struct<stream:string.*; got struct<payload:binary>"
    ):
        reader(schema)


@pytest.mark.parametrize("streaming", [False, True])
def test_the_sources_own_schema_is_taken(streaming: bool) -> None:
    source = BkaioDataSource(OPTIONS)
    reader = source.streamReader if streaming else source.reader
    assert reader(FIXED) is not None
