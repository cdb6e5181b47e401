"""examples/spark_pipeline.py end to end against the shared cluster and session."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.spark.cluster import Cluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("spark_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pipeline_batch_and_running_totals_agree(
    spark: SparkSession, bk_cluster: Cluster, tmp_path: Path
) -> None:
    example = load_example()
    namespace = bk_cluster.new_namespace()
    result = example.run_pipeline(spark, bk_cluster.uri, namespace, str(tmp_path / "cp"), 2000)
    assert set(result["batch"]) <= set(example.KINDS)
    assert sum(result["running"].values()) == result["produced"]  # Every event counted once.
    assert sum(result["batch"].values()) < result["produced"]  # The batch saw the first half.
