"""Errors only the Spark connector raises, until the lead moves them into `bkaio.errors`.

Both subclass existing `bkaio.errors` classes, so callers catching those keep working.
"""

from __future__ import annotations

from bkaio.errors import BKError, ConfigError

__all__ = ["DataLossError", "SparkJobAbortedError", "SparkOptionError"]


class SparkOptionError(ConfigError):
    """A `spark.read/readStream/write.format("bkaio")` option is missing, unknown or malformed."""


class DataLossError(BKError):
    """Data a query asked for is gone (truncated stream, deleted ledger) and failOnDataLoss is
    true; set failOnDataLoss=false to skip what is missing instead."""


class SparkJobAbortedError(BKError):
    """A sink task's job was aborted before the task wrote anything: its ledger is deleted."""
