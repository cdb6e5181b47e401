"""The Spark unit tests' shared fixtures: the stream tests' clients (fake bookies, a real SQLite
metadata file) for the sink's tests, and a connector runtime (its own loop thread) closed after
each test."""

from collections.abc import Iterator

import pytest

from bkaio.spark.runtime import Runtime
from tests.unit.stream.conftest import fake_bookies, make_client

__all__ = ["fake_bookies", "make_client", "runtime"]


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    runtime = Runtime()
    try:
        yield runtime
    finally:
        runtime.close()
